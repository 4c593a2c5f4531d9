//! `GilProbe`: how much of the main process's loading time a second thread could not take a
//! lock that threads take in turns (the interpreter's GIL), measured from a thread of its own.
//!
//! `num_workers="auto"` with `worker_type="auto"` starts its first pool of threads or of
//! processes. Threads only help work that lets the GIL go (I/O, sleeps, decoding and tensor
//! ops that release it); pure-Python work runs on one thread's turn at a time. While the main
//! process loads, the probe's thread asks for the lock (`attach`: takes it and gives it back
//! at once), waits `period`, and asks again. A free lock is taken in microseconds. One the
//! loading holds is given up at the interpreter's switch interval (5 ms by default), and one
//! the loading gives up and takes back at once (a tensor op between Python lines) may not be
//! given to the probe at all: the waiter's switch request restarts at every such hand-back, as
//! a worker thread's would. The probe's time blocked in `attach`, counted only while the main
//! process is loading (`set_loading`), over that and its periods between asks, is the share of
//! the loading in which a worker thread could not have run Python (`Share::blocked_share`).
//!
//! Accounting: each stretch of loading `[from, to)` counts the probe's waits that overlap it,
//! clipped to it. A wait that ends while the loading goes on is added by the probe (from the
//! later of its start and the stretch's); one under way when a stretch ends is added up to
//! there by `set_loading(false)`, and its remainder, if it ends in a later stretch, by the
//! probe from that stretch's start. Both sides update `State` under its mutex, which neither
//! holds while blocked: the probe takes the lock (`attach`) with the mutex released.
//!
//! The probe asks only while loading. Outside it the thread waits on its condition variable and
//! takes nothing: the training loop's own steps are never disturbed. A held lock costs the
//! loading one hand-over per switch interval (tens of microseconds); a free one costs it
//! nothing but the lock's cache line.
//!
//! Stopping: [`GilProbe::stop`] wakes the thread and joins it. The thread may be waiting for
//! the lock inside `attach`, so the caller must not hold it while joining (the binding crate
//! releases the GIL around the join). [`Drop`] only tells the thread to end (it cannot know
//! whether the lock is held): a thread in `attach` ends once it is given the lock.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the probe measured so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// The probe's time blocked on the lock, within the loading's stretches.
    pub blocked: Duration,
    /// The loading's time (its finished stretches).
    pub loading: Duration,
    /// The probe's asks for the lock (each begun while loading).
    pub asks: u64,
}

impl Share {
    /// The probe's own time while loading, in seconds: blocked, and the `period` it waits
    /// after each ask. (Not the loading's time: on a busy machine the probe's thread may wait
    /// for a core too, between a period's end and its next ask; that time says nothing of the
    /// lock.)
    pub fn observed(&self, period: Duration) -> f64 {
        self.blocked.as_secs_f64() + self.asks as f64 * period.as_secs_f64()
    }

    /// The share of the probe's own time, while loading, that it spent blocked.
    pub fn blocked_share(&self, period: Duration) -> Option<f64> {
        let observed = self.observed(period);
        (observed > 0.0).then(|| self.blocked.as_secs_f64() / observed)
    }
}

