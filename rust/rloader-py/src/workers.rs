//! Multi-process loading: the main process's `PoolIter` and each worker's `worker_loop`.
//!
//! One shared-memory region per pool (`PoolRegion`, an anonymous memfd: it never has a name, so
//! nothing is left in /dev/shm whichever process dies) holds a doorbell, per worker two rings
//! (`rloader-queue`: tasks go main → worker, answers worker → main), and per worker its batch
//! slots (NOTE [Slots] in slots.rs). Workers map it through its descriptor. Once a pool's
//! workers are gone, the region serves the same loader's next pool, slots still warm.
//!
//! NOTE [Pool protocol]: every message starts with a 16-byte header (kind: u32, worker: u32,
//! task: u64, little-endian). Main → worker: `TASK_INDICES` (u64 indices), `TASK_OBJECT` (a
//! pickled key or batch of keys; an empty payload for iterable datasets), `RESUME` (a new epoch
//! of persistent workers on an iterable dataset). Worker → main: `DATA` (a pickled batch, see
//! `encode_batch`), `ERROR` (a pickled torch ExceptionWrapper), `ENDED` (the worker's iterable
//! dataset is exhausted; the answer to that task), `RESUMED`. A closed task ring tells a worker
//! to leave once it has answered what is queued. The order of
//! tasks and answers, and who gets the next task, is `rloader_workers::Scheduler`'s business.
//!
//! Workers that are not persistent have their task rings closed as soon as the sampler is
//! exhausted, behind their last tasks: each leaves once it has answered them, and the cost of a
//! process's exit (tearing down the address space it inherited) overlaps the end of the epoch
//! instead of following it. A worker told to stop that has exited is dead only if it still owes
//! an answer once its ring is drained.
//!
//! Waiting never holds the GIL: the main process sleeps on the doorbell (which every worker
//! rings after each answer) in slices of `WAIT_SLICE`, and between slices checks that its
//! workers are alive and that `timeout` has not passed; a worker sleeps on its task ring in the
//! same slices and leaves when its parent is gone.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use pyo3::{PyTraverseError, PyVisit};

use rloader_queue::{Doorbell, QueueError, Ring, ShmRegion};
use rloader_workers::{Next, Scheduler};

use crate::loader::{not_picklable, LengthWarning};

use crate::fetch::{Collate, Fetcher, KeyBatch};
use crate::loader::Keys;
use crate::slots::{self, Arena, Lease, SLOT_SPAN};

/// Ring capacities. A message larger than its ring streams through it in parts (the main
/// process reassembles it), so these bound memory, not batch size. Tensor bytes travel in
/// slots (NOTE [Slots] in slots.rs), and through the answer ring only when no slot is free.
const INDEX_RING: usize = 256 << 10;
const RESULT_RING: usize = 2 << 20;
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// How long the main process waits to send a worker a control message (RESUME, into a task
/// ring every task of the last epoch has left) before declaring the worker stuck.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
const HEADER: usize = 16;

mod kind {
    pub const TASK_INDICES: u32 = 1;
    pub const TASK_OBJECT: u32 = 2;
    pub const RESUME: u32 = 3;
    pub const DATA: u32 = 11;
    pub const ERROR: u32 = 12;
    pub const ENDED: u32 = 13;
    pub const RESUMED: u32 = 14;
}

fn header(kind: u32, worker: usize, task: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[4..8].copy_from_slice(&(worker as u32).to_le_bytes());
    h[8..16].copy_from_slice(&task.to_le_bytes());
    h
}

fn parse_header(msg: &[u8]) -> PyResult<(u32, usize, u64)> {
    if msg.len() < HEADER {
        return Err(PyRuntimeError::new_err(
            "rloader: a worker message is shorter than its header",
        ));
    }
    let kind = u32::from_le_bytes(msg[0..4].try_into().expect("4 bytes"));
    let worker = u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes")) as usize;
    let task = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes"));
    Ok((kind, worker, task))
}

pub fn queue_err(e: QueueError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// The doorbell sits at offset 0; the slots' metadata (state word and high-water mark, NOTE
/// [Slots]) after it.
const STATES_AT: usize = 64;
/// Slots start at a multiple of this (huge-page friendly).
const SLOTS_ALIGN: usize = 2 << 20;

/// Where each piece lives in a pool's region: the doorbell, the slots' metadata, each
/// worker's rings (all reserved up front: `committed` bytes), then each worker's slots (reserved
/// as they are used).
struct Layout {
    len: usize,
    committed: usize,
    /// Per worker, (offset, length) of its task ring and of its answer ring.
    rings: Vec<[(usize, usize); 2]>,
    slots_per_worker: usize,
    states_at: usize,
    slots_at: usize,
}

fn align(x: usize) -> usize {
    x.div_ceil(64) * 64
}

impl Layout {
    fn new(num_workers: usize, prefetch_factor: usize) -> Layout {
        let slots_per_worker = slots::slots_per_worker(prefetch_factor);
        let states_at = STATES_AT;
        let mut at = align(states_at + slots::SLOT_META_BYTES * num_workers * slots_per_worker);
        let mut rings = Vec::with_capacity(num_workers);
        for _ in 0..num_workers {
            let spans = [INDEX_RING, RESULT_RING].map(|capacity| {
                let span = (at, Ring::required_len(capacity));
                at = align(at + span.1);
                span
            });
            rings.push(spans);
        }
        let committed = at;
        let slots_at = at.div_ceil(SLOTS_ALIGN) * SLOTS_ALIGN;
        Layout {
            len: slots_at + num_workers * slots_per_worker * SLOT_SPAN,
            committed,
            rings,
            slots_per_worker,
            states_at,
            slots_at,
        }
    }

    /// The offsets of worker `w`'s slot `s` and of its state word.
    fn slot(&self, w: usize, s: usize) -> (usize, usize) {
        let i = w * self.slots_per_worker + s;
        (
            self.slots_at + i * SLOT_SPAN,
            self.states_at + slots::SLOT_META_BYTES * i,
        )
    }

    fn arena(&self, region: Arc<ShmRegion>, w: usize) -> Arena {
        let (slots_at, states_at) = self.slot(w, 0);
        Arena::new(region, states_at, slots_at, self.slots_per_worker)
    }
}

/// The shared memory of a loader's worker pools: an anonymous region (memfd), so nothing is ever
/// left in /dev/shm and /dev/shm's size does not limit it. Workers get its descriptor (inherited
/// under fork, passed by multiprocessing otherwise). When a pool is done and its workers are
/// gone, the region serves the loader's next pool: its slots are warm (reserved and mapped),
/// which is most of what a new epoch would otherwise spend.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct PoolRegion {
    shm: Arc<ShmRegion>,
    layout: Layout,
    num_workers: usize,
    prefetch_factor: usize,
}

