//! Worker threads (`DataLoader(..., worker_type="thread")`): `ThreadPool` (pool.rs) starts and
//! stops them, each runs `worker.rs`, and `ThreadIter` (iter.rs) sends them tasks and hands
//! their batches out.
//!
//! NOTE [Thread workers]: `num_workers` threads of this process run the fetch-and-collate loop
//! (`Fetcher`, fetch.rs), one task (a batch of keys) at a time, and hand the batch itself to
//! the main thread through a channel: no pickling, no shared memory, no copy. The order of
//! tasks and results, and the bound on work in flight, are `rloader_workers::Scheduler`'s, as
//! with processes (process/pool/), so batches, `in_order`, `prefetch_factor` and the
//! sampler's draws are those of process workers.
//!
//! Each worker thread stays attached to the interpreter for its whole life (one Python thread
//! state, so `threading.local` data such as its `get_worker_info()` lasts between tasks) and
//! lets go of the GIL whenever it waits for its next task; while it runs the dataset and the
//! collate function, the GIL is handed between threads by Python as usual, and torch releases
//! it inside its own operations. The main thread waits for results in slices without the GIL
//! (NOTE [Waiting] in wait.rs), checking for Ctrl-C, `timeout` and threads that ended.
//!
//! The channels: each worker has its own task channel (main → worker, [`ToWorker`], unbounded:
//! the Scheduler bounds what is in flight); all workers share one report channel (workers →
//! main, [`FromWorker`]).
//! A worker leaves when the pool stops (`ThreadPool::stop` sets the shared stop flag and closes
//! the task channels; the worker checks the flag before each job and between the samples of a
//! batch, so the jobs still queued and the rest of a batch are dropped, and `stop` joins it
//! for up to `JOIN_TIMEOUT`; a thread still inside the user's `__getitem__` after that
//! finishes that call and leaves on its own) or when no one is left to take its reports. Python
//! exceptions are answers, never the end of a thread; a thread that ends while it owes an
//! answer is a fault (a panic), reported as `PoolError::ThreadExited`.
//!
//! NOTE [Thread start]: the threads of a pool take turns on the GIL, so a first batch made
//! while every other thread makes its own comes after all of theirs (8 threads, (float32[3,
//! 32, 32], int) × 256: 11 ms against 1.6 ms for one thread, on 2 cores). So the threads of a
//! pool but worker 0 (which gets the first task) wait at a [`Gate`] before they attach to the
//! interpreter: the iterator opens it once it has handed a batch out, when the answer it waits
//! for is another worker's, or when a wait for worker 0 has lasted `FIRST_BATCH_GRACE_S` (a slow
//! first batch lets the others start). An epoch that ends waits for every thread to have
//! started, so each runs its `worker_init_fn` as each of torch's workers does however few
//! batches the epoch had. Stopping the pool otherwise (an iterator dropped, an error) opens
//! it too: a thread that finds the pool stopped at the gate leaves without running anything of
//! the user's. An async dataset's threads (whose event loops take tasks as they are sent) are
//! not held.

mod iter;
mod pool;
mod worker;

pub use iter::ThreadIter;
pub use pool::{PoolStopper, ThreadPool};
pub use worker::Reporter;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::handout::Answer;

/// The keys of one task, as they cross to a worker thread (as they are: nothing is pickled).
pub enum TaskKeys {
    Indices(Vec<u64>),
    Object(Py<PyAny>),
    /// The next batch of an iterable dataset.
    Next,
}

/// What the main thread sends a worker thread (its task channel).
pub enum ToWorker {
    Task {
        task: u64,
        keys: TaskKeys,
    },
    /// A new epoch of persistent workers: an iterable dataset's iterator is made anew.
    Restart,
}

/// What happened on a worker thread, in answer to a [`ToWorker`].
pub enum WorkerEvent {
    /// The task's result.
    Answered(Answer),
    /// The worker's iterable dataset is exhausted; with `worker_states`, the dataset's state
    /// then (what a persistent worker's next epoch starts from).
    Ended(Option<Py<PyAny>>),
    /// Its iterable dataset's iterator was made anew ([`ToWorker::Restart`]); with
    /// `worker_states`, the dataset's state as it was (what a resume of a worker that hands
    /// out nothing in the new epoch sets).
    Restarted(Option<Py<PyAny>>),
}

/// What a worker thread sends the main thread (the report channel all workers share).
pub struct FromWorker {
    pub worker: usize,
    pub task: u64,
    pub event: WorkerEvent,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where a pool's threads but worker 0 wait until the first batch is out (NOTE [Thread start]).
/// `opened` is set under `lock` (so a waiter cannot miss it), and read without it: the
/// iterator asks once a batch.
#[derive(Default)]
pub struct Gate {
    opened: AtomicBool,
    /// Threads that came through and have started (or left): see `wait_passed`.
    passed: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Gate {
    pub fn open(&self) {
        if !self.is_open() {
            let _held = lock(&self.lock);
            self.opened.store(true, Ordering::Release);
            self.wake.notify_all();
        }
    }

    pub fn is_open(&self) -> bool {
        self.opened.load(Ordering::Acquire)
    }

    /// Blocks until the gate is open.
    pub fn wait(&self) {
        let mut held = lock(&self.lock);
        while !self.is_open() {
            held = self.wake.wait(held).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A thread that came through has started (its `worker_init_fn` has run) or left.
    pub fn passed_one(&self) {
        let _held = lock(&self.lock);
        self.passed.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_all();
    }

    /// Blocks until `threads` have passed (see `passed_one`) or `timeout` has gone by.
    pub fn wait_passed(&self, threads: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut held = lock(&self.lock);
        while self.passed.load(Ordering::Acquire) < threads {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            held = self
                .wake
                .wait_timeout(held, left)
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    }
}

/// Marks a gated thread as passed (`Gate::passed_one`) when dropped: once it has started, or
/// on whatever way it leaves before.
pub(super) struct Passing(pub(super) Option<Arc<Gate>>);

impl Drop for Passing {
    fn drop(&mut self) {
        if let Some(gate) = self.0.take() {
            gate.passed_one();
        }
    }
}
