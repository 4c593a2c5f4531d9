//! A worker thread's life (NOTE [Thread workers] in mod.rs): set up with what its pool gives it
//! ([`WorkerSetup`]), then fetch and collate one task at a time, reporting each result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::thread_cpu;

use super::{lock, FromWorker, Gate, Passing, TaskKeys, ToWorker, WorkerEvent};
use crate::fetch::{BatchOptions, Fetcher};
use crate::handout::Answer;
use crate::sampling::KeyBatch;
use crate::stats::{Stage, Stats};

/// What every worker thread of a pool is given.
pub(super) struct WorkerSetup {
    pub(super) iterable: bool,
    /// The dataset's `__getitem__` (or `__getitems__`) is a coroutine function.
    pub(super) asynchronous: bool,
    /// How each batch is made; its `buffers`, the loader's recycled batch memory (NOTE [Batch
    /// memory] in rloader-memory), are shared by the workers.
    pub(super) batch: Py<BatchOptions>,
    pub(super) stats: Py<Stats>,
    /// Set by `ThreadPool::stop`: workers leave before their next job, and a batch being
    /// fetched is abandoned between two samples (`Fetcher::with_stop`).
    pub(super) stop: Arc<AtomicBool>,
}

impl WorkerSetup {
    pub(super) fn clone_ref(&self, py: Python<'_>) -> WorkerSetup {
        WorkerSetup {
            iterable: self.iterable,
            asynchronous: self.asynchronous,
            batch: self.batch.clone_ref(py),
            stats: self.stats.clone_ref(py),
            stop: self.stop.clone(),
        }
    }
}

// NOTE [Worker slots]
// A worker thread's Python state (its hooks, its copy of the dataset, the collate function:
// `Worker`) lives in its pool's `WorkerSlot`, not on the thread's stack, so that the garbage
// collector sees it: `ThreadPool.__traverse__` visits what the slots hold, and a persistent
// loader whose dataset refers back to it (loader -> iterator -> pool -> slot -> dataset copy ->
// loader) is collected like any other cycle instead of running its threads until exit.
// - The thread locks its slot, with the GIL held, for each job it runs, and leaves it unlocked
//   while it waits for the next one (without the GIL). The collector only ever tries the lock:
//   a slot in use is not visited, so a worker in the middle of a job keeps its state alive
//   (the references it holds are then the thread's, unexplained, as they are).
// - `ThreadPool.__clear__` (the cycle is garbage) stops the pool and takes the state out of
//   every slot it can lock; a thread that finds its slot empty leaves without touching Python.
// - The lock order is the GIL, then the slot: a thread locks its slot only attached, and the
//   collector, attached, never waits for it.
// An async worker's state stays in the frame of its event loop, which the collector cannot see
// into: such a cycle lasts until the pool is stopped or the process exits.

/// Where a worker thread's state lives between its jobs (NOTE [Worker slots]).
pub(super) type WorkerSlot = Mutex<Option<Worker>>;

/// One worker thread's state, made on that thread and used by it, kept in its slot.
pub(super) struct Worker {
    id: usize,
    /// `rloader._engines.thread.pool._ThreadWorker`: the thread's setup (worker info, seeding,
    /// `worker_init_fn`, `iter(dataset)`) and its error wrapping.
    hooks: Py<PyAny>,
    fetcher: Fetcher,
    stats: Py<Stats>,
    pin: Option<Py<PyAny>>,
    /// The error of `worker_init_fn` or `iter(dataset)`: the answer to the next task.
    init_error: Option<Answer>,
    /// Its iterable dataset is exhausted: later tasks (dropped by the Scheduler) get no answer.
    ended: bool,
    /// Each batch comes with the worker's dataset state after it (the hooks' `state()`), for
    /// a resume to restore (NOTE [Resume] in python/rloader/_resume).
    worker_states: bool,
    spent: Vec<u64>,
}

impl Worker {
    fn start(py: Python<'_>, id: usize, hooks: Py<PyAny>, setup: WorkerSetup) -> PyResult<Worker> {
        // (its dataset: a shallow copy of the loader's: `_worker_copy` in
        // _engines/thread/pool.py)
        let (dataset, samples, error) = hooks.bind(py).call_method0("start")?.extract::<(
            Py<PyAny>,
            Option<Bound<'_, PyAny>>,
            Option<Py<PyAny>>,
        )>()?;
        let init_error = error.map(Answer::Error);
        let worker_states = hooks
            .bind(py)
            .getattr("worker_states")
            .and_then(|w| w.is_truthy())?;
        let samples = match (setup.iterable, samples) {
            (false, _) => None,
            (true, Some(s)) => Some(s.try_iter()?.unbind()),
            (true, None) => Some(PyTuple::empty(py).try_iter()?.unbind()),
        };
        let batch = setup.batch.get();
        let fetcher = batch.fetcher(py, dataset, samples)?;
        Ok(Worker {
            id,
            hooks,
            fetcher: fetcher
                .with_stats(setup.stats.clone_ref(py))
                .with_stop(setup.stop.clone()),
            stats: setup.stats,
            pin: batch.pin(py),
            init_error,
            ended: false,
            worker_states,
            spent: Vec::new(),
        })
    }