#[pymethods]
impl PoolRegion {
    #[new]
    fn new(num_workers: usize, prefetch_factor: usize) -> PyResult<Self> {
        if num_workers == 0 {
            return Err(PyTypeError::new_err("a worker pool needs num_workers > 0"));
        }
        let layout = Layout::new(num_workers, prefetch_factor);
        let shm =
            ShmRegion::create_anonymous("rloader DataLoader workers", layout.len, layout.committed)
                .map_err(queue_err)?;
        Ok(PoolRegion {
            shm: Arc::new(shm),
            layout,
            num_workers,
            prefetch_factor,
        })
    }

    /// Closes the task and answer rings of the pool using the region, so that its workers
    /// leave: how every pool is stopped (`_Pool.shutdown`, whether the iterator ended, was
    /// dropped, or outlived by a finalizer at interpreter exit).
    fn _close_rings(&self) -> PyResult<()> {
        for spans in &self.layout.rings {
            for &(at, len) in spans {
                Ring::attach(self.shm.clone(), at, len)
                    .map_err(queue_err)?
                    .close();
            }
        }
        Ok(())
    }

    /// The descriptor workers map the region through.
    #[getter]
    fn fd(&self) -> i32 {
        self.shm.fd()
    }

    /// Whether a pool of this shape can use the region.
    fn fits(&self, num_workers: usize, prefetch_factor: usize) -> bool {
        self.num_workers == num_workers && self.prefetch_factor == prefetch_factor
    }
}

impl PoolRegion {
    /// Readies the region for a new pool (the workers of any previous one are gone): fresh
    /// rings and doorbell, and every slot free except those whose batches the user still holds.
    fn prepare(&self) -> PyResult<(Doorbell, Vec<Ring>, Vec<Ring>)> {
        let shm = &self.shm;
        let doorbell = Doorbell::init(shm.clone(), 0);
        let mut to_workers = Vec::with_capacity(self.num_workers);
        let mut from_workers = Vec::with_capacity(self.num_workers);
        for &[(task_at, task_len), (answer_at, answer_len)] in &self.layout.rings {
            to_workers.push(Ring::init(shm.clone(), task_at, task_len).map_err(queue_err)?);
            from_workers.push(Ring::init(shm.clone(), answer_at, answer_len).map_err(queue_err)?);
        }
        for w in 0..self.num_workers {
            for s in 0..self.layout.slots_per_worker {
                slots::reset_unleased(shm, self.layout.slot(w, s).1);
            }
        }
        Ok((doorbell, to_workers, from_workers))
    }
}

/// A received message, exported through the buffer protocol so a batch's tensors can be
/// built over it without another copy (they keep it alive).
#[pyclass(module = "rloader._rloader")]
pub struct Message {
    data: Vec<u8>,
}

