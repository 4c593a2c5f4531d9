//! `ThreadIter`: the main thread's side of loading with worker threads: it draws the tasks,
//! sends them to the pool's threads and hands their results out in the Scheduler's order.

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::{Next, PoolError, Scheduler};

use super::ThreadPool;
use super::{lock, FromWorker, TaskKeys, ToWorker, WorkerEvent};
use crate::errors::to_py;
use crate::handout::{
    iterator_methods, set_prefetch_factor, Answer, Drained, HandOutOptions, HandOutState,
};
use crate::sampling::{KeyBatch, SamplerKeys};
use crate::wait;

/// How long a wait for the first batch keeps the other worker threads from starting (NOTE
/// [Thread start] in mod.rs).
const FIRST_BATCH_GRACE_S: f64 = 0.005;

/// The iterator `iter(DataLoader(..., num_workers>0, worker_type="thread"))` returns.
// No instance `dict`: PyO3 allocates one after the object is tracked by the garbage collector
// and before its fields are written, and a collection landing on that allocation ran
// `__traverse__` over zeroed fields (SIGSEGV while garbage-collecting; tests/test_gc_safety.py).
// The one attribute Python sets is a field.
#[pyclass(module = "rloader._rloader", weakref)]
pub struct ThreadIter {
    /// `_rloader_pool`: the Python pool behind this iterator, set by the code that starts it
    /// (tests, persistent loaders and the pin thread look).
    #[pyo3(get, set, name = "_rloader_pool")]
    rloader_pool: Option<Py<PyAny>>,
    pool: Py<ThreadPool>,
    scheduler: Scheduler<Answer>,
    /// None for an iterable-style dataset (every task is "the next batch").
    keys: Option<SamplerKeys>,
    auto_collation: bool,
    timeout: Option<Duration>,
    persistent: bool,
    index_buf: Vec<u64>,
    restarted: usize,
    /// Cleared by the garbage collector: hands out nothing more.
    cleared: bool,
    /// What was handed out this epoch, by which worker (NOTE [Resume]: exact with
    /// in_order=False), and the pool's `Stats`.
    hand_out: HandOutState,
    /// How long a wait for worker 0's first batch keeps the others at the gate, in seconds
    /// (NOTE [Thread start] in mod.rs; tests set it).
    #[pyo3(get, set, name = "_first_batch_grace")]
    first_batch_grace: f64,
}

iterator_methods!(ThreadIter);

#[pymethods]
impl ThreadIter {
    /// Built by `rloader._engines.thread.pool.start_threads`; every argument is keyword-only.
    /// `keys`: `iter(index_sampler)`, None for an iterable dataset; each worker has up to
    /// `prefetch_factor` tasks in flight; `hand_out`: in which order, how long and how many
    /// batches are handed out. Whether a task is a batch of keys is the pool's
    /// (`BatchOptions.auto_collation`).
    #[new]
    #[pyo3(signature = (*, pool, prefetch_factor, keys, hand_out))]
    fn new(
        py: Python<'_>,
        pool: Py<ThreadPool>,
        prefetch_factor: usize,
        keys: Option<Bound<'_, PyAny>>,
        hand_out: PyRef<'_, HandOutOptions>,
    ) -> PyResult<Self> {
        let (size, auto_collation) = (pool.get().size, pool.get().auto_collation);
        let stats = pool.get().stats.clone_ref(py);
        Ok(ThreadIter {
            rloader_pool: None,
            pool,
            scheduler: hand_out.scheduler(size, prefetch_factor),
            keys: keys
                .map(|k| SamplerKeys::new(&k, auto_collation))
                .transpose()?,
            auto_collation,
            timeout: hand_out.timeout(),
            persistent: hand_out.persistent(),
            index_buf: Vec::new(),
            restarted: 0,
            cleared: false,
            hand_out: hand_out.state(py, size, stats)?,
            first_batch_grace: FIRST_BATCH_GRACE_S,
        })
    }

