//! `ThreadPool`: the worker threads of one iterator, and how to stop them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::PoolError;

use super::worker::{worker_main, Unstarted, WorkerSetup, WorkerSlot};
use super::{lock, FromWorker, Gate, TaskKeys, ToWorker};
use crate::errors::to_py;
use crate::fetch::BatchOptions;
use crate::stats::Stats;

/// How long `ThreadPool::stop` waits for its threads to leave.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The worker threads of one iterator (`worker_type="thread"`), and how to stop them.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct ThreadPool {
    /// Where the epoch's time went; the workers add their fetch, collate and pin times.
    pub(super) stats: Py<Stats>,
    /// What stops the threads, shared with the iterator's finalizer (`stopper`).
    control: Arc<Control>,
    /// Each worker thread's state between its jobs, which the collector sees (NOTE [Worker
    /// slots] in worker.rs).
    slots: Vec<Arc<WorkerSlot>>,
    /// Each worker's hooks and setup until it starts (NOTE [Thread start] in mod.rs).
    unstarted: Vec<Arc<Unstarted>>,
    /// Only the main thread's iterator receives (the mutex is never contended).
    pub(super) reports: Mutex<Receiver<FromWorker>>,
    pub(super) size: usize,
    /// Each task is a batch of keys (its `BatchOptions`' auto_collation).
    pub(super) auto_collation: bool,
}

/// How a pool's threads are told to leave and joined. It holds none of the workers' Python
/// state (an async pool's event loops aside), so the finalizer that stops the threads when
/// their iterator goes (`ThreadPool.stopper()`, `start_threads`) keeps no dataset alive from
/// the finalizers' registry (NOTE [Worker slots] in worker.rs).
struct Control {
    /// WorkerSetup with the workers (`WorkerSetup::stop`).
    stop: Arc<AtomicBool>,
    /// Where workers but worker 0 wait to start (NOTE [Thread start] in mod.rs).
    gate: Arc<Gate>,
    /// With an async dataset, each worker's hooks, whose `submit` hands a task to the worker's
    /// event loop (NOTE [Async datasets]).
    loops: Option<Vec<Py<PyAny>>>,
    /// Each worker's task channel; emptied by `stop` (closing them tells the workers to leave).
    jobs: Mutex<Vec<Sender<ToWorker>>>,
    handles: Mutex<Vec<Option<JoinHandle<()>>>>,
    stopped: AtomicBool,
}

/// `ThreadPool.stopper()`: stops a pool's threads without holding the pool.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct PoolStopper(Arc<Control>);

#[pymethods]
impl PoolStopper {
    /// As `ThreadPool.stop`.
    fn stop(&self, py: Python<'_>) {
        self.0.stop(py);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.0.traverse(&visit)
    }
}

#[pymethods]
impl ThreadPool {
    /// Starts one thread per hooks object in `workers`
    /// (`rloader._engines.thread.pool._ThreadWorker`, or `_AsyncThreadWorker` when
    /// `asynchronous`), each making batches of its copy of the dataset as `batch` says (an
    /// iterable dataset when `iterable`).
    #[new]
    #[pyo3(signature = (*, workers, iterable, batch, asynchronous=false))]
    fn new(
        py: Python<'_>,
        workers: Vec<Py<PyAny>>,
        iterable: bool,
        batch: Py<BatchOptions>,
        asynchronous: bool,
    ) -> PyResult<Self> {
        if workers.is_empty() {
            return Err(to_py(PoolError::NoWorkers));
        }
        // (NOTE [Worker CPU] in stats.rs: an async pool's event loops are not counted per job)
        let stats = Py::new(
            py,
            if asynchronous {
                Stats::new()
            } else {
                Stats::for_threads()
            },
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Gate::default());
        let auto_collation = batch.get().auto_collation();
        let setup = WorkerSetup {
            stats: stats.clone_ref(py),
            stop: stop.clone(),
            iterable,
            asynchronous,
            batch,
        };
        let (report_tx, report_rx) = mpsc::channel();
        let size = workers.len();
        let mut jobs = Vec::with_capacity(size);
        let mut handles = Vec::with_capacity(size);
        let slots: Vec<Arc<WorkerSlot>> = (0..size).map(|_| Arc::new(Mutex::new(None))).collect();
        let loops: Vec<Py<PyAny>> = workers.iter().map(|h| h.clone_ref(py)).collect();
        let mut unstarted = Vec::with_capacity(size);
        for (id, hooks) in workers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let reports = report_tx.clone();
            let slot = slots[id].clone();
            let pending = Arc::new(Mutex::new(Some((hooks, setup.clone_ref(py)))));
            unstarted.push(pending.clone());
            // (NOTE [Thread start]: an async dataset's threads are not held)
            let gated = (id != 0 && !asynchronous).then(|| gate.clone());
            let handle = thread::Builder::new()
                .name(format!("rloader-w{id}"))
                .spawn(move || worker_main(id, pending, gated, rx, reports, slot))
                .map_err(|e| {
                    pyo3::exceptions::PyRuntimeError::new_err(format!(
                        "could not start DataLoader worker thread {id}: {e}"
                    ))
                })?;
            jobs.push(tx);
            handles.push(Some(handle));
        }
        let control = Control {
            stop,
            gate,
            loops: asynchronous.then_some(loops),
            jobs: Mutex::new(jobs),
            handles: Mutex::new(handles),
            stopped: AtomicBool::new(false),
        };
        Ok(ThreadPool {
            stats,
            control: Arc::new(control),
            slots,
            unstarted,
            reports: Mutex::new(report_rx),
            size,
            auto_collation,
        })
    }

    /// What stops this pool's threads without keeping the pool (or its datasets) alive.
    fn stopper(&self) -> PoolStopper {
        PoolStopper(self.control.clone())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.stats)?;
        self.control.traverse(&visit)?;
        // A slot in use (its worker is running a job) is not visited (NOTE [Worker slots]).
        for slot in &self.slots {
            if let Ok(state) = slot.try_lock() {
                if let Some(worker) = state.as_ref() {
                    worker.traverse(&visit)?;
                }
            }
        }
        for pending in &self.unstarted {
            if let Ok(pending) = pending.try_lock() {
                if let Some((hooks, setup)) = pending.as_ref() {
                    visit.call(hooks)?;
                    setup.traverse(&visit)?;
                }
            }
        }
        Ok(())
    }

    /// The pool is part of a garbage cycle: its workers leave, and the state of each idle one
    /// is let go of here (NOTE [Worker slots]).
    fn __clear__(&self) {
        self.control.stop.store(true, Ordering::Release);
        self.control.gate.open();
        lock(&self.control.jobs).clear();
        for slot in &self.slots {
            let taken = match slot.try_lock() {
                Ok(mut state) => state.take(),
                Err(_) => None,
            };
            drop(taken); // after the slot's lock is let go of: its drop runs Python
        }
        for pending in &self.unstarted {
            let taken = match pending.try_lock() {
                Ok(mut pending) => pending.take(),
                Err(_) => None,
            };
            drop(taken);
        }
    }

    /// Whether `stop` has run.
    #[getter]
    pub(super) fn stopped(&self) -> bool {
        self.control.stopped.load(Ordering::Acquire)
    }

    /// Tells every worker thread to leave and waits up to `JOIN_TIMEOUT` for them, without the
    /// GIL (they may need it to finish their current task). Idempotent.
    pub(super) fn stop(&self, py: Python<'_>) {
        self.control.stop(py);
    }
}