#[pymethods]
impl Message {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let (addr, len) = {
            let me = slf.borrow();
            (me.data.as_ptr() as usize, me.data.len())
        };
        // SAFETY: `data` is never changed after construction, and the view holds a reference
        // to `slf`, so the bytes outlive every export.
        unsafe { slots::export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// Where a pool's tasks get their keys.
enum Source {
    /// Drawn from the sampler by whichever thread sends tasks.
    Keys(Keys),
    /// Drawn by another thread beforehand (NOTE [Key feed]).
    Fed(Arc<FedKeys>),
}

impl Source {
    fn new(keys: &Bound<'_, PyAny>, auto_collation: bool) -> PyResult<Source> {
        Ok(match keys.cast::<KeyFeed>() {
            Ok(feed) => Source::Fed(feed.borrow().queue.clone()),
            Err(_) => Source::Keys(Keys::new(keys, auto_collation)?),
        })
    }
}

/// One batch of keys a [`KeyFeed`] has drawn, ready to send, or the sampler's end.
enum Fed {
    /// "The next batch", for an iterable dataset's workers.
    Next,
    Indices(Vec<u64>),
    /// Keys that are not integers, pickled on the drawing thread.
    Object(Vec<u8>),
    End,
}

/// NOTE [Key feed]: when batches are pinned, a thread of its own (`rloader_pin_memory`) polls
/// the PoolIter for them, and so sends the tasks; but torch advances the sampler on the main
/// thread, which matters to samplers that draw from torch's global RNG while the training loop
/// does too. So the main thread draws each batch of keys into a KeyFeed, and the PoolIter, on
/// the pin thread, takes them from there. The main thread keeps torch's account
/// (`PinnedBatches` in _pin.py): it draws `prefetch_factor * num_workers` batches of keys in
/// `iter()`, then one for each item it takes that answers a task (a batch or a worker's
/// error), and when it finds nothing in flight it ends the feed, as torch ends the epoch there
/// (after a sampler error, say). So the pin thread never waits for keys that will not come:
/// while the main thread has keys in flight, either they are queued here or their tasks are
/// outstanding; once it has none, the feed has ended. An iterable dataset has no sampler, but
/// the same account: its feed holds "next batch" tokens, so its workers run as far ahead as
/// torch's (one more token, for the worker whose dataset ended, is the PoolIter's own, as torch
/// puts one more index on receiving the end). Keys are pickled as they are drawn, so
/// that a key that cannot be pickled fails the draw, on the main thread, and never becomes a
/// task nobody answers.
///
/// The queue ([`FedKeys`]) is behind a mutex held only to push or pop, never across a Python
/// call, and holds no Python object: the pin thread, whose frame keeps its PoolIter alive,
/// reaches nothing of the user's through it (the KeyFeed, which holds the sampler, belongs to
/// the main thread's `PinnedBatches`, and the garbage collector sees through it). Each draw
/// rings the main process's doorbell, on which a pin thread waiting for answers sleeps, so
/// that it sends the new task at once. The PoolIter that takes keys from a feed has no
/// `timeout`: the main thread times its own wait for the pin thread, as torch does.
#[pyclass(module = "rloader._rloader")]
pub struct KeyFeed {
    /// The sampler's iterator; None for a feed of tokens, or once cleared by the garbage
    /// collector.
    keys: Option<Keys>,
    /// Pickles keys that are not integers.
    dump_keys: Option<Py<PyAny>>,
    queue: Arc<FedKeys>,
    doorbell: Doorbell,
}

/// The keys a [`KeyFeed`] has drawn and a PoolIter has not taken yet.
#[derive(Default)]
pub struct FedKeys {
    drawn: std::sync::Mutex<VecDeque<Fed>>,
    ended: std::sync::atomic::AtomicBool,
    /// Tokens for an iterable dataset, not keys.
    tokens: bool,
}

#[pymethods]
impl KeyFeed {
    #[new]
    fn new(
        region: &Bound<'_, PoolRegion>,
        keys: Option<&Bound<'_, PyAny>>,
        auto_collation: bool,
        dump_keys: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(KeyFeed {
            keys: keys.map(|k| Keys::new(k, auto_collation)).transpose()?,
            dump_keys: Some(dump_keys),
            queue: Arc::new(FedKeys {
                tokens: keys.is_none(),
                ..Default::default()
            }),
            doorbell: Doorbell::attach(region.get().shm.clone(), 0),
        })
    }

    /// Draws up to `n` batches of keys from the sampler, on the calling thread, and returns how
    /// many it drew; at the sampler's end, the feed ends (and draws nothing more).
    fn draw(&mut self, py: Python<'_>, n: usize) -> PyResult<usize> {
        let mut buf = Vec::new();
        let mut drawn = 0;
        let result = (|| {
            while drawn < n && !self.queue.ended.load(Relaxed) {
                let Some(keys) = &self.keys else {
                    if self.queue.tokens {
                        self.queue.push(Fed::Next);
                        drawn += 1;
                        continue;
                    }
                    self.end();
                    break;
                };
                match keys.next(py, &mut buf)? {
                    None => self.end(),
                    Some(KeyBatch::Indices(ix)) => self.queue.push(Fed::Indices(ix)),
                    Some(KeyBatch::Object(obj)) => {
                        let Some(dump_keys) = &self.dump_keys else {
                            self.end();
                            break;
                        };
                        let data = dump_keys.bind(py).call1((obj,))?;
                        let bytes = data.cast::<PyBytes>()?.as_bytes().to_vec();
                        self.queue.push(Fed::Object(bytes));
                    }
                }
                drawn += usize::from(!self.queue.ended.load(Relaxed));
            }
            Ok(drawn)
        })();
        self.doorbell.ring(); // the keys drawn before an error are sent all the same
        result
    }

    /// Ends the feed, if it has not ended: the PoolIter sends no task after the keys queued.
    fn end(&self) {
        if !self.queue.ended.swap(true, Relaxed) {
            self.queue.push(Fed::End);
            self.doorbell.ring();
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(keys) = &self.keys {
            keys.traverse(&visit)?;
        }
        visit.call(&self.dump_keys)
    }

    fn __clear__(&mut self) {
        self.keys = None;
        self.dump_keys = None;
        self.end(); // a cleared sampler draws nothing more (tokens included)
    }
}

impl PoolIter {
    /// Whether the main thread has drawn keys that could be sent now.
    fn can_send_fed_keys(&self) -> bool {
        match &self.keys {
            Some(Source::Fed(queue)) => {
                self.nothing_unsent()
                    && !self.scheduler.is_exhausted()
                    && self.scheduler.can_assign()
                    && queue.has_drawn()
            }
            _ => false,
        }
    }
}

impl FedKeys {
    fn push(&self, item: Fed) {
        self.lock().push_back(item);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Fed>> {
        self.drawn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next drawn batch of keys; None if the main thread has not drawn it yet.
    fn take(&self) -> Option<Fed> {
        self.lock().pop_front()
    }

    fn has_drawn(&self) -> bool {
        !self.lock().is_empty()
    }
}

/// What a worker answered to one task.
enum Answer {
    Batch(Py<PyAny>),
    /// A worker's exception (an ExceptionWrapper, re-raised when handed out).
    Error(Py<PyAny>),
    /// The answer could not be taken in (unpickling the batch failed, say): the task's result
    /// is that error, raised in its turn, so no task is left unanswered.
    Failed(PyErr),
}

/// The iterator `iter(DataLoader(..., num_workers>0))` returns.
#[pyclass(module = "rloader._rloader", weakref, dict)]
pub struct PoolIter {
    pool_region: Py<PoolRegion>,
    doorbell: Doorbell,
    to_workers: Vec<Ring>,
    from_workers: Vec<Ring>,
    scheduler: Scheduler<Answer>,
    /// None for an iterable-style dataset (every task is "the next batch").
    keys: Option<Source>,
    auto_collation: bool,
    /// The Python side (`rloader._workers._Pool`): unpickling, liveness, stopping processes.
    hooks: Py<PyAny>,
    pin: Option<Py<PyAny>>,
    /// What `len()` measures (None for the pin thread's PoolIter: `PinnedBatches` answers it).
    length_of: Option<Py<PyAny>>,
    /// For an iterable dataset whose `len(loader)` was asked: warns when it is exceeded.
    len_warning: Option<LengthWarning>,
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
}

#[pymethods]
impl PoolIter {
    #[new]
    #[pyo3(signature = (*, region, in_order, keys, auto_collation, timeout, persistent, pin,
                        length_of, hooks, reported_len=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        region: Py<PoolRegion>,
        in_order: bool,
        keys: Option<Bound<'_, PyAny>>,
        auto_collation: bool,
        timeout: f64,
        persistent: bool,
        pin: Option<Py<PyAny>>,
        length_of: Option<Py<PyAny>>,
        hooks: Py<PyAny>,
        reported_len: Option<(Py<PyAny>, usize)>,
    ) -> PyResult<Self> {
        let pr = region.get();
        let (doorbell, to_workers, from_workers) = pr.prepare()?;
        let (num_workers, prefetch_factor) = (pr.num_workers, pr.prefetch_factor);
        let keys = match keys {
            Some(k) => Some(Source::new(&k, auto_collation)?),
            None => None,
        };
        Ok(PoolIter {
            pool_region: region,
            doorbell,
            to_workers,
            from_workers,
            scheduler: Scheduler::new(num_workers, prefetch_factor.max(1), in_order),
            keys,
            auto_collation,
            hooks,
            pin,
            length_of,
            len_warning: LengthWarning::new(reported_len, true),
            timeout: (timeout > 0.0).then(|| Duration::from_secs_f64(timeout)),
            persistent,
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
        })
    }

    /// (tensor buffers received in shared-memory slots, received inline and copied).
    #[getter]
    fn _transport_counts(&self) -> (u64, u64) {
        (self.buffers_in_slots, self.buffers_inline)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Iterators do not pickle: torch's error.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable("PoolIter"))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.length_of {
            Some(length_of) => length_of.bind(py).len(),
            None => Err(PyTypeError::new_err("this iterator has no length")),
        }
    }

    fn __next__<'py>(mut slf: PyRefMut<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        let polled = match slf.next_batch(py, Instant::now(), None) {
            Ok(polled) => polled,
            Err(err) => {
                // torch raises from Python frames that hold its iterator, so the workers
                // outlive the exception and are stopped after the user has seen it (a stuck
                // one is waited for for seconds). The exception holds this iterator likewise.
                let this: Py<PoolIter> = slf.into();
                let _ = err.value(py).setattr("_rloader_iterator", this);
                return Err(err);
            }
        };
        match polled {
            Polled::Batch(batch) => {
                let batch = match &slf.pin {
                    Some(pin) => pin.bind(py).call1((batch,))?,
                    None => batch,
                };
                if let Some(warning) = &mut slf.len_warning {
                    warning.yielded(py)?;
                }
                Ok(Some(batch))
            }
            Polled::Failed(err) => Err(err),
            Polled::Done | Polled::NotYet => Ok(None),
        }
    }

    /// `__next__` for a thread that must notice when to stop (the pin_memory thread): waits at
    /// most `wait` seconds and returns `("batch", batch)`, `("error", exception)` for a
    /// worker's error (which, like a batch, answers a task), or `("none", None)` if nothing
    /// came in time; StopIteration at the end, and any other error (a dead worker, a timeout)
    /// is raised. `timeout` counts from the first call of a wait.
    fn _poll<'py>(&mut self, py: Python<'py>, wait: f64) -> PyResult<(&'static str, Py<PyAny>)> {
        let now = Instant::now();
        let started = *self.waiting_since.get_or_insert(now);
        let until = now + Duration::from_secs_f64(wait.max(0.0));
        let polled = self.next_batch(py, started, Some(until));
        if !matches!(polled, Ok(Polled::NotYet)) {
            self.waiting_since = None; // the wait is over, one way or another
        }
        match polled? {
            Polled::Batch(batch) => Ok(("batch", batch.unbind())),
            Polled::Failed(err) => Ok(("error", err.into_value(py).into_any())),
            Polled::Done => Err(PyStopIteration::new_err(())),
            Polled::NotYet => Ok(("none", py.None())),
        }
    }

