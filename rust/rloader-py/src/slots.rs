//! Batches in reused shared memory: "slots".
//!
//! NOTE [Slots]: each worker owns `slots_per_worker` slots in its pool's region (see `Layout` in
//! workers.rs). A slot is `SLOT_SPAN` bytes of address space, mapped once by every process; the
//! region is sparse, and only what a slot has used so far is reserved in /dev/shm (the worker
//! commits as the slot grows, and a full /dev/shm is an error that says what to change, never a
//! SIGBUS). A worker collates a batch's tensors straight into a free slot (the default collate
//! asks `slot_empty` for its output), and copies there any other tensor bytes of the batch that
//! fit; its DATA message then names the slot and the offsets instead of carrying the bytes. The
//! main process builds the batch's tensors over its own mapping of the slot, through one `Lease`
//! per batch, which each tensor keeps alive (torch.frombuffer holds the buffer's owner).
//!
//! A slot's state word, in the region, says who owns its bytes:
//! - FREE: the worker's. It picks a FREE slot that no tensor of its own still views (a
//!   `SlotView` count per slot, for a worker that keeps a collated batch).
//! - HELD: the main process's. The worker stores HELD before it sends the message naming the
//!   slot (the ring's release/acquire carries both the bytes and the store).
//! - LEASED: the main process's, which received the message: its `Lease` stores LEASED, and
//!   FREE with Release when the last tensor over it is gone. The worker loads the state with
//!   Acquire, so its next writes come after the main process's last reads.
//!
//! Beside the state, each slot keeps in the region the high-water mark of the bytes its workers
//! have used for batches (in pages; a hint that only the slot's own worker stores, so Relaxed). A worker
//! of a later pool, whose fresh mapping has no page tables for the slot, populates the part below
//! the mark as it commits it: written pages map cheaply in bulk, while pages never written would
//! be zeroed one fault at a time either way (`ShmRegion::populate`).
//!
//! When a region serves a new pool (the old workers are gone), HELD slots, whose messages were
//! never received, become FREE; LEASED ones stay with the user's batches (`reset_unleased`).
//!
//! A worker that finds no FREE slot (the user is holding batches: `list(loader)`) sends the bytes
//! inline through its ring, and the main process copies them out: correct, one copy slower.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use rloader_queue::ShmRegion;

/// Address space per slot. A batch whose tensors need more travels inline.
pub const SLOT_SPAN: usize = 1 << 30;
/// Slots commit /dev/shm in steps of this much.
const COMMIT_STEP: usize = 2 << 20;
const ALIGN: usize = 64;

pub const FREE: u32 = 0;
/// Sent to the main process (which may not have received it yet).
pub const HELD: u32 = 1;
/// Held by a `Lease` of the main process.
pub const LEASED: u32 = 2;

/// Bytes of slot metadata in the region, per slot: the state word, then the slot's high-water
/// mark (NOTE [Slots]).
pub const SLOT_META_BYTES: usize = 8;
/// The high-water mark counts pages of this size.
const HIGH_WATER_PAGE: usize = 4096;

/// Slots per worker: enough for the tasks in flight to one worker (`prefetch_factor`), the
/// batch the user is holding and the one before it (alive while `next()` runs), and one spare.
pub fn slots_per_worker(prefetch_factor: usize) -> usize {
    prefetch_factor.max(1) + 3
}

/// The state word of one slot.
///
/// # Safety
/// `at` is the offset of a 4-aligned u32 inside `region`, used only atomically.
unsafe fn state_word(region: &ShmRegion, at: usize) -> &AtomicU32 {
    debug_assert!(at + 4 <= region.len() && at & 3 == 0);
    // SAFETY: per the caller's promise.
    unsafe { &*(region.as_ptr().add(at) as *const AtomicU32) }
}

/// For a region about to serve a new pool, whose previous workers are gone: the slot at
/// `state_at` is free unless a `Lease` holds it (one its old worker sent but the main process
/// never received is free again).
pub fn reset_unleased(region: &ShmRegion, state_at: usize) {
    // SAFETY: the caller passes a state word's offset (from Layout).
    let state = unsafe { state_word(region, state_at) };
    if state.load(Ordering::Acquire) != LEASED {
        state.store(FREE, Ordering::Release);
    }
}

