//! Bytes across the buffer protocol: every `Py_buffer` this crate exports or reads.
//!
//! Exported (so tensors are built over them without a copy, and keep them alive):
//! - `Message`: a received worker message;
//! - `SlotView`: bytes of the current batch slot, in a worker, for a tensor collated there;
//! - `Lease`: the main process's hold on a slot a DATA message named (NOTE [Slots] in
//!   rloader-workers' slots.rs);
//! - `PooledView`: a block of recycled batch memory, for a tensor the single-process loop
//!   collates into (NOTE [Batch memory] in rloader-memory).
//!
//! Read: numpy arrays the fast collate copies (`ArrayView`), and the out-of-band buffers of a
//! pickled batch a worker sends (`contiguous_bytes`).
//!
//! Each exported object owns (or holds an `Arc` on) the memory it exports and never changes
//! where it lies, and every export holds a reference to the object (`view.obj`): the bytes
//! outlive every view.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use rloader_memory::{BatchMemory, PooledBlock};
use rloader_queue::ShmRegion;
use rloader_workers::slots::{Arena, SlotLease, ViewCount};

use crate::pinned::{PinnedBlocks, PinnedSlots};

/// Exports `len` bytes at `addr`, kept alive by `owner`.
///
/// # Safety
/// The bytes stay mapped, and where they are, while `owner` lives.
unsafe fn export(
    owner: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    addr: usize,
    len: usize,
    flags: c_int,
) -> PyResult<()> {
    // SAFETY: PyBuffer_FillInfo sets view.obj = owner (a new reference), so the bytes, which
    // live as long as `owner` (the caller's promise), outlive every export.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            addr as *mut std::os::raw::c_void,
            len as ffi::Py_ssize_t,
            0,
            flags,
        )
    };
    if rc == -1 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// A received message, exported through the buffer protocol so a batch's tensors can be
/// built over it without another copy (they keep it alive).
#[pyclass(module = "rloader._rloader")]
pub struct Message {
    data: Vec<u8>,
}

impl Message {
    pub fn new(data: Vec<u8>) -> Self {
        Message { data }
    }
}

#[pymethods]
impl Message {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (addr, len) = {
            let me = slf.borrow();
            (me.data.as_ptr() as usize, me.data.len())
        };
        // SAFETY: `data` is never changed after construction (no method takes `&mut self`),
        // and the view holds a reference to `slf`, so the bytes outlive every export.
        unsafe { export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
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

#[pymethods]
impl SlotView {
    fn __len__(&self) -> usize {
        self.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (addr, len) = (slf.get().addr, slf.get().len);
        // SAFETY: the view's Arc<ShmRegion> keeps the bytes mapped.
        unsafe { export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
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

#[pymethods]
impl Lease {
    fn __len__(&self) -> usize {
        self.span().1
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (addr, len) = slf.get().span();
        // SAFETY: the lease's Arc<ShmRegion> keeps the bytes mapped.
        unsafe { export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

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

#[pymethods]
impl PooledView {
    fn __len__(&self) -> usize {
        self.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (addr, len) = (slf.get().addr, slf.get().len);
        // SAFETY: the block stays mapped, and out of its pool, while `slf` lives.
        unsafe { export(slf.as_any(), view, addr, len, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
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
    /// `rloader._pin.slot_pinning`). Asked again, it keeps the first driver.
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

/// A C-contiguous, writable buffer view of one numpy array, released on drop.
pub struct ArrayView(ffi::Py_buffer);

impl ArrayView {
    /// The view, or None when the array cannot give one (read-only, non-contiguous, ...): the
    /// caller's general path handles it (and warns or raises).
    pub fn get(obj: &Bound<'_, PyAny>) -> Option<ArrayView> {
        let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
        let flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT | ffi::PyBUF_WRITABLE;
        // SAFETY: `view` is filled by a successful PyObject_GetBuffer and released in Drop.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc != 0 {
            PyErr::take(obj.py());
            return None;
        }
        // SAFETY: PyObject_GetBuffer succeeded, so it filled the view.
        Some(ArrayView(unsafe { view.assume_init() }))
    }

    /// The struct-module format of an element ("B" when the exporter gives none).
    pub fn format(&self) -> &str {
        if self.0.format.is_null() {
            return "B";
        }
        // SAFETY: the exporter gives a NUL-terminated format string living as long as the view.
        unsafe { CStr::from_ptr(self.0.format) }
            .to_str()
            .unwrap_or("")
    }

    pub fn shape(&self) -> &[ffi::Py_ssize_t] {
        if self.0.ndim == 0 || self.0.shape.is_null() {
            return &[];
        }
        // SAFETY: `shape` has `ndim` entries (we asked for PyBUF_ND via C_CONTIGUOUS).
        unsafe { std::slice::from_raw_parts(self.0.shape, self.0.ndim as usize) }
    }

    /// Bytes of one element.
    pub fn itemsize(&self) -> usize {
        self.0.itemsize as usize
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a C-contiguous buffer of `len` bytes at `buf`.
        unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.0.len as usize) }
    }
}

impl Drop for ArrayView {
    fn drop(&mut self) {
        // SAFETY: the view came from a successful PyObject_GetBuffer; the GIL is held by the
        // caller that owns it (views never leave the collate call that made them).
        unsafe { ffi::PyBuffer_Release(&mut self.0) };
    }
}

/// The bytes of `view`, a contiguous u8 buffer (one of `PickleBuffer.raw()`'s, which are): the
/// view keeps them exported, alive and where they are, while borrowed. Other threads may still
/// write to them (a tensor is not locked): what is sent is then what was there, as with torch.
pub fn contiguous_bytes(view: &PyBuffer<u8>) -> PyResult<&[u8]> {
    if !view.is_c_contiguous() {
        return Err(PyBufferError::new_err("a batch buffer is not contiguous"));
    }
    // SAFETY: a C-contiguous buffer of `len_bytes` bytes at `buf_ptr`, exported while `view`
    // (which the slice borrows) lives.
    Ok(unsafe { std::slice::from_raw_parts(view.buf_ptr() as *const u8, view.len_bytes()) })
}