    /// A new epoch on persistent workers: `keys` is the new `iter(index_sampler)` (None for an
    /// iterable dataset, whose workers restart their iterators).
    #[pyo3(signature = (keys, reported_len=None))]
    fn _reset(
        &mut self,
        py: Python<'_>,
        keys: Option<Bound<'_, PyAny>>,
        reported_len: Option<(Py<PyAny>, usize)>,
    ) -> PyResult<()> {
        if self.stopped {
            return Err(PyRuntimeError::new_err(
                "this DataLoader's workers were stopped (after an error or a shutdown)",
            ));
        }
        // The old epoch's keys go first: nothing more is drawn or taken from them (a feed's
        // leftovers must not look like work to do while the old answers are drained).
        self.keys = None;
        // Answers still owed from an abandoned epoch are drained and dropped (tasks not sent
        // yet are sent while waiting, so that their answers come too).
        let started = Instant::now();
        while self.scheduler.outstanding() > 0 {
            self.scheduler.mark_exhausted();
            match self.scheduler.next() {
                Next::Wait => {
                    self.wait_for_answer(py, started, None)?;
                }
                _ => continue,
            }
        }
        self.scheduler.reset();
        self.len_warning = LengthWarning::new(reported_len, true);
        self.waiting_since = None;
        self.end_tokens = 0;
        let source = keys
            .map(|k| Source::new(&k, self.auto_collation))
            .transpose()?;
        let iterable = match &source {
            None => true,
            Some(Source::Fed(queue)) => queue.tokens,
            Some(Source::Keys(_)) => false,
        };
        if iterable {
            // The workers restart their datasets' iterators.
            self.resumed = 0;
            for w in 0..self.to_workers.len() {
                self.send(py, w, &header(kind::RESUME, w, 0), &[])?;
            }
            while self.resumed < self.to_workers.len() {
                self.wait_for_answer(py, started, None)?;
            }
        }
        self.keys = source;
        // The epoch's first draws, in iter() as torch makes them.
        self.send_tasks(py)
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
        if let Some(Source::Keys(keys)) = &self.keys {
            keys.traverse(&visit)?;
        }
        visit.call(&self.pool_region)?;
        visit.call(&self.hooks)?;
        visit.call(&self.pin)?;
        visit.call(&self.length_of)?;
        if let Some(warning) = &self.len_warning {
            warning.traverse(&visit)?;
        }
        for answer in self.scheduler.results() {
            match answer {
                Answer::Batch(obj) | Answer::Error(obj) => visit.call(obj)?,
                Answer::Failed(_) => {}
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        if let Some(Source::Keys(_)) = self.keys {
            self.keys = None;
        }
        self.pin = None;
        self.length_of = None;
        self.len_warning = None;
        // Nothing more is sent or handed out (its finalizer still stops the workers).
        self.stopped = true;
    }
}

/// What `PoolIter::next_batch` found.
enum Polled<'py> {
    Batch(Bound<'py, PyAny>),
    /// A worker's error, in answer to its task.
    Failed(PyErr),
    Done,
    /// Nothing arrived before the deadline.
    NotYet,
}

impl PoolIter {
    /// The next batch, unpinned; waits until `until` at most (`None`: as long as it takes, up
    /// to `timeout` counted from `started`).
    fn next_batch<'py>(
        &mut self,
        py: Python<'py>,
        started: Instant,
        until: Option<Instant>,
    ) -> PyResult<Polled<'py>> {
        if self.stopped {
            return Ok(Polled::Done);
        }
        loop {
            self.send_tasks(py)?;
            let next = self.scheduler.next();
            if let Next::Ready(_) = next {
                // torch's _process_data: the draw this hand-out owes is made before the result
                // is handed out, and a sampler's error is raised instead of it.
                self.send_tasks(py)?;
            }
            match next {
                Next::Ready(Answer::Batch(batch)) => {
                    return Ok(Polled::Batch(batch.into_bound(py)))
                }
                Next::Ready(Answer::Error(wrapper)) => {
                    let err = match wrapper.bind(py).call_method0("reraise") {
                        Err(err) => err,
                        Ok(_) => PyRuntimeError::new_err("a worker's error did not re-raise"),
                    };
                    return Ok(Polled::Failed(err));
                }
                Next::Ready(Answer::Failed(err)) => return Ok(Polled::Failed(err)),
                Next::Done => {
                    if !self.persistent {
                        self.shutdown(py)?;
                    }
                    return Ok(Polled::Done);
                }
                Next::Wait => {
                    if !self.wait_for_answer(py, started, until)? {
                        return Ok(Polled::NotYet);
                    }
                }
            }
        }
    }

