//! `Stats`: where an epoch's time went, for `DataLoader.stats()`.
//!
//! Each iterator keeps one `Stats` for its epoch and adds to it as it goes: the time the
//! training loop spent inside `next()` (waiting for data) and between calls (its own work),
//! and the loader's stages where they run in this process: fetching from the dataset, collating,
//! taking batches in from worker processes (transport) and pinning. Worker threads add to their
//! iterator's `Stats` from their own threads, hence atomics. Worker processes add their fetch
//! and collate times to their cells in the pool's region (rloader-workers' times.rs), which
//! their iterator's `Stats` reads ([`Stats::read_workers`]).
//!
//! NOTE [Worker CPU]: a thread pool's `Stats` also counts its worker threads' own CPU time
//! (`worker_cpu_s`), which `num_workers="auto"` reads as the pool's CPU use: the process's
//! clock would count the training step's threads and the consumer's with it. Each worker
//! thread reads its own thread's CPU clock (rloader-workers' thread_cpu.rs) around each job it
//! runs (fetch, collate and pin of one batch, with the GIL held or not; its waits for a task,
//! for the GIL or for a core are not CPU time) and adds the difference here once the job is
//! done and before it sends the job's answer ([`Stats::add_worker_cpu`]).
//! - Many writers (the pool's threads), one counter: `fetch_add` with Relaxed ordering. Each
//!   add is one whole job's nanoseconds, so a reader never sees part of a job; the answer's
//!   channel orders the add before the main thread takes that answer, so a reader has every
//!   job it has taken an answer of, and perhaps a few it has not yet (early, never late).
//! - `clear` (a new epoch of persistent workers) stores 0 only once the old epoch's answers
//!   have all come in (`ThreadIter::_reset` waits for them): no job straddles it.
//! - An async dataset's workers run an event loop that takes tasks as they come, whose CPU is
//!   not one job's: their pool has no counter (`worker_cpu_s` is absent), as have the main
//!   process's loop and process pools.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use rloader_queue::ShmRegion;
use rloader_workers::times;

use crate::vision;

/// A stage of the loader, or of the training loop around it.
#[derive(Clone, Copy)]
pub enum Stage {
    Fetch,
    Collate,
    Transport,
    Pin,
    WaitingForData,
    WaitingForUser,
}

const STAGES: [(&str, Stage); 6] = [
    ("fetch", Stage::Fetch),
    ("collate", Stage::Collate),
    ("transport", Stage::Transport),
    ("pin", Stage::Pin),
    ("waiting_for_data", Stage::WaitingForData),
    ("waiting_for_user", Stage::WaitingForUser),
];

#[pyclass(module = "rloader._rloader", frozen)]
#[derive(Default)]
pub struct Stats {
    nanos: [AtomicU64; 6],
    batches: AtomicU64,
    /// Where worker processes add their fetch and collate times (a pool's iterator).
    workers: Mutex<Option<WorkerTimes>>,
    /// When `next()` last returned, and when the current call began.
    handed_out_at: Mutex<Option<Instant>>,
    called_at: Mutex<Option<Instant>>,
    /// A thread pool's worker threads' CPU time, in nanoseconds (NOTE [Worker CPU]); None for
    /// the other iterators.
    worker_cpu: Option<AtomicU64>,
    /// This process's rloader.vision (decode, transform) nanoseconds when the epoch began
    /// (the main process and worker threads decode here: `vision::nanos()`).
    vision_since: Mutex<[u64; 2]>,
}

impl Stats {
    pub fn new() -> Stats {
        let stats = Stats::default();
        *lock(&stats.vision_since) = vision::nanos();
        stats
    }

    /// A thread pool's `Stats`: it counts its worker threads' CPU time (NOTE [Worker CPU]).
    pub fn for_threads() -> Stats {
        Stats {
            worker_cpu: Some(AtomicU64::new(0)),
            ..Stats::new()
        }
    }

    /// A worker thread spent `nanos` of its own CPU time on a job (NOTE [Worker CPU]).
    pub fn add_worker_cpu(&self, nanos: u64) {
        if let Some(cpu) = &self.worker_cpu {
            cpu.fetch_add(nanos, Relaxed);
        }
    }

    pub fn add(&self, stage: Stage, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.nanos[stage as usize].fetch_add(nanos, Relaxed);
    }

    /// Nanoseconds spent in `stage` since the last take, taken out.
    pub fn take(&self, stage: Stage) -> u64 {
        self.nanos[stage as usize].swap(0, Relaxed)
    }

    /// Times `f` as `stage`.
    pub fn time<T>(&self, stage: Stage, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.add(stage, start.elapsed());
        out
    }

    /// `next()` was called: the time since the last batch was the training loop's.
    pub fn next_called(&self) {
        let now = Instant::now();
        if let Some(last) = lock(&self.handed_out_at).take() {
            self.add(Stage::WaitingForUser, now - last);
        }
        *lock(&self.called_at) = Some(now);
    }

