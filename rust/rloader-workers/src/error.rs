//! The one error type of this crate.

use std::fmt;
use std::time::Duration;

use rloader_queue::QueueError;

/// Why the pool failed. The texts are what users read (the binding crate raises them as
/// they are, as the exception type `rloader-py/src/errors.rs` picks for each variant).
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// A pool needs at least one worker.
    NoWorkers,
    /// A pool's region would be larger than a process can address.
    TooManySlots {
        num_workers: usize,
        prefetch_factor: usize,
    },
    /// The hand-off failed (a ring's or the region's error).
    Queue(QueueError),
    /// A message too short to hold the 16-byte header.
    ShortHeader,
    /// A message of a kind its receiver does not take; `from` is the sending worker when the
    /// main process received it, None in a worker (the main process sent it).
    UnexpectedKind { kind: u32, from: Option<usize> },
    /// A DATA message whose table promises more bytes than it holds.
    TruncatedBatch,
    /// A DATA message naming bytes of a slot beyond the slot's span, or without a slot.
    OutsideSlot,
    /// A DATA message naming a slot its worker does not have.
    NoSuchSlot { worker: usize, slot: usize },
    /// A slot (or its state word) that does not lie inside the region.
    SlotOutsideRegion,
    /// A worker took no control message for this long.
    Stuck { worker: usize, waited: Duration },
    /// The DataLoader's `timeout` passed with no batch.
    TimedOut(Duration),
    /// The pool was stopped (after an error or a shutdown) and cannot start an epoch.
    Stopped,
    /// A worker thread ended while it owed an answer (a panic: Python errors are answers).
    ThreadExited { worker: usize },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::NoWorkers => f.write_str("a worker pool needs num_workers > 0"),
            PoolError::TooManySlots {
                num_workers,
                prefetch_factor,
            } => write!(
                f,
                "rloader: num_workers={num_workers} with prefetch_factor={prefetch_factor} needs \
                 more address space for batch slots than a process has; lower them"
            ),
            PoolError::Queue(e) => e.fmt(f),
            PoolError::ShortHeader => {
                f.write_str("rloader: a worker message is shorter than its header")
            }
            PoolError::UnexpectedKind {
                kind,
                from: Some(worker),
            } => write!(
                f,
                "rloader: unexpected message kind {kind} from worker {worker}"
            ),
            PoolError::UnexpectedKind { kind, from: None } => {
                write!(f, "rloader worker: unexpected message kind {kind}")
            }
            PoolError::TruncatedBatch => f.write_str("rloader: truncated batch message"),
            PoolError::OutsideSlot => f.write_str("rloader: a batch names bytes outside its slot"),
            PoolError::NoSuchSlot { worker, slot } => write!(
                f,
                "rloader: worker {worker} named slot {slot}, which it does not have"
            ),
            PoolError::SlotOutsideRegion => {
                f.write_str("rloader: a worker named a slot outside its region")
            }
            PoolError::Stuck { worker, waited } => write!(
                f,
                "DataLoader worker {worker} took no task for {} s: it is stuck",
                waited.as_secs()
            ),
            PoolError::TimedOut(limit) => write!(
                f,
                "DataLoader timed out after {} seconds",
                limit.as_secs_f64()
            ),
            PoolError::Stopped => {
                f.write_str("this DataLoader's workers were stopped (after an error or a shutdown)")
            }
            PoolError::ThreadExited { worker } => write!(
                f,
                "DataLoader worker thread {worker} exited unexpectedly (a fault in rloader \
                 itself: please report it; worker_type='process' works around it)"
            ),
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Queue(e) => Some(e),
            _ => None,
        }
    }
}

impl From<QueueError> for PoolError {
    fn from(e: QueueError) -> Self {
        PoolError::Queue(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_as_torch_writes_them() {
        // torch: f"DataLoader timed out after {self._timeout} seconds", with the user's number.
        assert_eq!(
            PoolError::TimedOut(Duration::from_secs(2)).to_string(),
            "DataLoader timed out after 2 seconds"
        );
        assert_eq!(
            PoolError::TimedOut(Duration::from_millis(500)).to_string(),
            "DataLoader timed out after 0.5 seconds"
        );
    }

    #[test]
    fn a_queue_error_reads_as_itself() {
        let e = PoolError::from(QueueError::Closed);
        assert_eq!(e.to_string(), QueueError::Closed.to_string());
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn unexpected_kinds_say_which_side() {
        let main = PoolError::UnexpectedKind {
            kind: 9,
            from: Some(3),
        };
        let worker = PoolError::UnexpectedKind {
            kind: 9,
            from: None,
        };
        assert_eq!(
            main.to_string(),
            "rloader: unexpected message kind 9 from worker 3"
        );
        assert_eq!(
            worker.to_string(),
            "rloader worker: unexpected message kind 9"
        );
    }
}