    /// Draws the tasks owed (the Scheduler keeps torch's account), or takes those a KeyFeed
    /// holds, and sends what can be sent without waiting on a busy worker.
    fn send_tasks(&mut self, py: Python<'_>) -> PyResult<()> {
        self.draw_tasks(py)?;
        self.flush_unsent(py, true)
    }

    /// Draws the tasks owed (or takes the fed ones) and assigns each to its worker's `unsent`
    /// queue.
    fn draw_tasks(&mut self, py: Python<'_>) -> PyResult<()> {
        let fed = matches!(self.keys, Some(Source::Fed(_)));
        // Fed keys were drawn on the main thread, which keeps the account (NOTE [Key feed]).
        while if fed {
            self.scheduler.can_assign() || self.tokens_waiting()
        } else {
            self.scheduler.draws_owed() > 0
        } {
            if !fed {
                self.scheduler.spend_draw(); // even if the draw fails, as torch's _try_put_index
            }
            let payload: Option<(u32, Vec<u8>)> = match &self.keys {
                None => Some((kind::TASK_OBJECT, Vec::new())),
                Some(Source::Fed(queue)) => match queue.take() {
                    None if self.end_tokens > 0 => {
                        self.end_tokens -= 1;
                        Some((kind::TASK_OBJECT, Vec::new()))
                    }
                    None => break, // the main thread has not drawn the next keys yet
                    Some(Fed::Next) => Some((kind::TASK_OBJECT, Vec::new())),
                    Some(Fed::End) => None,
                    Some(Fed::Indices(ix)) => Some((kind::TASK_INDICES, index_bytes(&ix))),
                    Some(Fed::Object(bytes)) => Some((kind::TASK_OBJECT, bytes)),
                },
                Some(Source::Keys(keys)) => match keys.next(py, &mut self.index_buf)? {
                    None => None,
                    Some(KeyBatch::Indices(ix)) => {
                        let bytes = index_bytes(&ix);
                        self.index_buf = ix;
                        Some((kind::TASK_INDICES, bytes))
                    }
                    Some(KeyBatch::Object(obj)) => {
                        let data = self.hooks.bind(py).call_method1("dump_keys", (obj,))?;
                        Some((
                            kind::TASK_OBJECT,
                            data.cast::<PyBytes>()?.as_bytes().to_vec(),
                        ))
                    }
                },
            };
            let Some((k, bytes)) = payload else {
                self.scheduler.mark_exhausted();
                break;
            };
            // No worker may take it (iterable datasets out of order): dropped, as torch drops it.
            // (Map-style keys always find a worker: see Scheduler::assign.)
            if let Some((worker, task)) = self.scheduler.assign() {
                self.unsent[worker].push_back((header(k, worker, task), bytes));
            }
        }
        Ok(())
    }

    /// A token feed holds tokens (or the PoolIter owes one) that no worker may take now: torch
    /// drops such a task when it would put it; so do we, as it would be placed.
    fn tokens_waiting(&self) -> bool {
        match &self.keys {
            Some(Source::Fed(queue)) if queue.tokens => self.end_tokens > 0 || queue.has_drawn(),
            _ => false,
        }
    }

    fn nothing_unsent(&self) -> bool {
        self.unsent.iter().all(VecDeque::is_empty)
    }

    /// NOTE [Unsent]: tasks wait in their worker's `unsent` queue until its task ring has room
    /// for them, and the main thread never waits for that room: it goes back to taking in
    /// answers (a worker may itself be waiting for the main thread to take in a large answer)
    /// and tries again after each one and each wait slice. A healthy worker that spends long on
    /// one batch (or a spawned worker slow to start) is therefore never "stuck", a dead one is
    /// noticed by the usual liveness checks, and no assigned task is lost to a failed send. A
    /// task that fits in the ring goes all or nothing; one larger than the whole ring streams
    /// through it, as much at a time as there is room for (`Ring::send_partial` keeps its
    /// place), so a busy worker finds the first part when it is done while the rest waits
    /// here; to a worker that is reading it (owing nothing else), it goes on slice by slice,
    /// with the worker's liveness and Ctrl-C checked between slices (not before the workers are
    /// started: `_prefill` never waits). Once the sampler is
    /// exhausted and every task is in its ring, non-persistent workers are told to stop.
    fn flush_unsent(&mut self, py: Python<'_>, workers_started: bool) -> PyResult<()> {
        for w in 0..self.unsent.len() {
            while let Some((head, body)) = self.unsent[w].pop_front() {
                let ring = &self.to_workers[w];
                // A worker owing nothing but what waits here is reading its ring (or starting):
                // a streamed task goes on to it slice by slice, its liveness checked between.
                let streamed = Ring::frame_len(HEADER + body.len()) > ring.capacity();
                let reading = workers_started
                    && streamed
                    && self.scheduler.unanswered(w) == self.unsent[w].len() + 1;
                let wait = if reading { WAIT_SLICE } else { Duration::ZERO };
                let sent = py.detach(|| ring.send_partial(&[&head, &body], Some(wait)));
                match sent {
                    Ok(true) => continue,
                    Ok(false) if reading => {
                        self.unsent[w].push_front((head, body));
                        py.check_signals()?;
                        self.check_workers(py)?;
                    }
                    Ok(false) | Err(QueueError::Timeout) => {
                        self.unsent[w].push_front((head, body)); // no more room for now
                        break;
                    }
                    Err(e) => return Err(queue_err(e)),
                }
            }
        }
        if self.nothing_unsent()
            && self.scheduler.is_exhausted()
            && !self.persistent
            && !self.told_to_stop
        {
            // Closing a task ring never waits (a STOP message might, behind large tasks): the
            // worker takes what is queued, then finds the ring closed and leaves.
            for ring in &self.to_workers {
                ring.close();
            }
            self.told_to_stop = true;
        }
        Ok(())
    }

