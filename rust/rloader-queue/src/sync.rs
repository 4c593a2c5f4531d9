//! The atomics and the futex, swapped for loom's models under `--cfg loom`.
//!
//! In a normal build [`Parker`] is zero-sized: the kernel's futex table is the parking lot,
//! keyed by the physical page, so a waiter and a waker in different processes meet there
//! (hence `FUTEX_WAIT`/`FUTEX_WAKE`, never the `_PRIVATE` variants). Under loom it is a
//! mutex and condition variable that give the same guarantee as `FUTEX_WAIT`: the check
//! "word still equals `expected`" and the sleep are atomic with respect to a wake.

use std::time::Instant;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// How a [`Parker::wait`] ended. Either way the caller re-checks its condition: futex
/// wake-ups can be spurious, and a wake may be meant for an older value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Woken,
    TimedOut,
}

/// Has `deadline` passed? `None` never passes.
pub(crate) fn expired(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct Parker;

#[cfg(not(loom))]
impl Parker {
    /// Sleeps while `word == expected`, until a [`Parker::wake`] on `word` or `deadline`.
    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32, deadline: Option<Instant>) -> Wake {
        let timeout = match deadline {
            None => None,
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(libc::timespec {
                    tv_sec: left.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                }),
                _ => return Wake::TimedOut,
            },
        };
        let ts = timeout
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `word` is a live, aligned u32 (in shared memory, mapped for the lifetime of
        // the borrow); FUTEX_WAIT only reads it. `ts` is null or points at a local timespec.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                ts,
                std::ptr::null::<u32>(),
                0u32,
            )
        };
        if rc == 0 {
            return Wake::Woken;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ETIMEDOUT) => Wake::TimedOut,
            // EAGAIN: the word had already changed; EINTR: a signal (Python's SIGCHLD, ...).
            Some(libc::EAGAIN) | Some(libc::EINTR) => Wake::Woken,
            // A sandbox that forbids futex (ENOSYS/EPERM): degrade to polling, never spin.
            _ => {
                std::thread::sleep(std::time::Duration::from_micros(200));
                Wake::Woken
            }
        }
    }

    /// Wakes up to `n` waiters sleeping on `word` (in any process).
    pub(crate) fn wake(&self, word: &AtomicU32, n: i32) {
        // SAFETY: as in `wait`; FUTEX_WAKE does not touch the word's value.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                n,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct Parker {
    lock: loom::sync::Mutex<()>,
    cond: loom::sync::Condvar,
}

#[cfg(loom)]
impl Parker {
    pub(crate) fn new() -> Parker {
        Parker {
            lock: loom::sync::Mutex::new(()),
            cond: loom::sync::Condvar::new(),
        }
    }

    /// Loom's model of FUTEX_WAIT. Deadlines are not modelled: models only wait forever,
    /// so a lost wake-up shows as loom's "deadlock" failure.
    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32, deadline: Option<Instant>) -> Wake {
        assert!(deadline.is_none(), "loom models use untimed waits");
        let guard = self.lock.lock().unwrap();
        if word.load(Ordering::SeqCst) != expected {
            return Wake::Woken;
        }
        drop(self.cond.wait(guard).unwrap());
        Wake::Woken
    }

    pub(crate) fn wake(&self, _word: &AtomicU32, _n: i32) {
        let _guard = self.lock.lock().unwrap();
        self.cond.notify_all();
    }
}