    /// `next()` returns (a batch, or its error when `batch` is false, or the end).
    pub fn next_returned(&self, batch: bool) {
        let now = Instant::now();
        if let Some(called) = lock(&self.called_at).take() {
            self.add(Stage::WaitingForData, now - called);
        }
        if batch {
            self.batches.fetch_add(1, Relaxed);
            *lock(&self.handed_out_at) = Some(now);
        }
    }

    /// Fetch and collate times are those worker processes add to the cells at `cells` of
    /// `region` from now on (times.rs).
    pub fn read_workers(&self, region: Arc<ShmRegion>, cells: Vec<usize>) {
        let mut workers = WorkerTimes {
            region,
            cells,
            since: [0; times::COUNTERS],
        };
        workers.since = workers.sums();
        *lock(&self.workers) = Some(workers);
    }

    /// A new epoch on the same iterator (persistent workers).
    pub fn clear(&self) {
        for n in &self.nanos {
            n.store(0, Relaxed);
        }
        if let Some(workers) = lock(&self.workers).as_mut() {
            workers.since = workers.sums();
        }
        if let Some(cpu) = &self.worker_cpu {
            cpu.store(0, Relaxed);
        }
        self.batches.store(0, Relaxed);
        *lock(&self.vision_since) = vision::nanos();
        *lock(&self.handed_out_at) = None;
        *lock(&self.called_at) = None;
    }
}

/// Where worker processes' times are, and their sums when the epoch began.
struct WorkerTimes {
    region: Arc<ShmRegion>,
    cells: Vec<usize>,
    since: [u64; times::COUNTERS],
}

impl WorkerTimes {
    /// Each counter's nanoseconds (times.rs: fetch, collate, decode, transform) over every
    /// worker's cell.
    fn sums(&self) -> [u64; times::COUNTERS] {
        self.cells
            .iter()
            .fold([0; times::COUNTERS], |mut sum, &at| {
                for (s, d) in sum.iter_mut().zip(times::read(&self.region, at)) {
                    *s = s.wrapping_add(d);
                }
                sum
            })
    }

    /// Each counter's nanoseconds since the epoch began.
    fn this_epoch(&self) -> [u64; times::COUNTERS] {
        let mut sums = self.sums();
        for (s, since) in sums.iter_mut().zip(self.since) {
            *s = s.wrapping_sub(since);
        }
        sums
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[pymethods]
impl Stats {
    #[new]
    fn py_new() -> Stats {
        Stats::new()
    }

    /// `{"batches": n, "<stage>_s": seconds, ...}`; fetch and collate include the worker
    /// processes' times; a thread pool's, `worker_cpu_s` (NOTE [Worker CPU]).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        out.set_item("batches", self.batches.load(Relaxed))?;
        let [fetch, collate, decode, transform] = lock(&self.workers)
            .as_ref()
            .map_or([0; times::COUNTERS], WorkerTimes::this_epoch);
        for (name, stage) in STAGES {
            let elsewhere = match stage {
                Stage::Fetch => fetch,
                Stage::Collate => collate,
                _ => 0,
            };
            let nanos = self.nanos[stage as usize].load(Relaxed) + elsewhere;
            out.set_item(format!("{name}_s"), nanos as f64 / 1e9)?;
        }
        // rloader.vision's share of fetch, where its samples were made (here or in workers).
        let here = vision::nanos();
        let since = *lock(&self.vision_since);
        let decode = decode + here[0].wrapping_sub(since[0]);
        let transform = transform + here[1].wrapping_sub(since[1]);
        if decode + transform > 0 {
            out.set_item("decode_s", decode as f64 / 1e9)?;
            out.set_item("transform_s", transform as f64 / 1e9)?;
        }
        if let Some(cpu) = &self.worker_cpu {
            out.set_item("worker_cpu_s", cpu.load(Relaxed) as f64 / 1e9)?;
        }
        Ok(out)
    }

    /// For the Python iterators (`PinnedBatches`): adds `seconds` to `stage`.
    fn add_seconds(&self, stage: &str, seconds: f64) -> PyResult<()> {
        let Some((_, stage)) = STAGES.iter().find(|(name, _)| *name == stage) else {
            return Err(PyValueError::new_err(format!("no stage {stage:?}")));
        };
        self.add(*stage, Duration::from_secs_f64(seconds.max(0.0)));
        Ok(())
    }

    #[pyo3(name = "next_called")]
    fn py_next_called(&self) {
        self.next_called();
    }

    #[pyo3(name = "next_returned")]
    fn py_next_returned(&self, batch: bool) {
        self.next_returned(batch);
    }

    #[pyo3(name = "clear")]
    fn py_clear(&self) {
        self.clear();
    }
}