    fn send(&self, py: Python<'_>, worker: usize, head: &[u8], body: &[u8]) -> PyResult<()> {
        let ring = &self.to_workers[worker];
        py.detach(|| ring.send(&[head, body], Some(SEND_TIMEOUT)))
            .map_err(|e| match e {
                QueueError::Timeout => PyRuntimeError::new_err(format!(
                    "DataLoader worker {worker} took no task for {} s: it is stuck",
                    SEND_TIMEOUT.as_secs()
                )),
                other => queue_err(other),
            })
    }

    /// Blocks until at least one answer has been taken in, checking workers between slices.
    fn wait_for_answer(
        &mut self,
        py: Python<'_>,
        started: Instant,
        until: Option<Instant>,
    ) -> PyResult<bool> {
        loop {
            let seen = self.doorbell.current();
            let mut got = false;
            for w in 0..self.from_workers.len() {
                got |= self.drain(py, w)?;
            }
            self.flush_unsent(py, true)?;
            if got || self.can_send_fed_keys() {
                return Ok(true);
            }
            let mut slice = WAIT_SLICE;
            if let Some(limit) = self.timeout {
                let spent = started.elapsed();
                if spent >= limit {
                    return Err(PyRuntimeError::new_err(format!(
                        "DataLoader timed out after {} seconds",
                        limit.as_secs_f64()
                    )));
                }
                slice = slice.min(limit - spent);
            }
            if let Some(until) = until {
                let now = Instant::now();
                if now >= until {
                    return Ok(false);
                }
                slice = slice.min(until - now);
            }
            let bell = &self.doorbell;
            let rang = py.detach(|| bell.wait(seen, slice));
            if !rang {
                py.check_signals()?;
                if self.check_workers(py)? {
                    return Ok(true);
                }
            }
        }
    }

    /// Takes in every whole answer waiting from worker `w`; true if there was one.
    fn drain(&mut self, py: Python<'_>, w: usize) -> PyResult<bool> {
        let mut got = false;
        while self.from_workers[w]
            .try_recv(&mut self.inbox[w])
            .map_err(queue_err)?
        {
            let msg = std::mem::take(&mut self.inbox[w]);
            self.take_answer(py, w, msg)?;
            got = true;
        }
        Ok(got)
    }

    /// Raises (after stopping the pool) if a worker process has ended before its time; true
    /// if an ended worker's last answers were taken in.
    fn check_workers(&mut self, py: Python<'_>) -> PyResult<bool> {
        let exited: Vec<(usize, i32)> = self.hooks.bind(py).call_method0("exited")?.extract()?;
        let mut got = false;
        for (w, code) in exited {
            // It can write nothing more: what it sent is all there will be.
            got |= self.drain(py, w)?;
            if self.told_to_stop && !self.scheduler.owes(w) {
                // It left as told with every answer in; an exit code other than 0 (a crash in
                // interpreter teardown, say) costs nothing, and torch would not notice it.
                continue;
            }
            let dead = self.hooks.bind(py).call_method1("death", (w, code))?;
            self.shutdown(py)?;
            return Err(PyErr::from_value(dead));
        }
        Ok(got)
    }

    fn take_answer(&mut self, py: Python<'_>, worker: usize, msg: Vec<u8>) -> PyResult<()> {
        let (k, _, task) = parse_header(&msg)?;
        match k {
            kind::DATA => {
                let pool = self.pool_region.get();
                let table = decode_batch_table(&msg)?;
                let in_slots = table.buffers.iter().filter(|b| b.0).count() as u64;
                self.buffers_in_slots += in_slots;
                self.buffers_inline += table.buffers.len() as u64 - in_slots;
                let lease = match table.slot {
                    None => None,
                    Some(s) if s < pool.layout.slots_per_worker => {
                        let (slot_at, state_at) = pool.layout.slot(worker, s);
                        let lease = Lease::new(pool.shm.clone(), state_at, slot_at, table.in_slot)?;
                        Some(Py::new(py, lease)?)
                    }
                    Some(s) => {
                        return Err(PyRuntimeError::new_err(format!(
                            "rloader: worker {worker} named slot {s}, which it does not have"
                        )))
                    }
                };
                let message = Py::new(py, Message { data: msg })?;
                let batch = self
                    .hooks
                    .bind(py)
                    .call_method1("loads", (message, lease, table.pickle, table.buffers));
                let answer = match batch {
                    Ok(batch) => Answer::Batch(batch.unbind()),
                    Err(err) => Answer::Failed(err),
                };
                self.scheduler.on_result(task, answer);
            }
            kind::ERROR => {
                let wrapper = self
                    .hooks
                    .bind(py)
                    .call_method1("load_error", (PyBytes::new(py, &msg[HEADER..]),));
                let answer = match wrapper {
                    Ok(wrapper) => Answer::Error(wrapper.unbind()),
                    Err(err) => Answer::Failed(err),
                };
                self.scheduler.on_result(task, answer);
            }
            kind::ENDED => {
                self.scheduler.on_worker_ended(worker, task);
                if matches!(self.keys, Some(Source::Fed(_))) {
                    self.end_tokens += 1; // NOTE [Key feed]: this one is the PoolIter's
                }
            }
            kind::RESUMED => self.resumed += 1,
            other => {
                return Err(PyRuntimeError::new_err(format!(
                    "rloader: unexpected message kind {other} from worker {worker}"
                )))
            }
        }
        Ok(())
    }

    fn shutdown(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        // `_Pool.shutdown` closes the rings (so the workers leave), then joins the workers.
        self.hooks.bind(py).call_method0("shutdown")?;
        Ok(())
    }
}

/// A batch of indices as a task's body: little-endian u64s.
fn index_bytes(ix: &[u64]) -> Vec<u8> {
    ix.iter().flat_map(|i| i.to_le_bytes()).collect()
}

/// Marks "none" in a DATA table: no slot, or a buffer that is not in the slot.
const NOWHERE: u64 = u64::MAX;

