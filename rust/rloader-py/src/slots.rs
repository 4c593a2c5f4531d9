//! A worker's batch slots, as its collate functions reach them.
//!
//! The slots' state machine (who owns a slot's bytes when) is NOTE [Slots] in rloader-workers'
//! slots.rs. Here: the worker loop installs its `Arena` for its thread, and the collate paths
//! (the Rust fast path in collate.rs, and `_rloader.slot_empty` from the Python collate) ask it
//! for the output tensor of the batch being made, so that the batch is collated straight into
//! shared memory.

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use rloader_workers::slots::Arena;

use crate::buffers::SlotView;

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
    if !with_arena(|a| a.has_slot()).unwrap_or(false) {
        return Ok(None);
    }
    let Some(n) = crate::collate::nbytes_of(shape, dtype)? else {
        return Ok(None);
    };
    let Some(Some(view)) = with_arena(|a| a.alloc(n).map(|(_, ptr)| SlotView::new(a, ptr, n)))
    else {
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