/// A worker's slots (worker side).
pub struct Arena {
    region: Arc<ShmRegion>,
    /// Offset of this worker's first state word, and of its first slot.
    states_at: usize,
    slots_at: usize,
    /// Bytes of each slot reserved in /dev/shm so far.
    committed: Vec<usize>,
    /// SlotView objects alive per slot: tensors this worker still holds over it.
    live: Vec<Arc<AtomicUsize>>,
    /// The slot the batch being made goes to, and how much of it is used.
    current: Option<usize>,
    used: usize,
    /// Set when /dev/shm ran out: no more slots grow, and batches travel inline.
    no_space: bool,
    warning: Option<String>,
    /// Test hook: reservations past this many bytes (this worker's slots together) fail as on
    /// a machine out of memory, from `RLOADER_TEST_SLOT_RESERVE_LIMIT`, which every worker
    /// reads from the environment it inherits (tests/test_slots.py).
    reserve_limit: Option<usize>,
}

/// The environment variable of `Arena::reserve_limit`: the out-of-memory path can be tested
/// without exhausting the machine's memory.
const RESERVE_LIMIT_VAR: &str = "RLOADER_TEST_SLOT_RESERVE_LIMIT";

impl Arena {
    pub fn new(region: Arc<ShmRegion>, states_at: usize, slots_at: usize, slots: usize) -> Self {
        Arena {
            region,
            states_at,
            slots_at,
            committed: vec![0; slots],
            live: (0..slots).map(|_| Arc::new(AtomicUsize::new(0))).collect(),
            current: None,
            used: 0,
            no_space: false,
            warning: None,
            reserve_limit: std::env::var(RESERVE_LIMIT_VAR)
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    fn state(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: Layout puts `slots` SLOT_META_BYTES-byte entries at `states_at`, inside the region.
        unsafe { state_word(&self.region, self.states_at + SLOT_META_BYTES * slot) }
    }

    fn high_water(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: as for `state`: the word after each state word is the slot's high-water mark.
        unsafe { state_word(&self.region, self.states_at + SLOT_META_BYTES * slot + 4) }
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        // SAFETY: Layout puts `slots` spans of SLOT_SPAN bytes at `slots_at`, inside the region.
        unsafe { self.region.as_ptr().add(self.slots_at + slot * SLOT_SPAN) }
    }

    /// Starts a batch: picks a free slot, if there is one.
    pub fn begin(&mut self) {
        self.used = 0;
        self.current = (0..self.committed.len()).find(|&s| {
            self.state(s).load(Ordering::Acquire) == FREE
                && self.live[s].load(Ordering::Acquire) == 0
        });
    }

    /// `n` bytes in the current slot (64-aligned): its offset in the slot and address, or None
    /// when there is no slot or no room. When /dev/shm is full, batches travel inline from then
    /// on (through the rings, reserved when the loader started), and `take_warning` says so.
    pub fn alloc(&mut self, n: usize) -> Option<(usize, *mut u8)> {
        let slot = self.current?;
        let start = self.used.div_ceil(ALIGN) * ALIGN;
        let end = start + n;
        if n == 0 || end > SLOT_SPAN {
            return None;
        }
        let have = self.committed[slot];
        if end > have {
            if self.no_space {
                return None;
            }
            let want = end
                .div_ceil(COMMIT_STEP)
                .saturating_mul(COMMIT_STEP)
                .min(SLOT_SPAN);
            let at = self.slots_at + slot * SLOT_SPAN + have;
            let reserved = self.committed.iter().sum::<usize>() + (want - have);
            let commit = match self.reserve_limit {
                Some(limit) if reserved > limit => Err(rloader_queue::QueueError::NoMemory {
                    what: format!("a batch slot ({RESERVE_LIMIT_VAR}={limit})"),
                    requested: want - have,
                }),
                _ => self.region.commit(at, want - have),
            };
            if let Err(e) = commit {
                self.no_space = true;
                self.warning = Some(format!(
                    "DataLoader worker: {e}. Batches now travel through the worker's queue \
                     instead, one copy slower."
                ));
                return None;
            }
            let written = (self.high_water(slot).load(Ordering::Relaxed) as usize)
                .saturating_mul(HIGH_WATER_PAGE);
            if written > have {
                self.region.populate(at, written.min(want) - have);
            }
            self.committed[slot] = want;
        }
        self.used = end;
        // SAFETY: `end <= SLOT_SPAN`, so the range is inside this slot.
        Some((start, unsafe { self.slot_ptr(slot).add(start) }))
    }

    /// The warning of a failed reservation, once.
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// Where `len` bytes at `ptr` lie in the current slot, if they were allocated there.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let slot = self.current?;
        let base = self.slot_ptr(slot) as usize;
        let at = (ptr as usize).checked_sub(base)?;
        (at + len <= self.used).then_some(at)
    }

    /// Ends the batch. With `sent_in_slot`, the message about to be sent names the current slot:
    /// it becomes the main process's (HELD) and its number is returned.
    pub fn finish(&mut self, sent_in_slot: bool) -> Option<usize> {
        let slot = self.current.take()?;
        // One writer (this worker), so a load and a store, not a locked read-modify-write.
        let pages = u32::try_from(self.used.div_ceil(HIGH_WATER_PAGE)).unwrap_or(u32::MAX);
        let high_water = self.high_water(slot);
        if pages > high_water.load(Ordering::Relaxed) {
            high_water.store(pages, Ordering::Relaxed);
        }
        if !sent_in_slot {
            return None;
        }
        // Relaxed: the ring's send publishes it with the message (NOTE [Slots]).
        self.state(slot).store(HELD, Ordering::Relaxed);
        Some(slot)
    }

    /// Takes back a slot `finish` handed to the main process when the message naming it could
    /// not be sent: the main process never learns of it, so the worker still owns its bytes.
    pub fn unhold(&mut self, slot: usize) {
        self.state(slot).store(FREE, Ordering::Relaxed);
    }

    fn view_of(&self, ptr: *mut u8, len: usize) -> SlotView {
        let slot = self.current.expect("views are made of the current slot");
        self.live[slot].fetch_add(1, Ordering::AcqRel);
        SlotView {
            addr: ptr as usize,
            len,
            live: Some(self.live[slot].clone()),
            _region: self.region.clone(),
        }
    }
}

thread_local! {
    /// The arena of the worker loop running on this thread (a worker process's main thread).
    static ARENA: RefCell<Option<Arena>> = const { RefCell::new(None) };
}

/// Installs `arena` for this thread until the guard is dropped.
pub fn install(arena: Arena) -> ArenaGuard {
    ARENA.with_borrow_mut(|a| *a = Some(arena));
    ArenaGuard(())
}

pub struct ArenaGuard(());

impl Drop for ArenaGuard {
    fn drop(&mut self) {
        ARENA.with_borrow_mut(|a| *a = None);
    }
}

/// Runs `f` on this thread's arena, if a worker loop installed one.
pub fn with_arena<R>(f: impl FnOnce(&mut Arena) -> R) -> Option<R> {
    ARENA.with_borrow_mut(|a| a.as_mut().map(f))
}

struct TorchFns {
    frombuffer: Py<PyAny>,
}

static TORCH: PyOnceLock<TorchFns> = PyOnceLock::new();

fn torch_fns(py: Python<'_>) -> PyResult<&TorchFns> {
    TORCH.get_or_try_init(py, || {
        Ok(TorchFns {
            frombuffer: py.import("torch")?.getattr("frombuffer")?.unbind(),
        })
    })
}

/// An uninitialized CPU tensor of `shape` and `dtype` in the current slot (inside a worker
/// that is making a batch), or None: outside workers, with no free slot, or no room.
pub fn slot_empty<'py>(
    py: Python<'py>,
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !with_arena(|a| a.current.is_some()).unwrap_or(false) {
        return Ok(None);
    }
    let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
    let mut n = itemsize;
    for &d in shape {
        let Ok(d) = usize::try_from(d) else {
            return Ok(None);
        };
        n = n.saturating_mul(d);
    }
    let Some(Some(view)) = with_arena(|a| a.alloc(n).map(|(_, ptr)| a.view_of(ptr, n))) else {
        return Ok(None);
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype)?;
    let flat = torch_fns(py)?
        .frombuffer
        .bind(py)
        .call((Py::new(py, view)?,), Some(&kwargs))?;
    Ok(Some(
        flat.call_method1("view", (PyTuple::new(py, shape)?,))?,
    ))
}

