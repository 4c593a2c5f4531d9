//! The loader's recycled batch memory (rloader-memory's `BatchMemory`, NOTE [Batch memory]) as
//! the binding uses it: `BatchBuffers`, kept by the DataLoader across its epochs, and
//! `PooledView`, one block of it under a batch tensor, whose drop (after the last tensor over
//! it) gives the block back.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use rloader_memory::{BatchMemory, PooledBlock};

use super::export::{export_bytes, ExportedBytes};
use super::pinned::PinnedBlocks;
use crate::torch_api::TorchApi;

/// The first `len` bytes of a pooled block, exported through the buffer protocol (writable):
/// one batch tensor's memory. The tensor's storage holds this object through its export; when
/// the last tensor over it is gone this is dropped and the block goes back to its pool.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct PooledView {
    addr: usize,
    len: usize,
    _block: PooledBlock,
}

impl PooledView {
    /// A view of `len` bytes (at most the block's length) of `block`.
    pub fn new(block: PooledBlock, len: usize) -> Self {
        PooledView {
            addr: block.as_ptr() as usize,
            len: len.min(block.len()),
            _block: block,
        }
    }
}

// SAFETY: the block stays mapped, and out of its pool, while the view lives.
unsafe impl ExportedBytes for PooledView {
    fn span(&self) -> (usize, usize) {
        (self.addr, self.len)
    }
}

export_bytes!(PooledView);

/// An uninitialized contiguous CPU tensor of `shape` and `dtype` (`nbytes` bytes) over a block
/// of `mem` (NOTE [Batch memory] in rloader-memory): the block returns to `mem` when the last
/// tensor over it is gone. The tensor is set over the block's storage rather than viewed from
/// it (or detached from a view, which would refuse `unsqueeze_` and the like), so that, like
/// torch.empty's, it is no view (`_base` is None). Unlike torch.empty's, its storage cannot
/// grow: `resize_` to more elements raises.
pub fn pooled_empty<'py>(
    py: Python<'py>,
    h: &TorchApi,
    mem: &BatchMemory,
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
    nbytes: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let block = mem
        .take(nbytes)
        .map_err(|e| pyo3::exceptions::PyMemoryError::new_err(e.to_string()))?;
    let view = Py::new(py, PooledView::new(block, nbytes))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype)?;
    let flat = h.frombuffer.bind(py).call((view,), Some(&kwargs))?;
    let storage = flat.call_method0("untyped_storage")?;
    let out = h.empty.bind(py).call(((0,),), Some(&kwargs))?;
    let out = out.call_method1("set_", (storage, 0, PyTuple::new(py, shape)?))?;
    reset_version(py, h, &out);
    Ok(out)
}

/// Sets the version counter of `out`, which `set_` made 1, back to the 0 of torch's fresh
/// batch, where this torch lets us (`_unsafe_set_version_counter`, whose arguments changed from
/// a tensor and an int to sequences of them); elsewhere it stays 1.
fn reset_version(py: Python<'_>, h: &TorchApi, out: &Bound<'_, PyAny>) {
    if let Some(set_version) = &h.set_version {
        let set_version = set_version.bind(py);
        if set_version.call1(((out,), (0,))).is_err() {
            let _ = set_version.call1((out, 0));
        }
    }
}

/// A loader's recycled batch memory (rloader-memory's `BatchMemory`), kept by the DataLoader
/// across its epochs and handed to each single-process iterator.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct BatchBuffers(BatchMemory);

/// Free blocks a loader keeps beyond the batches alive: a batch may hold a few large tensors,
/// and the user the previous batch or two.
const MAX_FREE_BLOCKS: usize = 4;

#[pymethods]
impl BatchBuffers {
    #[new]
    fn new() -> Self {
        BatchBuffers(BatchMemory::new(MAX_FREE_BLOCKS))
    }

    /// Blocks kept free for the next batches (some may wait for the device).
    #[getter]
    fn free_blocks(&self) -> usize {
        self.0.free_blocks()
    }

    /// From now on, blocks are registered with the accelerator's driver (`register(addr, len)`,
    /// `unregister(addr)`) when first taken, and reused once the `fence()` recorded when their
    /// batch is dropped has completed (NOTE [Pinned blocks] in rloader-memory;
    /// `rloader._pinning.cuda_host.slot_pinning`). Asked again, it keeps the first driver.
    fn _pin_blocks(&self, register: Py<PyAny>, unregister: Py<PyAny>, fence: Py<PyAny>) {
        self.0
            .set_pinning(Arc::new(PinnedBlocks::new(register, unregister, fence)));
    }

    /// Whether blocks are pinned (`_pin_blocks` was called).
    #[getter]
    fn _pinned(&self) -> bool {
        self.0.is_pinning()
    }
}

impl BatchBuffers {
    pub fn memory(&self) -> &BatchMemory {
        &self.0
    }
}
