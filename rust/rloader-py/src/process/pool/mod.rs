//! `PoolIter`: the main process's side of multi-process loading.
//!
//! One shared-memory region per pool (`PoolRegion`, region.rs) holds a doorbell, per worker two
//! rings (`rloader-queue`: tasks go main → worker, answers worker → main), and per worker its
//! batch slots (NOTE [Slots] in rloader-workers' slots.rs). Messages are NOTE [Pool protocol]
//! in rloader-workers' wire.rs; the order of tasks and answers, and who gets the next task, is
//! `rloader_workers::Scheduler`'s. Each worker runs `worker_loop` (worker.rs).
//!
//! Workers that are not persistent have their task rings closed as soon as the sampler is
//! exhausted, behind their last tasks: each leaves once it has answered them, and the cost of a
//! process's exit (tearing down the address space it inherited) overlaps the end of the epoch
//! instead of following it. A worker told to stop that has exited is dead only if it still owes
//! an answer once its ring is drained.
//!
//! Waiting never holds the GIL (NOTE [Waiting] in wait.rs): the main process sleeps on the
//! doorbell (which every worker rings after each answer) in slices, and between slices checks
//! that its workers are alive and that `timeout` has not passed.
//!
//! By job: this file holds `PoolIter` itself, what Python calls, and handing batches out;
//! - `tasks.rs`: drawing tasks and sending them into the workers' rings (NOTE [Unsent]);
//! - `start.rs`: starting the workers one by one (NOTE [Staged start]);
//! - `answers.rs`: waiting for answers, taking them in, noticing a dead worker.

mod answers;
mod start;
mod tasks;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use rloader_queue::{Doorbell, Ring};
use rloader_workers::wire::{self, kind, HEADER};
use rloader_workers::{Next, PoolError, Scheduler};

use super::key_feed::TaskKeySource;
use super::region::PoolRegion;
use crate::errors::to_py;
use crate::handout::{
    iterator_methods, reraise, set_prefetch_factor, Answer, Drained, HandOutOptions, HandOutState,
    WorkerState,
};
use crate::memory::PinnedSlots;
use crate::stats::Stats;

/// How long the main process waits to send a worker a control message (RESUME, into a task
/// ring every task of the last epoch has left) before declaring the worker stuck.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The iterator `iter(DataLoader(..., num_workers>0))` returns.
// No instance `dict`: PyO3 allocates one after the object is tracked by the garbage collector
// and before its fields are written, and a collection landing on that allocation ran
// `__traverse__` over zeroed fields (SIGSEGV while garbage-collecting; tests/test_gc_safety.py).
// The one attribute Python sets is a field.
#[pyclass(module = "rloader._rloader", weakref)]
pub struct PoolIter {
    /// `_rloader_pool`: the Python pool behind this iterator, set by the code that starts it
    /// (tests, persistent loaders and the pin thread look).
    #[pyo3(get, set, name = "_rloader_pool")]
    rloader_pool: Option<Py<PyAny>>,
    pool_region: Py<PoolRegion>,
    doorbell: Doorbell,
    to_workers: Vec<Ring>,
    from_workers: Vec<Ring>,
    scheduler: Scheduler<Answer>,
    /// None for an iterable-style dataset (every task is "the next batch").
    keys: Option<TaskKeySource>,
    auto_collation: bool,
    /// The Python side (`rloader._engines.process.pool._Pool`): unpickling, liveness, stopping
    /// processes.
    hooks: Py<PyAny>,
    timeout: Option<Duration>,
    persistent: bool,
    stopped: bool,
    resumed: usize,
    index_buf: Vec<u64>,
    /// When the batch `_poll` is waiting for was first asked for (what `timeout` counts from).
    waiting_since: Option<Instant>,
    /// Every task ring is closed behind its last task (non-persistent, sampler exhausted).
    told_to_stop: bool,
    /// Tokens owed for workers whose iterable dataset ended, with a token feed (NOTE [Key feed]).
    end_tokens: usize,
    /// Per worker, the tasks assigned to it and not yet in its ring (NOTE [Unsent]).
    unsent: Vec<VecDeque<([u8; HEADER], Vec<u8>)>>,
    /// Per worker: the answer being received (a streamed one arrives in parts).
    inbox: Vec<Vec<u8>>,
    /// Tensor buffers received in slots and inline (for tests and debugging).
    buffers_in_slots: u64,
    buffers_inline: u64,
    /// What `__next__` handed out this epoch, by which worker (NOTE [Resume]; handouts.rs says
    /// who records what with pin_memory), its length and its `Stats` (fetch and collate are
    /// the workers').
    hand_out: HandOutState,
    /// Each batch comes with its worker's dataset state (`(batch, state)` from the hooks'
    /// `loads`): a dataset with `state_dict`.
    worker_states: bool,
    /// Batches arriving in slots are pinned there (`_pin_slots`, NOTE [Pinned slots]).
    pinned: Option<Arc<PinnedSlots>>,
    /// Workers not started yet, started from this iterator's waits by `starter` (NOTE
    /// [Staged start]; `rloader._engines.process.pool._Starter`).
    unstarted: usize,
    starter: Option<Py<PyAny>>,
    /// How long a wait lets the workers already started answer before it starts the next
    /// (once per pool), and until when it does now.
    grace: Duration,
    grace_until: Option<Instant>,
    /// When the last of them was started (`timeout` counts from there too).
    started_one: Option<Instant>,
}

