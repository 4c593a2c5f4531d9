//! Where the batch being fetched will be collated, lent to the dataset while it makes the
//! batch's samples: a dataset that writes its samples straight into one tensor there
//! (rloader.vision's `__getitems__`, through `batch_empty`) hands the default collate a batch
//! it need not copy again (`StackedSamples` in python/rloader/_collate.py).
//!
//! The fetcher lends the place only around a `__getitems__` call whose batch the default
//! collate will collate: a worker process's current slot (the batch then travels without a
//! copy), or the loader's recycled batch memory (the single-process loop, worker threads;
//! pinned there when batches are). A custom `collate_fn` gets nothing lent, so a dataset's
//! samples never take memory its collation will not use. A lending is taken once (a loader
//! iterated inside the `__getitems__` before it asks gets it, and its own collation copies
//! out of it), and every fetch lends anew or lends nothing, so a fetch nested in another never
//! sees the outer one's.

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use super::batch_buffers::{pooled_empty, BatchBuffers};
use super::slots::{slot_empty, with_arena};
use crate::collate::{pooled_tensor_min, torch_modes_active};
use crate::torch_api::{nbytes_of, torch_api};

/// The memory a batch is collated into.
pub enum Target {
    /// The worker process's current slot.
    Slot,
    /// The loader's recycled batch memory.
    Buffers(Py<BatchBuffers>),
}

thread_local! {
    /// What the fetcher on this thread lent for the batch it is fetching.
    static LENT: RefCell<Option<Target>> = const { RefCell::new(None) };
}

/// Lends where the default collate would put this thread's current batch (`default`): its
/// worker process's slot, else `buffers`; or nothing (`default` false: another collate).
/// Until the guard is dropped.
pub fn lend(py: Python<'_>, default: bool, buffers: Option<&Py<BatchBuffers>>) -> LendGuard {
    let target = if !default {
        None
    } else if with_arena(|a| a.has_slot()).unwrap_or(false) {
        Some(Target::Slot)
    } else {
        buffers.map(|b| Target::Buffers(b.clone_ref(py)))
    };
    LendGuard(LENT.with_borrow_mut(|lent| std::mem::replace(lent, target)))
}

/// Forgets a lending this thread inherited (a worker process forked inside a lending).
pub fn forget() {
    LENT.with_borrow_mut(|lent| *lent = None);
}

/// Gives back what `lend` lent (a nested fetch's lending ends with it).
pub struct LendGuard(Option<Target>);

impl Drop for LendGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        LENT.with_borrow_mut(|lent| *lent = previous);
    }
}

/// An uninitialized contiguous tensor of `shape` and `dtype` in the memory the default collate
/// will collate the batch being fetched into, or None where nothing was lent (outside a
/// `__getitems__` of rloader's loops, with a custom `collate_fn`) or it has no room.
#[pyfunction]
pub fn batch_empty<'py>(
    py: Python<'py>,
    shape: Vec<isize>,
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match LENT.with_borrow_mut(Option::take) {
        None => Ok(None),
        Some(Target::Slot) => slot_empty(py, &shape, dtype),
        Some(Target::Buffers(buffers)) => {
            let Some(nbytes) = nbytes_of(&shape, dtype)? else {
                return Ok(None);
            };
            let memory = buffers.get().memory();
            if nbytes < pooled_tensor_min(memory) {
                return Ok(None); // (as the default collate stacks it: in fresh memory)
            }
            pooled_empty(py, torch_api(py)?, memory, &shape, dtype, nbytes).map(Some)
        }
    }
}

/// python/rloader/_collate.py's `StackedSamples` and `collate_stacked`, imported once.
static STACKED: PyOnceLock<(Py<PyType>, Py<PyAny>)> = PyOnceLock::new();

/// The default collate of `batch` when it is a `StackedSamples` still as its dataset made it
/// (its tensors already stacked, the other columns collated by `general`), else None. Not
/// under a torch function or dispatch mode: those place what collation makes.
pub fn collate_stacked<'py>(
    batch: &Bound<'py, PyAny>,
    general: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = batch.py();
    if batch.is_exact_instance_of::<pyo3::types::PyList>() {
        return Ok(None); // (every other dataset's batch: nothing more asked of it)
    }
    let (kind, collate) = STACKED.get_or_try_init(py, || -> PyResult<_> {
        let module = py.import("rloader._collate")?;
        Ok((
            module
                .getattr("StackedSamples")?
                .cast_into::<PyType>()?
                .unbind(),
            module.getattr("collate_stacked")?.unbind(),
        ))
    })?;
    if !batch.get_type().is(kind.bind(py)) || torch_modes_active(py)? {
        return Ok(None);
    }
    let out = collate.bind(py).call1((batch, general))?;
    Ok((!out.is_none()).then_some(out))
}
