//! The one error type of this crate.

use std::fmt;
use std::io;

/// Why a queue operation failed. Each message says what to fix.
#[derive(Debug)]
#[non_exhaustive]
pub enum QueueError {
    /// The wait ran out before a message (or room for one) arrived.
    Timeout,
    /// The ring was closed by either side (and, for `recv`, everything sent before was drained).
    Closed,
    /// A system call failed.
    Os {
        /// What was being done, and to which region: `"memfd_create(\"rloader DataLoader workers\")"`.
        op: String,
        source: io::Error,
    },
    /// An anonymous region (memfd) could not get memory: the machine or its cgroup is full.
    NoMemory { what: String, requested: usize },
    /// A region, or the part of it a ring or doorbell should live in, is too small or misplaced.
    TooSmall {
        what: &'static str,
        need: usize,
        got: usize,
    },
    /// `Ring::init`/`Ring::attach` was given an offset that breaks the alignment rule.
    Misaligned { offset: usize, align: usize },
    /// `Ring::attach` found no ring of this build at that place.
    BadHeader(String),
    /// The peer wrote something that breaks the protocol (a garbage length or position).
    Corrupt(String),
    /// A message longer than the frame format can describe.
    TooLarge { len: u64, max: u64 },
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueError::Timeout => f.write_str("timed out waiting on the queue"),
            QueueError::Closed => f.write_str("the queue was closed by the other side"),
            QueueError::Os { op, source } => write!(f, "{op} failed: {source}"),
            QueueError::NoMemory { what, requested } => write!(
                f,
                "could not reserve {requested} bytes ({}) of shared memory for {what}: the \
                 machine (or its container's memory limit) has no room left; lower num_workers, \
                 prefetch_factor or batch_size",
                human(*requested as u64),
            ),
            QueueError::TooSmall { what, need, got } => write!(
                f,
                "{what} needs {need} bytes but has {got}: make the region larger or the ring smaller"
            ),
            QueueError::Misaligned { offset, align } => write!(
                f,
                "offset {offset} in the shared-memory region is not a multiple of {align}: \
                 place rings and doorbells at multiples of {align}"
            ),
            QueueError::BadHeader(why) => write!(f, "not a usable rloader ring: {why}"),
            QueueError::Corrupt(why) => write!(
                f,
                "the shared-memory ring is corrupt ({why}): the peer process wrote outside the \
                 protocol (a crash, or another program using the same name); the channel is unusable"
            ),
            QueueError::TooLarge { len, max } => write!(
                f,
                "a message of {len} bytes is larger than the most a frame can carry ({max} bytes)"
            ),
        }
    }
}

impl std::error::Error for QueueError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            QueueError::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `1536` -> `"1.5 KiB"`: sizes people read in an error message.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_memory_message_says_what_to_fix() {
        let e = QueueError::NoMemory {
            what: "rloader DataLoader workers".into(),
            requested: 64 << 20,
        };
        assert_eq!(
            e.to_string(),
            "could not reserve 67108864 bytes (64.0 MiB) of shared memory for rloader \
             DataLoader workers: the machine (or its container's memory limit) has no room \
             left; lower num_workers, prefetch_factor or batch_size"
        );
    }

    #[test]
    fn os_error_keeps_its_source() {
        let e = QueueError::Os {
            op: "memfd_create(\"x\")".into(),
            source: io::Error::from_raw_os_error(libc::EACCES),
        };
        assert!(e.to_string().starts_with("memfd_create(\"x\") failed: "));
        let source = std::error::Error::source(&e).unwrap();
        assert!(source.to_string().contains("denied"));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(5 << 30), "5.0 GiB");
    }
}
