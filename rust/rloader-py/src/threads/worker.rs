//! A worker thread's life (NOTE [Thread workers] in mod.rs): set up with what its pool gives it
//! ([`WorkerSetup`]), then fetch and collate one task at a time, reporting each result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::{FromWorker, TaskKeys, ToWorker, WorkerEvent};
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

/// One worker thread's state, made and used on that thread.
struct Worker {
    id: usize,
    /// `rloader._threads._ThreadWorker`: the thread's setup (worker info, seeding,
    /// `worker_init_fn`, `iter(dataset)`) and its error wrapping.
    hooks: Py<PyAny>,
    fetcher: Fetcher,
    stats: Py<Stats>,
    pin: Option<Py<PyAny>>,
    /// The error of `worker_init_fn` or `iter(dataset)`: the answer to the next task.
    init_error: Option<Answer>,
    /// Its iterable dataset is exhausted: later tasks (dropped by the Scheduler) get no answer.
    ended: bool,
    spent: Vec<u64>,
}

impl Worker {
    fn start(py: Python<'_>, id: usize, hooks: Py<PyAny>, setup: WorkerSetup) -> PyResult<Worker> {
        // (its dataset: a shallow copy of the loader's, see `_worker_copy` in _threads.py)
        let (dataset, samples, error) = hooks.bind(py).call_method0("start")?.extract::<(
            Py<PyAny>,
            Option<Bound<'_, PyAny>>,
            Option<Py<PyAny>>,
        )>()?;
        let init_error = error.map(Answer::Error);
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
            spent: Vec::new(),
        })
    }

    /// Runs one job; None when it needs no answer.
    fn run(&mut self, py: Python<'_>, job: ToWorker) -> Option<FromWorker> {
        let (task, keys) = match job {
            ToWorker::Restart => {
                match self.hooks.bind(py).call_method0("restart") {
                    Ok(fresh) => match fresh.try_iter() {
                        Ok(it) => self.fetcher.restart(it.unbind()),
                        Err(err) => self.init_error = Some(self.wrap(py, err)),
                    },
                    Err(err) => self.init_error = Some(self.wrap(py, err)),
                }
                self.ended = false;
                return Some(self.report(0, WorkerEvent::Restarted));
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
        let event = match pinned {
            Ok(Some(batch)) => WorkerEvent::Answered(Answer::Batch(batch.unbind(), None)),
            Ok(None) => {
                self.ended = true;
                WorkerEvent::Ended
            }
            Err(err) => WorkerEvent::Answered(self.wrap(py, err)),
        };
        Some(self.report(task, event))
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

/// A worker thread's life: set up, then take jobs until the task channel closes.
pub(super) fn worker_main(
    id: usize,
    hooks: Py<PyAny>,
    setup: WorkerSetup,
    mut jobs: Receiver<ToWorker>,
    reports: Sender<FromWorker>,
) {
    let asynchronous = setup.asynchronous;
    let stop = setup.stop.clone();
    crate::collate::copy_on_this_thread_only();
    // One attachment for the thread's whole life (NOTE [Thread workers]). None: the
    // interpreter is shutting down, and the thread leaves without touching it.
    let _ = Python::try_attach(|py| {
        let mut worker = match Worker::start(py, id, hooks.clone_ref(py), setup) {
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
        } else {
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
                if let Some(report) = worker.run(py, job) {
                    if reports.send(report).is_err() {
                        break; // the iterator is gone
                    }
                }
            }
        }
        drop(worker);
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
            Ok(ToWorker::Restart) => (0, WorkerEvent::Restarted),
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