/// DATA layout after the header: n_buffers u64, pickle_len u64, slot u64 (or NOWHERE), then per
/// buffer its len u64 and its offset in the slot u64 (NOWHERE: inline), then the pickle, then
/// the inline buffers back to back.
struct BatchTable {
    pickle: (usize, usize),
    slot: Option<usize>,
    /// Per buffer: (in the slot?, start, end), in the slot or in the message.
    buffers: Vec<(bool, usize, usize)>,
    /// The bytes of the slot the buffers use.
    in_slot: usize,
}

fn decode_batch_table(msg: &[u8]) -> PyResult<BatchTable> {
    let truncated = || PyRuntimeError::new_err("rloader: truncated batch message");
    let word = |at: usize| -> PyResult<u64> {
        msg.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(truncated)
    };
    let n = word(HEADER)? as usize;
    let pickle_len = word(HEADER + 8)? as usize;
    let slot = word(HEADER + 16)?;
    let entries = HEADER + 24;
    let mut at = n
        .checked_mul(16)
        .and_then(|b| b.checked_add(entries))
        .ok_or_else(truncated)?;
    let pickle = (at, at.saturating_add(pickle_len));
    at = pickle.1;
    let mut buffers = Vec::with_capacity(n.min(1 << 16));
    let mut in_slot = 0;
    for i in 0..n {
        let len = word(entries + 16 * i)? as usize;
        let offset = word(entries + 16 * i + 8)?;
        if offset == NOWHERE {
            buffers.push((false, at, at.saturating_add(len)));
            at = at.saturating_add(len);
        } else {
            let (a, b) = (offset as usize, (offset as usize).saturating_add(len));
            if slot == NOWHERE || b > SLOT_SPAN {
                return Err(PyRuntimeError::new_err(
                    "rloader: a batch names bytes outside its slot",
                ));
            }
            in_slot = in_slot.max(b);
            buffers.push((true, a, b));
        }
    }
    if at > msg.len() {
        return Err(truncated());
    }
    Ok(BatchTable {
        pickle,
        slot: (slot != NOWHERE).then_some(slot as usize),
        buffers,
        in_slot,
    })
}

/// A worker process's loop: take tasks, fetch and collate, send answers, until told to stop.
#[pyfunction]
#[pyo3(signature = (*, region_fd, worker_id, num_workers, prefetch_factor, dataset, iterable,
                    samples, auto_collation, batch_size, drop_last, collate_fn, default_collate,
                    init_error, parent_pid, hooks))]
#[allow(clippy::too_many_arguments)]
pub fn worker_loop(
    py: Python<'_>,
    region_fd: i32,
    worker_id: usize,
    num_workers: usize,
    prefetch_factor: usize,
    dataset: Py<PyAny>,
    iterable: bool,
    samples: Option<Bound<'_, PyAny>>,
    auto_collation: bool,
    batch_size: Option<usize>,
    drop_last: bool,
    collate_fn: Py<PyAny>,
    default_collate: Option<(Py<PyAny>, Py<PyAny>, Py<PyAny>)>,
    init_error: Option<Py<PyBytes>>,
    parent_pid: i32,
    hooks: Py<PyAny>,
) -> PyResult<()> {
    // A worker must never outlive its loader. Started by fork or spawn, the main process is
    // our parent: the kernel kills us when it dies (Linux), and the wait loop watches getppid.
    // Started by a forkserver, the parent is the server: the loop polls the main pid instead.
    let main = MainProcess::new(parent_pid);
    let layout = Layout::new(num_workers, prefetch_factor);
    // SAFETY: the descriptor multiprocessing gave this process for the pool's region (or, under
    // fork, the main process's, inherited); nothing else in this process uses or closes it.
    let shm = Arc::new(
        unsafe { ShmRegion::from_fd(region_fd, "rloader DataLoader workers") }
            .map_err(queue_err)?,
    );
    if main.gone() {
        return Ok(());
    }
    let [(task_at, task_len), (answer_at, answer_len)] = layout.rings[worker_id];
    let tasks = Ring::attach(shm.clone(), task_at, task_len).map_err(queue_err)?;
    // Every answer (and every part of a streamed one) rings the main process's doorbell.
    let answers = Ring::attach(shm.clone(), answer_at, answer_len)
        .map_err(queue_err)?
        .with_doorbell(Doorbell::attach(shm.clone(), 0));
    // Collation and send_batch find this worker's slots here (NOTE [Slots]).
    let _arena = slots::install(layout.arena(shm.clone(), worker_id));
    let collate = Collate::new(collate_fn, default_collate);
    let mut fetcher = if iterable {
        // Without an iterator (its creation failed: `init_error` reports it) the worker stays
        // empty-handed.
        let samples = match samples {
            Some(s) => s.try_iter()?,
            None => pyo3::types::PyTuple::empty(py).try_iter()?,
        };
        Fetcher::iterable(dataset, samples.unbind(), batch_size, drop_last, collate)
    } else {
        Fetcher::map(py, dataset, auto_collation, collate)?
    };
    let hooks = hooks.bind(py);
    // Ok(false): the main process closed the ring (it is done with this worker).
    let send = |parts: &[&[u8]]| -> PyResult<bool> {
        match py.detach(|| answers.send(parts, None)) {
            Ok(()) => Ok(true),
            Err(QueueError::Closed) => Ok(false),
            Err(e) => Err(queue_err(e)),
        }
    };
    let mut init_error = init_error;
    let mut ended = false;
    let mut msg = Vec::new();
    let mut spent = Vec::new();
    loop {
        match py.detach(|| tasks.recv(&mut msg, Some(WAIT_SLICE))) {
            Ok(()) => {}
            Err(QueueError::Timeout) => {
                if main.gone() {
                    return Ok(());
                }
                continue;
            }
            Err(QueueError::Closed) => return Ok(()),
            Err(e) => return Err(queue_err(e)),
        }
        let (k, _, task) = parse_header(&msg)?;
        match k {
            kind::RESUME => {
                let fresh = hooks.call_method0("restart")?;
                fetcher.restart(fresh.try_iter()?.unbind());
                ended = false;
                if !send(&[&header(kind::RESUMED, worker_id, 0)])? {
                    return Ok(());
                }
                continue;
            }
            kind::TASK_INDICES | kind::TASK_OBJECT => {}
            other => {
                return Err(PyRuntimeError::new_err(format!(
                    "rloader worker: unexpected message kind {other}"
                )))
            }
        }
        if ended {
            continue; // tasks sent before the main process learnt this worker had ended
        }
        if let Some(err) = init_error.take() {
            if !send(&[
                &header(kind::ERROR, worker_id, task),
                err.bind(py).as_bytes(),
            ])? {
                return Ok(());
            }
            continue;
        }
        slots::with_arena(|a| a.begin());
        let result = if iterable {
            fetcher.fetch_next(py)
        } else {
            let keys = if k == kind::TASK_INDICES {
                let body = &msg[HEADER..];
                KeyBatch::Indices(
                    body.chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                )
            } else {
                KeyBatch::Object(
                    hooks.call_method1("load_keys", (PyBytes::new(py, &msg[HEADER..]),))?,
                )
            };
            fetcher.fetch_keys(py, keys, &mut spent).map(Some)
        };
        if let Some(Some(warning)) = slots::with_arena(|a| a.take_warning()) {
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
                &std::ffi::CString::new(warning).unwrap_or_default(),
                1,
            )?;
        }
        // A batch that cannot be encoded or sent (its pickling raises, say) is that batch's
        // error, reported as any error of the dataset or collate_fn is: never a dead worker.
        let result = result.and_then(|batch| match batch {
            Some(batch) => encode_and_send(hooks, &send, worker_id, task, batch).map(Some),
            None => Ok(None),
        });
        let delivered = match result {
            Ok(Some(delivered)) => delivered,
            Ok(None) => {
                slots::with_arena(|a| a.finish(false));
                ended = true;
                send(&[&header(kind::ENDED, worker_id, task)])?
            }
            Err(e) => {
                slots::with_arena(|a| a.finish(false));
                let wrapped = hooks.call_method1("dump_error", (e.value(py), e.traceback(py)))?;
                send(&[
                    &header(kind::ERROR, worker_id, task),
                    wrapped.cast::<PyBytes>()?.as_bytes(),
                ])?
            }
        };
        if !delivered {
            return Ok(());
        }
    }
}

