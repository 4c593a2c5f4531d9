//! The buffer protocol, written once: every `Py_buffer` this crate exports or reads.
//!
//! Exported (so tensors are built over them without a copy, and keep them alive), each through
//! [`export_bytes!`] over its [`ExportedBytes`]:
//! - `Message` (here): a received worker message;
//! - `SlotView` (slots.rs): bytes of the current batch slot, in a worker, for a tensor collated
//!   there;
//! - `Lease` (slots.rs): the main process's hold on a slot a DATA message named (NOTE [Slots]
//!   in rloader-workers' slots.rs);
//! - `PooledView` (batch_buffers.rs): a block of recycled batch memory, for a tensor the
//!   single-process loop collates into (NOTE [Batch memory] in rloader-memory).
//!
//! Read: numpy arrays the fast collate copies (`ArrayView`), and the out-of-band buffers of a
//! pickled batch a worker sends (`contiguous_bytes`).
//!
//! Each exported object owns (or holds an `Arc` on) the memory it exports and never changes
//! where it lies, and every export holds a reference to the object (`view.obj`): the bytes
//! outlive every view.

use std::ffi::CStr;
use std::os::raw::c_int;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Exports `len` bytes at `addr`, kept alive by `owner`.
///
/// # Safety
/// The bytes stay mapped, and where they are, while `owner` lives.
pub unsafe fn export(
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

/// Bytes a `#[pyclass]` exports through the buffer protocol ([`export_bytes!`]).
///
/// # Safety
/// The `span()` of an object, `(address, length)`, stays mapped, and where it is, while the
/// object lives.
pub unsafe trait ExportedBytes {
    fn span(&self) -> (usize, usize);
}

/// The buffer protocol (and `len()`) of a frozen `#[pyclass]` that is [`ExportedBytes`]: its
/// only Python methods.
macro_rules! export_bytes {
    ($class:ident) => {
        #[pyo3::pymethods]
        impl $class {
            fn __len__(&self) -> usize {
                $crate::memory::ExportedBytes::span(self).1
            }

            unsafe fn __getbuffer__(
                slf: pyo3::Bound<'_, Self>,
                view: *mut pyo3::ffi::Py_buffer,
                flags: std::os::raw::c_int,
            ) -> pyo3::PyResult<()> {
                let (addr, len) = $crate::memory::ExportedBytes::span(slf.get());
                // SAFETY: `ExportedBytes`' promise: the bytes stay where they are while `slf`
                // lives, and the view holds a reference to `slf`.
                unsafe { $crate::memory::export::export(slf.as_any(), view, addr, len, flags) }
            }

            unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
        }
    };
}
pub(crate) use export_bytes;

/// A received message, exported through the buffer protocol so a batch's tensors can be
/// built over it without another copy (they keep it alive).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct Message {
    data: Vec<u8>,
}

impl Message {
    pub fn new(data: Vec<u8>) -> Self {
        Message { data }
    }
}

// SAFETY: `data` is never changed after construction (the class is frozen, and nothing takes
// `&mut self`).
unsafe impl ExportedBytes for Message {
    fn span(&self) -> (usize, usize) {
        (self.data.as_ptr() as usize, self.data.len())
    }
}

export_bytes!(Message);

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