/// `slot_empty(shape, dtype)` for Python (the general collate path).
#[pyfunction(name = "slot_empty")]
fn py_slot_empty<'py>(
    py: Python<'py>,
    shape: Vec<isize>,
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    slot_empty(py, &shape, dtype)
}

/// Whether this thread runs an rloader worker loop (which has slots, whether free or not).
#[pyfunction]
fn in_slot_worker() -> bool {
    with_arena(|_| ()).is_some()
}

/// Bytes of a slot, exported through the buffer protocol (writable).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct SlotView {
    addr: usize,
    len: usize,
    /// The worker's count of views over this slot (None for a main-process lease's view).
    live: Option<Arc<AtomicUsize>>,
    _region: Arc<ShmRegion>,
}

impl Drop for SlotView {
    fn drop(&mut self) {
        if let Some(live) = &self.live {
            live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Exports `len` bytes at `addr`, kept alive by `owner`.
///
/// # Safety
/// The bytes stay mapped while `owner` lives.
pub unsafe fn export(
    owner: &Bound<'_, PyAny>,
    view: *mut pyo3::ffi::Py_buffer,
    addr: usize,
    len: usize,
    flags: std::os::raw::c_int,
) -> PyResult<()> {
    // SAFETY: PyBuffer_FillInfo sets view.obj = owner (a new reference), so the mapping, held
    // by owner's Arc<ShmRegion>, outlives every export.
    let rc = unsafe {
        pyo3::ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            addr as *mut std::os::raw::c_void,
            len as pyo3::ffi::Py_ssize_t,
            0,
            flags,
        )
    };
    if rc == -1 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

#[pymethods]
impl SlotView {
    fn __len__(&self) -> usize {
        self.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let (addr, len) = (slf.get().addr, slf.get().len);
        // SAFETY: the view's Arc<ShmRegion> keeps the bytes mapped.
        unsafe { export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// The main process's hold on one worker slot: the bytes of one batch's tensors. Dropped when
/// the last of them is; the slot then goes back to its worker (NOTE [Slots]).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct Lease {
    region: Arc<ShmRegion>,
    state_at: usize,
    addr: usize,
    len: usize,
}

impl Lease {
    /// The lease on `len` bytes of the slot at `slot_at`, whose state word is at `state_at`.
    pub fn new(
        region: Arc<ShmRegion>,
        state_at: usize,
        slot_at: usize,
        len: usize,
    ) -> PyResult<Self> {
        if len > SLOT_SPAN || slot_at + SLOT_SPAN > region.len() || state_at + 4 > region.len() {
            return Err(PyRuntimeError::new_err(
                "rloader: a worker named a slot outside its region",
            ));
        }
        // SAFETY: checked to lie inside the region just above.
        let addr = unsafe { region.as_ptr().add(slot_at) } as usize;
        // SAFETY: `state_at` is inside the region (checked above) and a state word.
        unsafe { state_word(&region, state_at) }.store(LEASED, Ordering::Relaxed);
        Ok(Lease {
            region,
            state_at,
            addr,
            len,
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // SAFETY: `state_at` is a slot's state word (checked in `new`).
        unsafe { state_word(&self.region, self.state_at) }.store(FREE, Ordering::Release);
    }
}

#[pymethods]
impl Lease {
    fn __len__(&self) -> usize {
        self.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let (addr, len) = (slf.get().addr, slf.get().len);
        // SAFETY: the lease's Arc<ShmRegion> keeps the bytes mapped.
        unsafe { export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SlotView>()?;
    m.add_class::<Lease>()?;
    m.add_function(wrap_pyfunction!(py_slot_empty, m)?)?;
    m.add_function(wrap_pyfunction!(in_slot_worker, m)?)?;
    Ok(())
}