#[derive(Default)]
struct State {
    /// When the loading's current stretch began (None: not loading).
    loading_from: Option<Instant>,
    /// When the probe's current wait for the lock began (None: not waiting).
    waiting_from: Option<Instant>,
    share: Share,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct GilProbe {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GilProbe {
    /// Starts the probe's thread: while loading, it calls `attach` (which takes the lock and
    /// gives it back), waits `period`, and calls it again.
    pub fn start(
        period: Duration,
        attach: impl Fn() + Send + 'static,
    ) -> std::io::Result<GilProbe> {
        let shared = Arc::new(Shared::default());
        let ours = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("rloader-gil-probe".into())
            .spawn(move || run(&ours, period, attach))?;
        Ok(GilProbe {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The main process begins (true) or ends (false) a stretch of loading.
    pub fn set_loading(&self, loading: bool) {
        let now = Instant::now();
        let mut state = self.shared.state();
        match (loading, state.loading_from) {
            (true, None) => {
                state.loading_from = Some(now);
                self.shared.wake.notify_one();
            }
            (false, Some(from)) => {
                state.loading_from = None;
                state.share.loading += now - from;
                if let Some(waiting) = state.waiting_from {
                    state.share.blocked += now - waiting.max(from);
                }
            }
            _ => {} // (already so)
        }
    }

    pub fn share(&self) -> Share {
        self.shared.state().share
    }

    /// Whether the probe is waiting for the lock now (tests).
    pub fn waiting(&self) -> bool {
        self.shared.state().waiting_from.is_some()
    }

    /// Tells the thread to end, without waiting for it.
    pub fn signal_stop(&self) {
        let mut state = self.shared.state();
        state.stop = true;
        self.shared.wake.notify_one();
    }

    /// Ends the thread and waits for it (not while holding the lock `attach` takes).
    pub fn stop(&self) {
        self.signal_stop();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for GilProbe {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

fn run(shared: &Shared, period: Duration, attach: impl Fn()) {
    loop {
        let asked = {
            let mut state = shared.state();
            while state.loading_from.is_none() && !state.stop {
                state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            if state.stop {
                return;
            }
            let asked = Instant::now();
            state.waiting_from = Some(asked);
            state.share.asks += 1;
            asked
        };
        attach();
        let got = Instant::now();
        let mut state = shared.state();
        state.waiting_from = None;
        if let Some(from) = state.loading_from {
            state.share.blocked += got - asked.max(from);
        }
        // The next ask after `period` (a stop ends the wait).
        let (state, _) = shared
            .wake
            .wait_timeout_while(state, period, |s| !s.stop)
            .unwrap_or_else(|e| e.into_inner());
        if state.stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::mpsc;

    const PERIOD: Duration = Duration::from_micros(200);

    /// A probe whose `attach` takes `lock`.
    fn probe_of(lock: &Arc<Mutex<()>>) -> GilProbe {
        let lock = Arc::clone(lock);
        GilProbe::start(PERIOD, move || drop(lock.lock().unwrap())).unwrap()
    }

    /// A probe loading, waiting for `lock`, which the returned guard holds.
    fn loading_and_waiting(lock: &Arc<Mutex<()>>) -> (GilProbe, MutexGuard<'_, ()>) {
        let probe = probe_of(lock);
        let guard = lock.lock().unwrap();
        probe.set_loading(true);
        while !probe.waiting() {
            std::thread::yield_now();
        }
        (probe, guard)
    }

    fn spin_for(d: Duration) {
        let since = Instant::now();
        while since.elapsed() < d {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_held_lock_counts_blocked_up_to_the_loadings_end() {
        let lock = Arc::new(Mutex::new(()));
        let (probe, guard) = loading_and_waiting(&lock);
        let seen = Instant::now();
        spin_for(Duration::from_millis(5));
        let at_least = seen.elapsed();
        probe.set_loading(false);
        drop(guard); // (its wait ends outside the loading: not counted)
        probe.stop();
        let share = probe.share();
        assert!(share.blocked >= at_least, "{share:?}, {at_least:?}");
        assert!(share.blocked <= share.loading, "{share:?}");
        // (one ask, blocked for 5 ms, against a period of 0.2 ms)
        assert!(share.blocked_share(PERIOD).unwrap() > 0.9, "{share:?}");
    }

    #[test]
    fn a_wait_across_stretches_counts_only_their_time() {
        let lock = Arc::new(Mutex::new(()));
        let (probe, guard) = loading_and_waiting(&lock);
        probe.set_loading(false);
        let first = probe.share();
        spin_for(Duration::from_millis(5)); // not loading: the wait goes on uncounted
        let second = Instant::now();
        probe.set_loading(true);
        spin_for(Duration::from_millis(1));
        drop(guard); // the wait ends in the second stretch
        while probe.waiting() {
            std::thread::yield_now();
        }
        probe.set_loading(false);
        let stretch = second.elapsed();
        probe.stop();
        let share = probe.share();
        assert!(share.blocked <= share.loading, "{share:?}");
        assert!(
            share.blocked - first.blocked >= Duration::from_millis(1),
            "{share:?}"
        );
        // Only the second stretch was added, however long a busy machine made it.
        assert!(
            share.loading - first.loading <= stretch,
            "{share:?}, {stretch:?}"
        );
    }

    #[test]
    fn a_free_lock_counts_little() {
        let lock = Arc::new(Mutex::new(()));
        let probe = probe_of(&lock);
        probe.set_loading(true);
        spin_for(100 * PERIOD);
        probe.set_loading(false);
        probe.stop();
        let share = probe.share();
        assert!(share.loading >= 100 * PERIOD);
        assert!(share.blocked * 2 < share.loading, "{share:?}");
        assert!(share.asks >= 1);
        assert!(share.blocked_share(PERIOD).unwrap() < 0.5, "{share:?}");
    }

    #[test]
    fn nothing_is_asked_while_not_loading() {
        let off = Arc::new(AtomicBool::new(false));
        let after_off = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel();
        let (theirs_off, theirs_after) = (Arc::clone(&off), Arc::clone(&after_off));
        let probe = GilProbe::start(PERIOD, move || {
            if theirs_off.load(Relaxed) {
                theirs_after.fetch_add(1, Relaxed);
            }
            let _ = tx.send(());
        })
        .unwrap();
        probe.set_loading(true);
        rx.recv().unwrap(); // asking while loading
        probe.set_loading(false);
        off.store(true, Relaxed);
        // 100 periods without loading: at most the ask that had passed its check before the
        // loading ended may begin after it.
        spin_for(100 * PERIOD);
        probe.stop();
        assert!(after_off.load(Relaxed) <= 1, "asked while not loading");
    }

    #[test]
    fn stop_ends_an_idle_thread_and_an_asking_one() {
        let lock = Arc::new(Mutex::new(()));
        let idle = probe_of(&lock);
        idle.stop();
        let (tx, rx) = mpsc::channel();
        let asking = GilProbe::start(PERIOD, move || {
            let _ = tx.send(());
        })
        .unwrap();
        asking.set_loading(true);
        for _ in 0..3 {
            rx.recv().unwrap();
        }
        asking.stop();
        assert!(asking.thread.lock().unwrap().is_none());
    }

    #[test]
    fn drop_ends_the_thread_once_the_lock_is_given() {
        let lock = Arc::new(Mutex::new(()));
        let (probe, guard) = loading_and_waiting(&lock);
        let thread = probe.thread.lock().unwrap().take().unwrap();
        drop(probe); // with the lock held: it cannot join, only signal
        drop(guard);
        thread.join().unwrap();
    }
}

#[cfg(test)]
mod share_tests {
    use super::*;

    #[test]
    fn blocked_share_weighs_blocked_time_against_the_periods_between_asks() {
        let period = Duration::from_millis(1);
        let none = Share::default();
        assert_eq!(none.blocked_share(period), None);
        let share = Share {
            blocked: Duration::from_millis(15),
            loading: Duration::from_millis(100), // (not the denominator)
            asks: 5,
        };
        assert_eq!(share.blocked_share(period), Some(0.75));
    }
}