/// Which task a batch (or error) handed out answered, the worker that made it, and with
/// `worker_states` that worker's dataset state after it (what `HandOuts.record` takes).
type BatchOrigin = (u64, usize, Option<WorkerState>);

iterator_methods!(PoolIter);

#[pymethods]
impl PoolIter {
    /// Built by `rloader._engines.process.pool.start_pool`; every argument is keyword-only.
    ///
    /// - `region`: the pool's shared memory; `hooks`: its Python side (`_Pool`);
    /// - `keys`: `iter(index_sampler)`, or the pin thread's `KeyFeed`; None for an iterable
    ///   dataset; `auto_collation`: each task is a batch of keys (torch's auto-collation);
    /// - `hand_out`: in which order, how long and how many batches are handed out;
    /// - `worker_states`: each answer carries its worker's dataset state (a dataset with
    ///   `state_dict`).
    #[new]
    #[pyo3(signature = (*, region, hooks, keys, auto_collation, hand_out, worker_states=false))]
    fn new(
        py: Python<'_>,
        region: Py<PoolRegion>,
        hooks: Py<PyAny>,
        keys: Option<Bound<'_, PyAny>>,
        auto_collation: bool,
        hand_out: PyRef<'_, HandOutOptions>,
        worker_states: bool,
    ) -> PyResult<Self> {
        let pr = region.get();
        let (doorbell, to_workers, from_workers) = pr.prepare()?;
        let (num_workers, prefetch_factor) = (pr.num_workers(), pr.prefetch_factor);
        let keys = match keys {
            Some(k) => Some(TaskKeySource::new(&k, auto_collation)?),
            None => None,
        };
        // Fetch and collate run in the workers, which add their times to the region.
        let stats = Stats::new();
        let cells = (0..num_workers).map(|w| pr.layout.times(w)).collect();
        stats.read_workers(pr.shm.clone(), cells);
        let stats = Py::new(py, stats)?;
        Ok(PoolIter {
            rloader_pool: None,
            pool_region: region,
            doorbell,
            to_workers,
            from_workers,
            scheduler: hand_out.scheduler(num_workers, prefetch_factor),
            keys,
            auto_collation,
            hooks,
            timeout: hand_out.timeout(),
            persistent: hand_out.persistent(),
            stopped: false,
            resumed: 0,
            index_buf: Vec::new(),
            waiting_since: None,
            told_to_stop: false,
            end_tokens: 0,
            unsent: vec![VecDeque::new(); num_workers],
            inbox: vec![Vec::new(); num_workers],
            buffers_in_slots: 0,
            buffers_inline: 0,
            hand_out: hand_out.state(py, num_workers, stats)?,
            worker_states,
            pinned: None,
            unstarted: 0,
            starter: None,
            grace: Duration::ZERO,
            grace_until: None,
            started_one: None,
        })
    }