    /// `handout::set_prefetch_factor` (`prefetch_factor="auto"`).
    fn _set_prefetch_factor(&mut self, prefetch_factor: usize) -> PyResult<()> {
        set_prefetch_factor(&mut self.scheduler, prefetch_factor)
    }

    /// The epoch's first draws, in `iter()` as torch makes them.
    fn _prefill(&mut self, py: Python<'_>) -> PyResult<()> {
        self.send_tasks(py)
    }

    /// A new epoch on persistent workers: `keys` is the new `iter(index_sampler)` (None for an
    /// iterable dataset, whose workers make their iterators anew). (Worker threads pin their
    /// own batches: no pin thread holds any, unlike `PoolIter._reset`'s.)
    #[pyo3(signature = (keys, reported_len=None))]
    fn _reset(
        &mut self,
        py: Python<'_>,
        keys: Option<Bound<'_, PyAny>>,
        reported_len: Option<(Py<PyAny>, usize)>,
    ) -> PyResult<()> {
        if self.pool.get().stopped() {
            return Err(to_py(PoolError::Stopped));
        }
        // The old epoch's keys go first; answers still owed from it are waited for and dropped,
        // with those held.
        self.keys = None;
        let started = Instant::now();
        let mut drained = Drained::new(self.pool.get().size);
        self.scheduler.mark_exhausted();
        while !drained.take_ready(&mut self.scheduler) {
            self.wait_for_reports(py, started)?;
        }
        self.scheduler.reset();
        self.hand_out.new_epoch(py, reported_len);
        let keys = keys
            .map(|k| SamplerKeys::new(&k, self.auto_collation))
            .transpose()?;
        if keys.is_some() {
            self.hand_out.start_from(py, drained);
        } else {
            self.restarted = 0;
            let size = self.pool.get().size;
            for w in 0..size {
                self.pool.get().send(py, w, ToWorker::Restart)?;
            }
            while self.restarted < size {
                self.wait_for_reports(py, started)?;
            }
        }
        self.keys = keys;
        self.send_tasks(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.rloader_pool)?;
        if let Some(keys) = &self.keys {
            keys.traverse(&visit)?;
        }
        visit.call(&self.pool)?;
        self.hand_out.traverse(&visit, &self.scheduler)
    }

    fn __clear__(&mut self) {
        self.keys = None;
        self.rloader_pool = None;
        self.hand_out.clear();
        self.cleared = true;
    }
}