/// Encodes `batch` (the hooks' `dumps`) and sends it: Ok(false) when the main process closed
/// the ring. On an error nothing was sent and no slot is left held (the caller's
/// `finish(false)` ends the batch).
fn encode_and_send(
    hooks: &Bound<'_, PyAny>,
    send: &dyn Fn(&[&[u8]]) -> PyResult<bool>,
    worker_id: usize,
    task: u64,
    batch: Bound<'_, PyAny>,
) -> PyResult<bool> {
    let encoded = hooks.call_method1("dumps", (batch,))?;
    let (data, buffers): (Bound<'_, PyBytes>, Bound<'_, PyList>) = encoded.extract()?;
    let views: Vec<pyo3::buffer::PyBuffer<u8>> = buffers
        .iter()
        .map(|b| pyo3::buffer::PyBuffer::<u8>::get(&b))
        .collect::<PyResult<_>>()?;
    send_batch(send, worker_id, task, &data, &views)
}

fn send_batch(
    send: &dyn Fn(&[&[u8]]) -> PyResult<bool>,
    worker_id: usize,
    task: u64,
    data: &Bound<'_, PyBytes>,
    views: &[pyo3::buffer::PyBuffer<u8>],
) -> PyResult<bool> {
    // SAFETY: each is a contiguous u8 buffer kept exported (and so alive and unmoved) by `views`
    // until this function returns; nothing in this process writes to it meanwhile.
    let bytes: Vec<&[u8]> = views
        .iter()
        .map(|v| unsafe { std::slice::from_raw_parts(v.buf_ptr() as *const u8, v.len_bytes()) })
        .collect();
    // Each buffer's place in the slot: collated there already, or copied there if it fits.
    let places: Vec<Option<usize>> = bytes
        .iter()
        .map(|b| {
            slots::with_arena(|a| {
                a.offset_of(b.as_ptr(), b.len()).or_else(|| {
                    let (at, dst) = a.alloc(b.len())?;
                    // SAFETY: `dst` has `b.len()` bytes of the slot, which no one else uses.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
                    Some(at)
                })
            })
            .flatten()
        })
        .collect();
    let slot = slots::with_arena(|a| a.finish(places.iter().any(Option::is_some))).flatten();
    let word = |x: Option<usize>| x.map_or(NOWHERE, |x| x as u64).to_le_bytes();
    let mut table = Vec::with_capacity(24 + 16 * views.len());
    table.extend_from_slice(&(views.len() as u64).to_le_bytes());
    table.extend_from_slice(&(data.as_bytes().len() as u64).to_le_bytes());
    table.extend_from_slice(&word(slot));
    for (b, place) in bytes.iter().zip(&places) {
        table.extend_from_slice(&(b.len() as u64).to_le_bytes());
        table.extend_from_slice(&word(*place));
    }
    let head = header(kind::DATA, worker_id, task);
    let mut parts: Vec<&[u8]> = vec![&head, &table, data.as_bytes()];
    for (b, place) in bytes.iter().zip(&places) {
        if place.is_none() {
            parts.push(b);
        }
    }
    let sent = send(&parts);
    if let (Err(_), Some(slot)) = (&sent, slot) {
        // The message naming the slot never left: the slot is the worker's again.
        slots::with_arena(|a| a.unhold(slot));
    }
    sent
}

/// The process that owns a worker's loader, watched from the worker.
struct MainProcess {
    pid: i32,
    is_parent: bool,
}

impl MainProcess {
    fn new(pid: i32) -> MainProcess {
        // SAFETY: getppid has no preconditions.
        let is_parent = unsafe { libc::getppid() } == pid;
        #[cfg(target_os = "linux")]
        if is_parent {
            // SAFETY: sets this process's parent-death signal; no memory is involved.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        }
        MainProcess { pid, is_parent }
    }

    fn gone(&self) -> bool {
        if self.is_parent {
            // SAFETY: getppid has no preconditions.
            return unsafe { libc::getppid() } != self.pid;
        }
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(self.pid, 0) != 0 && *libc::__errno_location() == libc::ESRCH } {
            return true;
        }
        // A main process that died but is not reaped yet (its parent is busy) is a zombie,
        // which kill(0) still finds.
        is_zombie(self.pid)
    }
}

/// Whether `pid` is a zombie (Linux: state Z in /proc/<pid>/stat).
fn is_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => false,
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PoolIter>()?;
    m.add_class::<KeyFeed>()?;
    m.add_class::<Message>()?;
    m.add_class::<PoolRegion>()?;
    m.add_function(wrap_pyfunction!(worker_loop, m)?)?;
    Ok(())
}