    /// `starter.pending` are the last workers, not started yet (NOTE [Staged start]). With
    /// `starts`, this iterator starts them (`starter.start_next()`), in order, from its waits,
    /// `grace` being the seconds the first wait lets the workers already started answer first
    /// (what starting one took); without (`pin_memory`: the main thread starts them), it only
    /// asks which are started.
    #[pyo3(signature = (starter, grace, starts=true))]
    fn _stage(&mut self, starter: Bound<'_, PyAny>, grace: f64, starts: bool) -> PyResult<()> {
        if starts {
            let unstarted = starter.getattr("pending")?.len()?;
            self.unstarted = unstarted.min(self.to_workers.len());
            self.grace = Duration::try_from_secs_f64(grace).unwrap_or(Duration::ZERO);
        }
        self.starter = Some(starter.unbind());
        Ok(())
    }

    /// From now on, batches that arrive in slots are pinned there: each slot registered with
    /// the accelerator's driver (`register(addr, len)`, `unregister(addr)`), and freed once
    /// the `fence()` recorded when its batch is dropped has completed (NOTE [Pinned slots];
    /// `rloader._pinning.cuda_host.slot_pinning`). The region keeps the registrations for its
    /// later pools.
    fn _pin_slots(&mut self, register: Py<PyAny>, unregister: Py<PyAny>, fence: Py<PyAny>) {
        let region = self.pool_region.get();
        self.pinned = Some(region.pinned_slots(register, unregister, fence));
    }

    /// (tensor buffers received in shared-memory slots, received inline and copied).
    #[getter]
    fn _transport_counts(&self) -> (u64, u64) {
        (self.buffers_in_slots, self.buffers_inline)
    }