impl ThreadIter {
    /// `__next__` without its timing (`Stats`).
    fn next_handed_out<'py>(mut slf: PyRefMut<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        if slf.cleared || slf.pool.get().stopped() && !slf.persistent {
            return Ok(None);
        }
        let mut answer = match slf.next_answer(py)? {
            None => {
                slf.hand_out.finish();
                slf.pool.get().start_every_worker(py); // NOTE [Thread start]
                if !slf.persistent {
                    slf.pool.get().stop(py);
                }
                return Ok(None);
            }
            Some(answer) => answer,
        };
        slf.pool.get().open_gate(); // a batch is out: every thread may start
        let (worker, task) = slf.scheduler.last_handed_out().unwrap_or_default();
        let state = answer.take_state();
        slf.hand_out.record(py, task, worker, state);
        let batch = answer.into_batch(py)?;
        slf.hand_out.yielded(py)?;
        Ok(Some(batch))
    }

    /// The next result to hand out, waiting for it; None at the end of the epoch.
    fn next_answer(&mut self, py: Python<'_>) -> PyResult<Option<Answer>> {
        let started = Instant::now();
        loop {
            self.send_tasks(py)?;
            match self.scheduler.next() {
                Next::Ready(answer) => {
                    // torch's _process_data: the draw this hand-out owes comes first, and a
                    // sampler's error is raised instead of the batch.
                    self.send_tasks(py)?;
                    return Ok(Some(answer));
                }
                Next::Done => return Ok(None),
                Next::Wait => self.wait_for_reports(py, started)?,
            }
        }
    }

    /// Draws the tasks the Scheduler owes and gives each to its worker.
    fn send_tasks(&mut self, py: Python<'_>) -> PyResult<()> {
        while self.scheduler.draws_owed() > 0 {
            self.scheduler.spend_draw(); // even if the draw fails, as torch's _try_put_index
            let keys = match &self.keys {
                None => TaskKeys::Next,
                Some(keys) => match keys.next(py, &mut self.index_buf)? {
                    None => {
                        self.scheduler.mark_exhausted();
                        break;
                    }
                    Some(KeyBatch::Indices(ix)) => TaskKeys::Indices(ix),
                    Some(KeyBatch::Object(obj)) => TaskKeys::Object(obj.unbind()),
                },
            };
            // No worker may take it (iterable datasets out of order): dropped, as torch does.
            if let Some((worker, task)) = self.scheduler.assign() {
                self.pool
                    .get()
                    .send(py, worker, ToWorker::Task { task, keys })?;
            }
        }
        Ok(())
    }

    /// Waits (in slices, without the GIL) until at least one report has come, and takes in
    /// every report there is; raises on `timeout` (counted from `started`) or a dead thread.
    fn wait_for_reports(&mut self, py: Python<'_>, started: Instant) -> PyResult<()> {
        let deadline = self.timeout.and_then(|limit| started.checked_add(limit));
        let pool = self.pool.get();
        if !pool.gate_open() {
            // NOTE [Thread start]: worker 0 alone, while the answer awaited is its own, for
            // at most the grace.
            if self.scheduler.answer_coming_from(1) {
                let grace =
                    Duration::try_from_secs_f64(self.first_batch_grace).unwrap_or(Duration::ZERO);
                let grace = grace
                    .min(deadline.map_or(grace, |d| d.saturating_duration_since(Instant::now())));
                let report = py.detach(|| lock(&pool.reports).recv_timeout(grace));
                if let Ok(report) = report {
                    self.take(py, report);
                    return Ok(());
                }
            }
            pool.open_gate();
        }
        let first = wait::until(
            py,
            deadline,
            |len| match lock(&pool.reports).recv_timeout(len) {
                Ok(report) => Some(Some(report)),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(None),
            },
            || match pool.exited() {
                Some(worker) if self.scheduler.owes(worker) => {
                    Err(to_py(PoolError::ThreadExited { worker }))
                }
                _ => Ok(None),
            },
        )?;
        let first = match first {
            None => {
                let limit = self.timeout.unwrap_or_default();
                return Err(to_py(PoolError::TimedOut(limit)));
            }
            Some(None) => {
                let worker = pool.exited().unwrap_or(0);
                return Err(to_py(PoolError::ThreadExited { worker }));
            }
            Some(Some(report)) => report,
        };
        let mut more = Vec::new();
        {
            let reports = lock(&pool.reports);
            while let Ok(report) = reports.try_recv() {
                more.push(report);
            }
        }
        for report in std::iter::once(first).chain(more) {
            self.take(py, report);
        }
        Ok(())
    }

    fn take(&mut self, py: Python<'_>, report: FromWorker) {
        match report.event {
            WorkerEvent::Answered(answer) => self.scheduler.on_result(report.task, answer),
            WorkerEvent::Ended(state) => {
                if let Some(state) = state {
                    self.hand_out
                        .handouts(py)
                        .set_end_state(report.worker, state);
                }
                self.scheduler.on_worker_ended(report.worker, report.task);
            }
            WorkerEvent::Restarted(state) => {
                if let Some(state) = state {
                    self.hand_out
                        .handouts(py)
                        .set_start_state(report.worker, state);
                }
                self.restarted += 1;
            }
        }
    }
}