impl Control {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for hooks in self.loops.iter().flatten() {
            visit.call(hooks)?;
        }
        Ok(())
    }

    fn stop(&self, py: Python<'_>) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop.store(true, Ordering::Release);
        self.gate.open(); // a thread still at the gate leaves from there
        lock(&self.jobs).clear();
        for hooks in self.loops.iter().flatten() {
            // Stops its event loop (the thread then leaves); an error is the user's to see.
            if let Err(err) = hooks.bind(py).call_method0("stop_async") {
                err.write_unraisable(py, Some(hooks.bind(py)));
            }
        }
        let handles: Vec<JoinHandle<()>> = lock(&self.handles)
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        let me = thread::current().id();
        py.detach(move || {
            let deadline = Instant::now() + JOIN_TIMEOUT;
            for handle in handles {
                if handle.thread().id() == me {
                    continue; // stopped from one of its own workers: it leaves after this task
                }
                while !handle.is_finished() && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                if handle.is_finished() {
                    let _ = handle.join();
                } // else: it finishes the user's call it is in, then leaves (detached)
            }
        });
    }
}

impl ThreadPool {
    pub(super) fn send(&self, py: Python<'_>, worker: usize, job: ToWorker) -> PyResult<()> {
        if let (Some(loops), ToWorker::Task { task, keys }) = (&self.control.loops, &job) {
            if self.control.stopped.load(Ordering::Acquire) {
                return Err(to_py(PoolError::Stopped));
            }
            let keys = match keys {
                TaskKeys::Indices(ix) => pyo3::types::PyList::new(py, ix)?.into_any(),
                TaskKeys::Object(obj) => obj.bind(py).clone(),
                TaskKeys::Next => py.None().into_bound(py),
            };
            loops[worker]
                .bind(py)
                .call_method1("submit", (*task, keys))?;
            return Ok(());
        }
        let jobs = lock(&self.control.jobs);
        match jobs.get(worker) {
            Some(tx) => tx
                .send(job)
                .map_err(|_| to_py(PoolError::ThreadExited { worker })),
            None => Err(to_py(PoolError::Stopped)),
        }
    }

    /// Lets every worker thread start (NOTE [Thread start] in mod.rs).
    pub(super) fn open_gate(&self) {
        self.control.gate.open();
    }

    /// Lets every thread start and waits (without the GIL, up to `JOIN_TIMEOUT`) until each
    /// has: an epoch that ends runs every worker's `worker_init_fn` (NOTE [Thread start]).
    pub(super) fn start_every_worker(&self, py: Python<'_>) {
        if self.control.gate.is_open() && self.control.loops.is_some() {
            return; // (an async pool's threads are not held)
        }
        let gate = self.control.gate.clone();
        let gated = if self.control.loops.is_some() {
            0
        } else {
            self.size - 1
        };
        gate.open();
        py.detach(move || gate.wait_passed(gated, JOIN_TIMEOUT));
    }

    pub(super) fn gate_open(&self) -> bool {
        self.control.gate.is_open()
    }

    /// The first worker that has ended although the pool was not stopped.
    pub(super) fn exited(&self) -> Option<usize> {
        if self.control.stopped.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.control.handles)
            .iter()
            .position(|h| h.as_ref().is_some_and(JoinHandle::is_finished))
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // Without a join (a drop must not wait): the workers leave after their current task,
        // and those still at the gate from there.
        self.control.stop.store(true, Ordering::Release);
        self.control.gate.open();
        lock(&self.control.jobs).clear();
    }
}