    /// `__next__` for a thread that must notice when to stop (the pin_memory thread): waits at
    /// most `wait` seconds and returns `("batch", batch, tag)`, `("error", exception, tag)` for
    /// a worker's error (which, like a batch, answers a task), or `("none", None, None)` if
    /// nothing came in time; StopIteration at the end, and any other error (a dead worker, a
    /// timeout) is raised. `timeout` counts from the first call of a wait. `tag` is what
    /// `HandOuts.record` takes once the batch reaches the user: `(task, worker, state)`.
    fn _poll<'py>(
        &mut self,
        py: Python<'py>,
        wait: f64,
    ) -> PyResult<(&'static str, Py<PyAny>, Option<BatchOrigin>)> {
        let now = Instant::now();
        let started = *self.waiting_since.get_or_insert(now);
        let until = now + Duration::from_secs_f64(wait.max(0.0));
        let arrival = self.next_batch(py, started, Some(until));
        if !matches!(arrival, Ok(Arrival::NotYet)) {
            self.waiting_since = None; // the wait is over, one way or another
        }
        match arrival? {
            Arrival::Batch(batch, origin) => Ok(("batch", batch.unbind(), Some(origin))),
            Arrival::Error(err, origin) => {
                Ok(("error", err.into_value(py).into_any(), Some(origin)))
            }
            Arrival::EpochEnd => Err(PyStopIteration::new_err(())),
            Arrival::NotYet => Ok(("none", py.None(), None)),
        }
    }

    /// A new epoch on persistent workers: `keys` is the new `iter(index_sampler)` (None for an
    /// iterable dataset, whose workers restart their iterators); `pinned`: the records of the
    /// results the pin thread took and did not hand out (`Drained`).
    #[pyo3(signature = (keys, reported_len=None, pinned=None))]
    fn _reset(
        &mut self,
        py: Python<'_>,
        keys: Option<Bound<'_, PyAny>>,
        reported_len: Option<(Py<PyAny>, usize)>,
        pinned: Option<Vec<(u64, usize, Option<WorkerState>)>>,
    ) -> PyResult<()> {
        if self.stopped {
            return Err(to_py(PoolError::Stopped));
        }
        // Keys the main thread drew into a feed and the pin thread had not taken yet become
        // their tasks first, as torch puts each index it draws to a worker: their workers draw
        // for them, so where each worker's dataset is next epoch does not hang on the pin
        // thread's timing. Then the old epoch's keys go: nothing more is drawn or taken from
        // them (a feed's leftovers must not look like work to do while the old answers are
        // drained).
        if matches!(&self.keys, Some(TaskKeySource::Feed(queue)) if !queue.tokens) {
            self.draw_tasks(py)?;
        }
        self.keys = None;
        // Answers still owed from an abandoned epoch are drained and dropped with those held
        // (tasks not sent yet are sent while waiting, so that their answers come too).
        let started = Instant::now();
        let mut drained = Drained::new(self.to_workers.len());
        drained.note_all(pinned.unwrap_or_default());
        self.scheduler.mark_exhausted();
        while !drained.take_ready(&mut self.scheduler) {
            self.wait_for_answer(py, started, None)?;
        }
        self.scheduler.reset();
        self.hand_out.new_epoch(py, reported_len);
        self.waiting_since = None;
        self.end_tokens = 0;
        let source = keys
            .map(|k| TaskKeySource::new(&k, self.auto_collation))
            .transpose()?;
        let iterable = match &source {
            None => true,
            Some(TaskKeySource::Feed(queue)) => queue.tokens,
            Some(TaskKeySource::Sampler(_)) => false,
        };
        if !iterable {
            self.hand_out.start_from(py, drained);
        } else {
            // The workers restart their datasets' iterators (and say their states as they do).
            self.resumed = 0;
            for w in 0..self.to_workers.len() {
                self.send(py, w, &wire::header(kind::RESUME, w, 0), &[])?;
            }
            while self.resumed < self.to_workers.len() {
                self.wait_for_answer(py, started, None)?;
            }
        }
        self.keys = source;
        // The epoch's first draws, in iter() as torch makes them.
        self.send_tasks(py)
    }

    /// `handout::set_prefetch_factor` (`prefetch_factor="auto"`).
    /// Slots beyond the region's (`PoolRegion`'s `prefetch_factor`) are not there: those
    /// batches travel inline.
    fn _set_prefetch_factor(&mut self, prefetch_factor: usize) -> PyResult<()> {
        set_prefetch_factor(&mut self.scheduler, prefetch_factor)
    }

    /// Draws the first tasks and sends them before any worker is started, so
    /// that worker 0 starts on its first batch the moment it exists. Only what fits in the
    /// fresh task rings is sent; the rest waits in `unsent` (NOTE [Unsent]).
    fn _prefill(&mut self, py: Python<'_>) -> PyResult<()> {
        self.draw_tasks(py)?;
        self.flush_unsent(py, false)
    }

    /// Stops the workers now (idempotent).
    fn _shutdown_workers(&mut self, py: Python<'_>) -> PyResult<()> {
        self.shutdown(py)
    }

    // The garbage collector must see what the iterator holds of the user's: a persistent
    // loader holds its iterator, and a sampler (or dataset) that refers back to the loader
    // would otherwise make a cycle nothing frees, keeping the workers alive.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.rloader_pool)?;
        if let Some(TaskKeySource::Sampler(keys)) = &self.keys {
            keys.traverse(&visit)?;
        }
        visit.call(&self.pool_region)?;
        visit.call(&self.hooks)?;
        visit.call(&self.starter)?;
        self.hand_out.traverse(&visit, &self.scheduler)
    }

    fn __clear__(&mut self) {
        if let Some(TaskKeySource::Sampler(_)) = self.keys {
            self.keys = None;
        }
        self.rloader_pool = None;
        self.starter = None;
        self.unstarted = 0;
        self.hand_out.clear();
        // Nothing more is sent or handed out (its finalizer still stops the workers).
        self.stopped = true;
    }
}

