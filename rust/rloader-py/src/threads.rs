//! Worker threads (`DataLoader(..., worker_type="thread")`): `ThreadPool` and `ThreadIter`.
//!
//! NOTE [Thread workers]: `num_workers` threads of this process run the fetch-and-collate loop
//! (`Fetcher`, fetch.rs), one task (a batch of keys) at a time, and hand the batch itself to
//! the main thread through a channel: no pickling, no shared memory, no copy. The order of
//! tasks and results, and the bound on work in flight, are `rloader_workers::Scheduler`'s, as
//! with processes (pool.rs), so batches, `in_order`, `prefetch_factor` and the sampler's draws
//! are those of process workers.
//!
//! Each worker thread stays attached to the interpreter for its whole life (one Python thread
//! state, so `threading.local` data such as its `get_worker_info()` lasts between tasks) and
//! lets go of the GIL whenever it waits for its next task; while it runs the dataset and the
//! collate function, the GIL is handed between threads by Python as usual, and torch releases
//! it inside its own operations. The main thread waits for results in slices without the GIL
//! (NOTE [Waiting] in wait.rs), checking for Ctrl-C, `timeout` and threads that ended.
//!
//! The channels: each worker has its own task channel (main → worker, unbounded: the
//! Scheduler bounds what is in flight); all workers share one report channel (workers → main).
//! A worker leaves when the pool stops (`ThreadPool::stop` sets the shared stop flag and closes
//! the task channels; the worker checks the flag before each job and between the samples of a
//! batch, so the jobs still queued and the rest of a batch are dropped, and `stop` joins it
//! for up to `JOIN_TIMEOUT`; a thread still inside the user's `__getitem__` after that
//! finishes that call and leaves on its own) or when no one is left to take its reports. Python
//! exceptions are answers, never the end of a thread; a thread that ends while it owes an
//! answer is a fault (a panic), reported as `PoolError::ThreadExited`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::{Next, PoolError, Scheduler};

use crate::buffers::BatchBuffers;
use crate::errors::{no_length, not_picklable, to_py};
use crate::fetch::{Collate, Fetcher, KeyBatch};
use crate::handouts::HandOuts;
use crate::length_warning::LengthWarning;
use crate::loader::Keys;
use crate::pool::Answer;
use crate::stats::{Stage, Stats};
use crate::wait;

/// How long `ThreadPool::stop` waits for its threads to leave.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The keys of one task, as they cross to a worker thread (as they are: nothing is pickled).
enum TaskKeys {
    Indices(Vec<u64>),
    Object(Py<PyAny>),
    /// The next batch of an iterable dataset.
    Next,
}

enum Job {
    Task {
        task: u64,
        keys: TaskKeys,
    },
    /// A new epoch of persistent workers: an iterable dataset's iterator is made anew.
    Restart,
}

enum Done {
    Answer(Answer),
    /// The worker's iterable dataset is exhausted.
    Ended,
    Restarted,
}

struct Report {
    worker: usize,
    task: u64,
    done: Done,
}