    /// Lets the garbage collector see the Python objects this worker holds.
    pub(super) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.hooks)?;
        self.fetcher.traverse(visit)?;
        visit.call(&self.stats)?;
        visit.call(&self.pin)?;
        if let Some(answer) = &self.init_error {
            answer.traverse(visit)?;
        }
        Ok(())
    }

    /// Runs one job; None when it needs no answer.
    fn run(&mut self, py: Python<'_>, job: ToWorker) -> Option<FromWorker> {
        let (task, keys) = match job {
            ToWorker::Restart => {
                // (taken before iter(), as a worker process takes it: NOTE [Resume])
                let state = self.dataset_state(py);
                match self.hooks.bind(py).call_method0("restart") {
                    Ok(fresh) => match fresh.try_iter() {
                        Ok(it) => self.fetcher.restart(it.unbind()),
                        Err(err) => self.init_error = Some(self.wrap(py, err)),
                    },
                    Err(err) => self.init_error = Some(self.wrap(py, err)),
                }
                self.ended = false;
                return Some(self.report(0, WorkerEvent::Restarted(state)));
            }
            ToWorker::Task { task, keys } => (task, keys),
        };
        if self.ended {
            return None; // sent before the main thread learnt this worker had ended
        }
        if let Some(err) = self.init_error.take() {
            return Some(self.report(task, WorkerEvent::Answered(err)));
        }
        let fetched = match keys {
            TaskKeys::Next => self.fetcher.fetch_next(py),
            TaskKeys::Indices(ix) => self
                .fetcher
                .fetch_keys(py, KeyBatch::Indices(ix), &mut self.spent)
                .map(Some),
            TaskKeys::Object(obj) => self
                .fetcher
                .fetch_keys(py, KeyBatch::Object(obj.into_bound(py)), &mut self.spent)
                .map(Some),
        };
        let pinned = fetched.and_then(|batch| match (batch, &self.pin) {
            (Some(batch), Some(pin)) => self
                .stats
                .get()
                .time(Stage::Pin, || pin.bind(py).call1((batch,)))
                .map(Some),
            (batch, _) => Ok(batch),
        });
        let stated = pinned.and_then(|batch| match batch {
            Some(batch) if self.worker_states => {
                let state = self.hooks.bind(py).call_method0("state")?;
                // (an iterable dataset's iterator may end with a short last batch)
                let ended = self.fetcher.ended();
                Ok(Some((batch, Some((state.unbind(), ended)))))
            }
            batch => Ok(batch.map(|batch| (batch, None))),
        });
        let event = match stated {
            Ok(Some((batch, state))) => WorkerEvent::Answered(Answer::Batch(batch.unbind(), state)),
            Ok(None) => {
                self.ended = true;
                WorkerEvent::Ended(self.dataset_state(py))
            }
            Err(err) => WorkerEvent::Answered(self.wrap(py, err)),
        };
        Some(self.report(task, event))
    }

    /// With `worker_states`, the dataset's state now (the hooks' `start_state()`; None where
    /// it cannot be taken: a resume from here starts this worker as the loader's dataset).
    fn dataset_state(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.worker_states {
            return None;
        }
        let state = self.hooks.bind(py).call_method0("start_state").ok()?;
        (!state.is_none()).then(|| state.unbind())
    }

    fn report(&self, task: u64, event: WorkerEvent) -> FromWorker {
        FromWorker {
            worker: self.id,
            task,
            event,
        }
    }

    /// An error of the dataset or collate_fn as torch's ExceptionWrapper ("Caught ... in
    /// DataLoader worker thread N"), re-raised when its batch is handed out.
    fn wrap(&self, py: Python<'_>, err: PyErr) -> Answer {
        let tb = err.traceback(py);
        match self
            .hooks
            .bind(py)
            .call_method1("wrap_error", (err.value(py), tb))
        {
            Ok(wrapper) => Answer::Error(wrapper.unbind()),
            Err(_) => Answer::Failed(err),
        }
    }
}

/// A worker's hooks and setup until it starts, where the garbage collector sees them (NOTE
/// [Worker slots]: a thread waiting at the gate holds nothing of the user's itself).
pub(super) type Unstarted = Mutex<Option<(Py<PyAny>, WorkerSetup)>>;

impl WorkerSetup {
    pub(super) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.batch)?;
        visit.call(&self.stats)
    }
}

