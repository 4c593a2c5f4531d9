//! A thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`): what a worker thread spent on a core
//! making a batch, for `num_workers="auto"` to read a thread pool's own CPU use apart from the
//! rest of its process (the training step's threads, the consumer's).
//!
//! The clock counts the time the calling thread ran on a core, user and system, and nothing
//! else: not the time it was blocked (waiting for a task, for the GIL, on a sleep or on I/O),
//! nor the time it was runnable but another thread or process had the core, nor any other
//! thread's time. [`Span`] reads it at a job's start and end.

use std::mem::MaybeUninit;

/// The calling thread's CPU time so far, in nanoseconds; None where the clock is not there.
pub fn now() -> Option<u64> {
    let mut ts = MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: `ts` is a valid place for one timespec, which clock_gettime writes on success
    // (rc 0) and which is read only then.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, ts.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: written by clock_gettime (rc 0 above).
    let ts = unsafe { ts.assume_init() };
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// The calling thread's CPU time from [`Span::start`] to [`Span::spent`] (both on the same
/// thread: the clock is the calling thread's).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    from: Option<u64>,
}

impl Span {
    pub fn start() -> Span {
        Span { from: now() }
    }

    /// Nanoseconds of CPU time this thread spent since `start` (0 where the clock is not there).
    pub fn spent(&self) -> u64 {
        match (self.from, now()) {
            (Some(from), Some(to)) => to.saturating_sub(from),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    /// Spins on this thread until its own CPU clock has advanced `nanos`.
    fn burn(nanos: u64) {
        let span = Span::start();
        let mut x = 0u64;
        while span.spent() < nanos {
            for i in 0..1000u64 {
                x = black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        black_box(x);
    }

    #[test]
    fn a_thread_that_burns_cpu_reads_its_own_time() {
        let span = Span::start();
        burn(20_000_000);
        let spent = span.spent();
        assert!(spent >= 20_000_000, "{spent}");
    }

    #[test]
    fn sleeping_and_other_threads_work_are_not_the_threads_time() {
        let span = Span::start();
        // Another thread burns 50 ms of its own CPU, and this one sleeps 50 ms meanwhile.
        let other = std::thread::spawn(|| burn(50_000_000));
        let slept = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        other.join().unwrap();
        assert!(slept.elapsed() >= Duration::from_millis(50));
        let spent = span.spent();
        assert!(spent < 10_000_000, "{spent}");
    }
}