/// What `PoolIter::next_batch` found to hand out.
enum Arrival<'py> {
    Batch(Bound<'py, PyAny>, BatchOrigin),
    /// A worker's error, in answer to its task.
    Error(PyErr, BatchOrigin),
    /// The epoch is over.
    EpochEnd,
    /// Nothing arrived before the deadline.
    NotYet,
}

impl PoolIter {
    /// `__next__` without its timing (`Stats`).
    fn next_handed_out<'py>(mut slf: PyRefMut<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        let arrival = match slf.next_batch(py, Instant::now(), None) {
            Ok(arrival) => arrival,
            Err(err) => {
                // torch raises from Python frames that hold its iterator, so the workers
                // outlive the exception and are stopped after the user has seen it (a stuck
                // one is waited for for seconds). The exception holds this iterator likewise.
                let this: Py<PoolIter> = slf.into();
                let _ = err.value(py).setattr("_rloader_iterator", this);
                return Err(err);
            }
        };
        match arrival {
            Arrival::Batch(batch, (task, worker, state)) => {
                slf.hand_out.record(py, task, worker, state);
                slf.hand_out.yielded(py)?;
                Ok(Some(batch))
            }
            Arrival::Error(err, (task, worker, state)) => {
                slf.hand_out.record(py, task, worker, state);
                Err(err)
            }
            Arrival::EpochEnd => {
                slf.hand_out.finish();
                Ok(None)
            }
            Arrival::NotYet => Ok(None),
        }
    }

    /// The next batch, unpinned; waits until `until` at most (`None`: as long as it takes, up
    /// to `timeout` counted from `started`).
    fn next_batch<'py>(
        &mut self,
        py: Python<'py>,
        started: Instant,
        until: Option<Instant>,
    ) -> PyResult<Arrival<'py>> {
        if self.stopped {
            return Ok(Arrival::EpochEnd);
        }
        loop {
            if let Some(pinned) = self.pool_region.get().pinned.get() {
                pinned.reclaim(); // slots the device has read since (NOTE [Pinned slots])
            }
            self.send_tasks(py)?;
            let next = self.scheduler.next();
            if let Next::Ready(_) = next {
                // torch's _process_data: the draw this hand-out owes is made before the result
                // is handed out, and a sampler's error is raised instead of it.
                self.send_tasks(py)?;
            }
            // The task and worker a result handed out answered (for state_dict()).
            let origin = |state| {
                let (worker, task) = self.scheduler.last_handed_out().unwrap_or_default();
                (task, worker, state)
            };
            match next {
                Next::Ready(Answer::Batch(batch, state)) => {
                    return Ok(Arrival::Batch(batch.into_bound(py), origin(state)))
                }
                Next::Ready(Answer::Error(wrapper)) => {
                    return Ok(Arrival::Error(reraise(py, &wrapper), origin(None)));
                }
                Next::Ready(Answer::Failed(err)) => return Ok(Arrival::Error(err, origin(None))),
                Next::Done => {
                    // Every worker runs, as torch's all do, if only its worker_init_fn.
                    while self.unstarted > 0 {
                        self.start_next(py)?;
                    }
                    if !self.persistent {
                        self.shutdown(py)?;
                    }
                    return Ok(Arrival::EpochEnd);
                }
                Next::Wait => {
                    if !self.wait_for_answer(py, started, until)? {
                        return Ok(Arrival::NotYet);
                    }
                }
            }
        }
    }

    fn shutdown(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        // Workers not started are not started now. `_Pool.shutdown` closes the rings (so the
        // workers leave), then joins the workers.
        self.unstarted = 0;
        self.starter = None;
        self.hooks.bind(py).call_method0("shutdown")?;
        Ok(())
    }
}