/// What every worker thread of a pool is given.
struct Shared {
    iterable: bool,
    /// The dataset's `__getitem__` (or `__getitems__`) is a coroutine function.
    asynchronous: bool,
    auto_collation: bool,
    batch_size: Option<usize>,
    drop_last: bool,
    collate_fn: Py<PyAny>,
    collate_plan: Option<Py<PyAny>>,
    pin: Option<Py<PyAny>>,
    stats: Py<Stats>,
    /// The loader's recycled batch memory (NOTE [Batch memory] in rloader-memory), shared by
    /// the workers: the default collate's large outputs go there.
    buffers: Option<Py<BatchBuffers>>,
    /// Set by `ThreadPool::stop`: workers leave before their next job, and a batch being
    /// fetched is abandoned between two samples (`Fetcher::with_stop`).
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn clone_ref(&self, py: Python<'_>) -> Shared {
        Shared {
            iterable: self.iterable,
            asynchronous: self.asynchronous,
            auto_collation: self.auto_collation,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            collate_fn: self.collate_fn.clone_ref(py),
            collate_plan: self.collate_plan.as_ref().map(|p| p.clone_ref(py)),
            pin: self.pin.as_ref().map(|p| p.clone_ref(py)),
            stats: self.stats.clone_ref(py),
            buffers: self.buffers.as_ref().map(|b| b.clone_ref(py)),
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
    fn start(py: Python<'_>, id: usize, hooks: Py<PyAny>, shared: Shared) -> PyResult<Worker> {
        // (its dataset: a shallow copy of the loader's, see `_worker_copy` in _threads.py)
        let (dataset, samples, error) = hooks.bind(py).call_method0("start")?.extract::<(
            Py<PyAny>,
            Option<Bound<'_, PyAny>>,
            Option<Py<PyAny>>,
        )>()?;
        let init_error = error.map(Answer::Error);
        let collate = Collate::new(
            shared.collate_fn,
            shared.collate_plan.map(|p| p.into_bound(py)),
        )?
        .with_buffers(shared.buffers);
        let fetcher = if shared.iterable {
            let samples = match samples {
                Some(s) => s.try_iter()?,
                None => PyTuple::empty(py).try_iter()?,
            };
            Fetcher::iterable(
                dataset,
                samples.unbind(),
                shared.batch_size,
                shared.drop_last,
                collate,
            )
        } else {
            Fetcher::map(py, dataset, shared.auto_collation, collate)?
        };
        Ok(Worker {
            id,
            hooks,
            fetcher: fetcher
                .with_stats(shared.stats.clone_ref(py))
                .with_stop(shared.stop.clone()),
            stats: shared.stats,
            pin: shared.pin,
            init_error,
            ended: false,
            spent: Vec::new(),
        })
    }

    /// Runs one job; None when it needs no answer.
    fn run(&mut self, py: Python<'_>, job: Job) -> Option<Report> {
        let (task, keys) = match job {
            Job::Restart => {
                match self.hooks.bind(py).call_method0("restart") {
                    Ok(fresh) => match fresh.try_iter() {
                        Ok(it) => self.fetcher.restart(it.unbind()),
                        Err(err) => self.init_error = Some(self.wrap(py, err)),
                    },
                    Err(err) => self.init_error = Some(self.wrap(py, err)),
                }
                self.ended = false;
                return Some(self.report(0, Done::Restarted));
            }
            Job::Task { task, keys } => (task, keys),
        };
        if self.ended {
            return None; // sent before the main thread learnt this worker had ended
        }
        if let Some(err) = self.init_error.take() {
            return Some(self.report(task, Done::Answer(err)));
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
        let done = match pinned {
            Ok(Some(batch)) => Done::Answer(Answer::Batch(batch.unbind(), None)),
            Ok(None) => {
                self.ended = true;
                Done::Ended
            }
            Err(err) => Done::Answer(self.wrap(py, err)),
        };
        Some(self.report(task, done))
    }

    fn report(&self, task: u64, done: Done) -> Report {
        Report {
            worker: self.id,
            task,
            done,
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
fn worker_main(
    id: usize,
    hooks: Py<PyAny>,
    shared: Shared,
    mut jobs: Receiver<Job>,
    reports: Sender<Report>,
) {
    let asynchronous = shared.asynchronous;
    let stop = shared.stop.clone();
    crate::collate::copy_on_this_thread_only();
    // One attachment for the thread's whole life (NOTE [Thread workers]). None: the
    // interpreter is shutting down, and the thread leaves without touching it.
    let _ = Python::try_attach(|py| {
        let mut worker = match Worker::start(py, id, hooks.clone_ref(py), shared) {
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
    mut jobs: Receiver<Job>,
    reports: Sender<Report>,
) {
    loop {
        let (back, job) = py.detach(move || {
            let job = jobs.recv();
            (jobs, job)
        });
        jobs = back;
        let (task, done) = match job {
            Ok(Job::Task { task, .. }) => (task, Done::Answer(Answer::Failed(err.clone_ref(py)))),
            Ok(Job::Restart) => (0, Done::Restarted),
            Err(_) => return,
        };
        let report = Report {
            worker: id,
            task,
            done,
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
    reports: Sender<Report>,
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
        let report = Report {
            worker: self.worker,
            task,
            done: Done::Answer(answer),
        };
        self.reports.send(report).is_ok()
    }
}

/// The worker threads of one iterator (`worker_type="thread"`), and how to stop them.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct ThreadPool {
    /// Where the epoch's time went; the workers add their fetch, collate and pin times.
    stats: Py<Stats>,
    /// Shared with the workers (`Shared::stop`).
    stop: Arc<AtomicBool>,
    /// With an async dataset, each worker's hooks, whose `submit` hands a task to the worker's
    /// event loop (NOTE [Async datasets]).
    loops: Option<Vec<Py<PyAny>>>,
    /// Each worker's task channel; emptied by `stop` (closing them tells the workers to leave).
    jobs: Mutex<Vec<Sender<Job>>>,
    handles: Mutex<Vec<Option<JoinHandle<()>>>>,
    /// Only the main thread's iterator receives (the mutex is never contended).
    reports: Mutex<Receiver<Report>>,
    stopped: AtomicBool,
    size: usize,
}

#[pymethods]
impl ThreadPool {
    /// Starts one thread per hooks object in `workers` (`rloader._threads._ThreadWorker`).
    /// `collate_plan` is the `CollatePlan` when `collate_fn` is a default collate; `pin` pins
    /// each batch on its worker thread when set.
    #[new]
    #[pyo3(signature = (*, workers, iterable, auto_collation, batch_size, drop_last, collate_fn,
                        collate_plan, pin, asynchronous=false, buffers=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        workers: Vec<Py<PyAny>>,
        iterable: bool,
        auto_collation: bool,
        batch_size: Option<usize>,
        drop_last: bool,
        collate_fn: Py<PyAny>,
        collate_plan: Option<Py<PyAny>>,
        pin: Option<Py<PyAny>>,
        asynchronous: bool,
        buffers: Option<Py<BatchBuffers>>,
    ) -> PyResult<Self> {
        if workers.is_empty() {
            return Err(to_py(PoolError::NoWorkers));
        }
        let stats = Py::new(py, Stats::new())?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Shared {
            stats: stats.clone_ref(py),
            buffers,
            stop: stop.clone(),
            iterable,
            asynchronous,
            auto_collation,
            batch_size,
            drop_last,
            collate_fn,
            collate_plan,
            pin,
        };
        let (report_tx, report_rx) = mpsc::channel();
        let size = workers.len();
        let mut jobs = Vec::with_capacity(size);
        let mut handles = Vec::with_capacity(size);
        let loops: Vec<Py<PyAny>> = workers.iter().map(|h| h.clone_ref(py)).collect();
        for (id, hooks) in workers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let (shared, reports) = (shared.clone_ref(py), report_tx.clone());
            let handle = thread::Builder::new()
                .name(format!("rloader-w{id}"))
                .spawn(move || worker_main(id, hooks, shared, rx, reports))
                .map_err(|e| {
                    pyo3::exceptions::PyRuntimeError::new_err(format!(
                        "could not start DataLoader worker thread {id}: {e}"
                    ))
                })?;
            jobs.push(tx);
            handles.push(Some(handle));
        }
        Ok(ThreadPool {
            stats,
            stop,
            loops: asynchronous.then_some(loops),
            jobs: Mutex::new(jobs),
            handles: Mutex::new(handles),
            reports: Mutex::new(report_rx),
            stopped: AtomicBool::new(false),
            size,
        })
    }

    /// Whether `stop` has run.
    #[getter]
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Tells every worker thread to leave and waits up to `JOIN_TIMEOUT` for them, without the
    /// GIL (they may need it to finish their current task). Idempotent.
    fn stop(&self, py: Python<'_>) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop.store(true, Ordering::Release);
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
    fn send(&self, py: Python<'_>, worker: usize, job: Job) -> PyResult<()> {
        if let (Some(loops), Job::Task { task, keys }) = (&self.loops, &job) {
            if self.stopped.load(Ordering::Acquire) {
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
        let jobs = lock(&self.jobs);
        match jobs.get(worker) {
            Some(tx) => tx
                .send(job)
                .map_err(|_| to_py(PoolError::ThreadExited { worker })),
            None => Err(to_py(PoolError::Stopped)),
        }
    }

    /// The first worker that has ended although the pool was not stopped.
    fn exited(&self) -> Option<usize> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.handles)
            .iter()
            .position(|h| h.as_ref().is_some_and(JoinHandle::is_finished))
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // Without a join (a drop must not wait): the workers leave after their current task.
        lock(&self.jobs).clear();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The iterator `iter(DataLoader(..., num_workers>0, worker_type="thread"))` returns.
#[pyclass(module = "rloader._rloader", weakref, dict)]
pub struct ThreadIter {
    pool: Py<ThreadPool>,
    scheduler: Scheduler<Answer>,
    /// None for an iterable-style dataset (every task is "the next batch").
    keys: Option<Keys>,
    auto_collation: bool,
    length_of: Option<Py<PyAny>>,
    len_warning: Option<LengthWarning>,
    timeout: Option<Duration>,
    persistent: bool,
    index_buf: Vec<u64>,
    restarted: usize,
    /// Cleared by the garbage collector: hands out nothing more.
    cleared: bool,
    /// Batches handed out this epoch (as batches or as their errors), and whether it ended:
    /// what `DataLoader.state_dict()` counts as consumed (NOTE [Resume]).
    taken: u64,
    finished: bool,
    /// Which tasks were handed out, by which worker (NOTE [Resume]: exact with in_order=False).
    handouts: Py<HandOuts>,
}

#[pymethods]
impl ThreadIter {
    #[new]
    #[pyo3(signature = (*, pool, in_order, prefetch_factor, keys, auto_collation, timeout,
                        persistent, length_of, reported_len=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pool: Py<ThreadPool>,
        in_order: bool,
        prefetch_factor: usize,
        keys: Option<Bound<'_, PyAny>>,
        auto_collation: bool,
        timeout: f64,
        persistent: bool,
        length_of: Py<PyAny>,
        reported_len: Option<(Py<PyAny>, usize)>,
    ) -> PyResult<Self> {
        let size = pool.get().size;
        Ok(ThreadIter {
            pool,
            scheduler: Scheduler::new(size, prefetch_factor.max(1), in_order),
            keys: keys.map(|k| Keys::new(&k, auto_collation)).transpose()?,
            auto_collation,
            length_of: Some(length_of),
            len_warning: LengthWarning::new(reported_len, true),
            timeout: (timeout > 0.0).then(|| Duration::from_secs_f64(timeout)),
            persistent,
            index_buf: Vec::new(),
            restarted: 0,
            cleared: false,
            taken: 0,
            finished: false,
            handouts: Py::new(py, HandOuts::new(size))?,
        })
    }

    /// What was handed out this epoch (handouts.rs).
    #[getter]
    fn _handouts(&self, py: Python<'_>) -> Py<HandOuts> {
        self.handouts.clone_ref(py)
    }

    /// (batches handed out this epoch, whether the epoch ended); see `taken`.
    #[getter]
    fn _progress(&self) -> (u64, bool) {
        (self.taken, self.finished)
    }

    /// The epoch's first draws, in `iter()` as torch makes them.
    fn _prefill(&mut self, py: Python<'_>) -> PyResult<()> {
        self.send_tasks(py)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Iterators do not pickle: torch's error.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable("ThreadIter"))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.length_of {
            Some(length_of) => length_of.bind(py).len(),
            None => Err(no_length()),
        }
    }

    /// This epoch's `Stats`.
    #[getter]
    fn _stats(&self, py: Python<'_>) -> Py<Stats> {
        self.pool.get().stats.clone_ref(py)
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let stats = self.pool.get().stats.clone_ref(py);
        stats.get().next_called();
        let next = self.next_handed_out(py);
        stats.get().next_returned(matches!(next, Ok(Some(_))));
        next
    }

    /// A new epoch on persistent workers: `keys` is the new `iter(index_sampler)` (None for an
    /// iterable dataset, whose workers make their iterators anew).
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
        // The old epoch's keys go first; answers still owed from it are waited for and dropped.
        self.keys = None;
        let started = Instant::now();
        while self.scheduler.outstanding() > 0 {
            self.scheduler.mark_exhausted();
            if let Next::Wait = self.scheduler.next() {
                self.wait_for_reports(py, started)?;
            }
        }
        self.scheduler.reset();
        self.taken = 0;
        self.finished = false;
        self.pool.get().stats.get().clear();
        self.handouts.borrow_mut(py).reset();
        self.len_warning = LengthWarning::new(reported_len, true);
        let keys = keys
            .map(|k| Keys::new(&k, self.auto_collation))
            .transpose()?;
        if keys.is_none() {
            self.restarted = 0;
            let size = self.pool.get().size;
            for w in 0..size {
                self.pool.get().send(py, w, Job::Restart)?;
            }
            while self.restarted < size {
                self.wait_for_reports(py, started)?;
            }
        }
        self.keys = keys;
        self.send_tasks(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(keys) = &self.keys {
            keys.traverse(&visit)?;
        }
        visit.call(&self.pool)?;
        visit.call(&self.handouts)?;
        visit.call(&self.length_of)?;
        if let Some(warning) = &self.len_warning {
            warning.traverse(&visit)?;
        }
        for answer in self.scheduler.results() {
            answer.traverse(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.keys = None;
        self.length_of = None;
        self.len_warning = None;
        self.cleared = true;
    }
}

impl ThreadIter {
    /// `__next__` without its timing (`Stats`).
    fn next_handed_out<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.cleared || self.pool.get().stopped() && !self.persistent {
            return Ok(None);
        }
        let answer = match self.next_answer(py)? {
            None => {
                self.finished = true;
                if !self.persistent {
                    self.pool.get().stop(py);
                }
                return Ok(None);
            }
            Some(answer) => answer,
        };
        self.taken += 1;
        let (worker, task) = self.scheduler.last_handed_out().unwrap_or_default();
        self.handouts.borrow_mut(py).record(task, worker, None);
        let batch = answer.into_batch(py)?;
        if let Some(warning) = &mut self.len_warning {
            warning.yielded(py)?;
        }
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
                self.pool.get().send(py, worker, Job::Task { task, keys })?;
            }
        }
        Ok(())
    }

    /// Waits (in slices, without the GIL) until at least one report has come, and takes in
    /// every report there is; raises on `timeout` (counted from `started`) or a dead thread.
    fn wait_for_reports(&mut self, py: Python<'_>, started: Instant) -> PyResult<()> {
        let deadline = self.timeout.and_then(|limit| started.checked_add(limit));
        let pool = self.pool.get();
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
            self.take(report);
        }
        Ok(())
    }

    fn take(&mut self, report: Report) {
        match report.done {
            Done::Answer(answer) => self.scheduler.on_result(report.task, answer),
            Done::Ended => self.scheduler.on_worker_ended(report.worker, report.task),
            Done::Restarted => self.restarted += 1,
        }
    }
}
