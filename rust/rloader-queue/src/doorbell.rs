//! "Some worker sent something": one counter that every worker's ring bumps.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::DoorbellWord;
use crate::ShmRegion;

/// A counter in shared memory that many producers ring and one consumer waits on, so the
/// main process sleeps until any worker has sent something instead of polling N rings.
///
/// Use: `let seen = bell.current();` then check every ring (`try_recv`); only if none had
/// anything, `bell.wait(seen, ..)`. A ring after `current()` makes `wait` return at once,
/// so nothing sent in between is slept through. See NOTE [Ring protocol] in protocol.rs.
pub struct Doorbell {
    region: Arc<ShmRegion>,
    word: NonNull<DoorbellWord>,
}

// SAFETY: the word is atomics in a mapping the Arc keeps alive.
unsafe impl Send for Doorbell {}
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// Bytes a doorbell takes in a region (a cache line, so neighbours do not share it).
    pub const LEN: usize = 64;
    /// Offsets must be multiples of this.
    pub const ALIGN: usize = 64;

    fn at(region: Arc<ShmRegion>, offset: usize) -> Doorbell {
        assert!(
            offset % Self::ALIGN == 0
                && offset
                    .checked_add(Self::LEN)
                    .is_some_and(|end| end <= region.len()),
            "Doorbell at offset {offset} needs {} bytes aligned to {} inside a region of {}",
            Self::LEN,
            Self::ALIGN,
            region.len()
        );
        // SAFETY: in bounds and aligned (checked above; the mapping is page-aligned).
        let word = unsafe { NonNull::new_unchecked(region.as_ptr().add(offset).cast()) };
        Doorbell { region, word }
    }

    /// The creator: places a doorbell at `offset` and zeroes it.
    ///
    /// # Panics
    /// If `offset` is not a multiple of [`Doorbell::ALIGN`] or `offset + LEN` is past the
    /// region: a programming error, not something a peer can cause.
    pub fn init(region: Arc<ShmRegion>, offset: usize) -> Doorbell {
        let bell = Doorbell::at(region, offset);
        bell.word().initialize();
        bell
    }

    /// A peer: uses the doorbell the creator placed at `offset`. Panics as `init`.
    pub fn attach(region: Arc<ShmRegion>, offset: usize) -> Doorbell {
        Doorbell::at(region, offset)
    }

    pub(crate) fn word(&self) -> &DoorbellWord {
        // SAFETY: points into the mapping `self.region` keeps alive; all fields are atomics.
        unsafe { self.word.as_ref() }
    }

    /// Bumps the counter; a system call only if someone sleeps on it.
    pub fn ring(&self) {
        self.word().ring()
    }

    pub fn current(&self) -> u32 {
        self.word().current()
    }

    /// Returns true once the counter differs from `seen`, false after `timeout`.
    pub fn wait(&self, seen: u32, timeout: Duration) -> bool {
        self.word().wait(seen, Instant::now().checked_add(timeout))
    }

    pub fn region(&self) -> &Arc<ShmRegion> {
        &self.region
    }
}

impl Clone for Doorbell {
    fn clone(&self) -> Doorbell {
        Doorbell {
            region: Arc::clone(&self.region),
            word: self.word,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn bell() -> Doorbell {
        let region = Arc::new(ShmRegion::create_anonymous("bell", 4096, 4096).unwrap());
        Doorbell::init(region, 64)
    }

    #[test]
    fn wait_returns_at_once_when_already_rung() {
        let b = bell();
        let seen = b.current();
        b.ring();
        assert!(b.wait(seen, Duration::from_secs(10)));
        assert_eq!(b.current(), seen.wrapping_add(1));
    }

    #[test]
    fn wait_times_out() {
        let b = bell();
        let t = Instant::now();
        assert!(!b.wait(b.current(), Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn attach_sees_the_same_counter() {
        let a = bell();
        let b = Doorbell::attach(Arc::clone(a.region()), 64);
        a.ring();
        a.ring();
        assert_eq!(b.current(), 2);
    }

    #[test]
    #[should_panic(expected = "aligned to 64")]
    fn misplaced_doorbell_panics() {
        let region = Arc::new(ShmRegion::create_anonymous("bell-bad", 4096, 4096).unwrap());
        Doorbell::init(region, 4090);
    }

    #[test]
    fn sleeping_waiter_is_woken_by_another_thread() {
        let b = bell();
        let seen = b.current();
        let ringer = {
            let b = b.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                b.ring();
            })
        };
        let t = Instant::now();
        assert!(b.wait(seen, Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5));
        ringer.join().unwrap();
    }
}
