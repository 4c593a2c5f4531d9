//! Batch slots in the binding: a worker's, as its collate functions reach them, and the main
//! process's hold on one (`Lease`).
//!
//! The slots' state machine (who owns a slot's bytes when) is NOTE [Slots] in rloader-workers'
//! slots.rs. Here: the worker loop installs its `Arena` for its thread, and the collate paths
//! (the Rust fast path in collate/, and `_rloader.slot_empty` from the Python collate) ask it
//! for the output tensor of the batch being made (`SlotView`), so that the batch is collated
//! straight into shared memory. In the main process, the tensors of a batch that arrived in a
//! slot lie over a `Lease`, whose drop gives the slot back.

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use rloader_queue::ShmRegion;
use rloader_workers::slots::{Arena, SlotLease, ViewCount};

use super::export::{export_bytes, ExportedBytes};
use super::pinned::PinnedSlots;
use crate::torch_api::{nbytes_of, torch_api};

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

/// Bytes of a slot, exported through the buffer protocol (writable): a tensor a worker collates
/// into its current slot. While it lives, the worker does not reuse the slot.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct SlotView {
    addr: usize,
    len: usize,
    _views: ViewCount,
    _region: Arc<ShmRegion>,
}

impl SlotView {
    /// A view of the `len` bytes at `ptr`, which `arena.alloc` just gave the current batch.
    pub fn new(arena: &Arena, ptr: *mut u8, len: usize) -> Self {
        SlotView {
            addr: ptr as usize,
            len,
            _views: arena.view(),
            _region: arena.region().clone(),
        }
    }
}

// SAFETY: the view's Arc<ShmRegion> keeps the bytes mapped.
unsafe impl ExportedBytes for SlotView {
    fn span(&self) -> (usize, usize) {
        (self.addr, self.len)
    }
}

export_bytes!(SlotView);

/// An uninitialized CPU tensor of `shape` and `dtype` in the current slot (inside a worker
/// that is making a batch), or None: outside workers, with no free slot, or no room.
pub fn slot_empty<'py>(
    py: Python<'py>,
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !with_arena(|a| a.has_slot()).unwrap_or(false) {
        return Ok(None);
    }
    let Some(n) = nbytes_of(shape, dtype)? else {
        return Ok(None);
    };
    let Some(Some(view)) = with_arena(|a| a.alloc(n).map(|(_, ptr)| SlotView::new(a, ptr, n)))
    else {
        return Ok(None);
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype)?;
    let flat = torch_api(py)?
        .frombuffer
        .bind(py)
        .call((Py::new(py, view)?,), Some(&kwargs))?;
    Ok(Some(
        flat.call_method1("view", (PyTuple::new(py, shape)?,))?,
    ))
}

/// `slot_empty(shape, dtype)` for Python (the general collate path).
#[pyfunction(name = "slot_empty")]
pub fn py_slot_empty<'py>(
    py: Python<'py>,
    shape: Vec<isize>,
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    slot_empty(py, &shape, dtype)
}

/// Whether this thread runs an rloader worker loop (which has slots, whether free or not).
#[pyfunction]
pub fn in_slot_worker() -> bool {
    with_arena(|_| ()).is_some()
}

/// The main process's hold on one worker slot: the bytes of one batch's tensors. Dropped when
/// the last of them is; the slot then goes back to its worker (NOTE [Slots]), or, for a slot
/// registered with the accelerator's driver, once the device has read it (NOTE [Pinned slots]).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct Lease {
    /// Some until dropped.
    lease: Option<SlotLease>,
    pinned: Option<Arc<PinnedSlots>>,
}

impl Lease {
    /// `pinned`: the registrations that cover the slot's bytes, if they do.
    pub fn new(lease: SlotLease, pinned: Option<Arc<PinnedSlots>>) -> Self {
        Lease {
            lease: Some(lease),
            pinned,
        }
    }
}

// SAFETY: the lease's Arc<ShmRegion> keeps the bytes mapped.
unsafe impl ExportedBytes for Lease {
    fn span(&self) -> (usize, usize) {
        self.lease.as_ref().map_or((0, 0), |l| (l.addr(), l.len()))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (Some(lease), Some(pinned)) = (self.lease.take(), self.pinned.take()) {
            // The last tensor over the slot is gone (this runs as Python frees the object).
            pinned.release(lease);
        }
    }
}

export_bytes!(Lease);