/// A worker thread's life: wait at the gate unless `gated` is false (NOTE [Thread start]), set
/// up with what `unstarted` holds, then take jobs until the task channel closes.
pub(super) fn worker_main(
    id: usize,
    unstarted: Arc<Unstarted>,
    gate: Option<Arc<Gate>>,
    mut jobs: Receiver<ToWorker>,
    reports: Sender<FromWorker>,
    slot: Arc<WorkerSlot>,
) {
    if let Some(gate) = &gate {
        gate.wait();
    }
    let passing = Passing(gate);
    crate::collate::copy_on_this_thread_only();
    // One attachment for the thread's whole life (NOTE [Thread workers]). None: the
    // interpreter is shutting down, and the thread leaves without touching it.
    let _ = Python::try_attach(|py| {
        // (None: the collector took them, the pool being garbage)
        let Some((hooks, setup)) = lock(&unstarted).take() else {
            return;
        };
        let asynchronous = setup.asynchronous;
        let stop = setup.stop.clone();
        if stop.load(Ordering::Acquire) {
            return; // stopped before it started: it runs nothing of the user's
        }
        let started = Worker::start(py, id, hooks.clone_ref(py), setup);
        drop(passing);
        let worker = match started {
            Ok(worker) => worker,
            Err(err) => {
                // Setting up failed (`start` raised other than through the user's code, a
                // dataset whose `__getitems__` lookup raises): every task gets that error.
                fail_every_task(py, id, err, jobs, reports);
                let _ = hooks.bind(py).call_method0("finish");
                return;
            }
        };
        if asynchronous {
            // NOTE [Async datasets]: the thread runs its event loop until the pool stops it;
            // tasks reach the loop from the main thread (`ThreadPool::send`), and the loop
            // reports through `reporter`.
            let reporter = Reporter {
                worker: id,
                reports,
            };
            if let Err(err) = hooks.bind(py).call_method1("run_async", (reporter,)) {
                err.write_unraisable(py, Some(hooks.bind(py)));
            }
            drop(worker);
        } else {
            // From here on the state is the slot's (NOTE [Worker slots]), and so is `hooks`.
            *lock(&slot) = Some(worker);
            drop(hooks);
            loop {
                let (back, job) = py.detach(move || {
                    let job = jobs.recv();
                    (jobs, job)
                });
                jobs = back;
                let Ok(job) = job else { break };
                if stop.load(Ordering::Acquire) {
                    break; // the jobs still queued are for no one
                }
                let mut state = lock(&slot);
                let Some(worker) = state.as_mut() else {
                    return; // the collector took the state: the pool was garbage
                };
                let cpu = thread_cpu::Span::start();
                let report = worker.run(py, job);
                // before the answer goes (NOTE [Worker CPU] in stats.rs)
                worker.stats.get().add_worker_cpu(cpu.spent());
                drop(state);
                if let Some(report) = report {
                    if reports.send(report).is_err() {
                        break; // the iterator is gone
                    }
                }
            }
            let Some(worker) = lock(&slot).take() else {
                return;
            };
            let hooks = worker.hooks.clone_ref(py);
            drop(worker);
            let _ = hooks.bind(py).call_method0("finish");
            return;
        }
        let _ = hooks.bind(py).call_method0("finish");
    });
}

/// The loop of a worker that could not be set up: each task is answered with `err`'s text.
fn fail_every_task(
    py: Python<'_>,
    id: usize,
    err: PyErr,
    mut jobs: Receiver<ToWorker>,
    reports: Sender<FromWorker>,
) {
    loop {
        let (back, job) = py.detach(move || {
            let job = jobs.recv();
            (jobs, job)
        });
        jobs = back;
        let (task, event) = match job {
            Ok(ToWorker::Task { task, .. }) => (
                task,
                WorkerEvent::Answered(Answer::Failed(err.clone_ref(py))),
            ),
            Ok(ToWorker::Restart) => (0, WorkerEvent::Restarted(None)),
            Err(_) => return,
        };
        let report = FromWorker {
            worker: id,
            task,
            event,
        };
        if reports.send(report).is_err() {
            return;
        }
    }
}

/// How an async worker's event loop reports a task's result (NOTE [Async datasets]).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct Reporter {
    worker: usize,
    reports: Sender<FromWorker>,
}

#[pymethods]
impl Reporter {
    /// `task`'s batch; false when no one takes reports any more (the iterator is gone).
    fn batch(&self, task: u64, batch: Py<PyAny>) -> bool {
        self.send(task, Answer::Batch(batch, None))
    }

    /// `task`'s error, as an ExceptionWrapper re-raised when its turn comes.
    fn error(&self, task: u64, wrapper: Py<PyAny>) -> bool {
        self.send(task, Answer::Error(wrapper))
    }
}

impl Reporter {
    fn send(&self, task: u64, answer: Answer) -> bool {
        let report = FromWorker {
            worker: self.worker,
            task,
            event: WorkerEvent::Answered(answer),
        };
        self.reports.send(report).is_ok()
    }
}
