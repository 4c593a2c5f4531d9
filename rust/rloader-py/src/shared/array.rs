//! `SharedArray`: a read-only numeric array in shared memory, with a zero-copy numpy view.

use std::os::raw::c_int;
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PyTuple};

use rloader_shared::{
    array_layout, write_meta, ArrayView, Container, ContentHasher, Family, Kind, SealedRegion,
};

use super::items::one_index;
use super::{keyed_by_content, new_region, shared_class, unnamed, SharedClass};
use crate::errors::to_py;

/// A read-only numeric array (labels, offsets, any numpy dtype of numbers: bool, integers,
/// floats, complex; any shape) whose data lives once in shared memory on this node.
///
/// `SharedArray(data, *, key=None)` copies a numpy array, a tensor (on the CPU) or a nested
/// list of numbers in; `SharedArray.attach(key, version=..., build=...)` finds it by key and
/// version (as `SharedList`'s). `a[i]` of a 1-D array is a Python `int`/`float`/`bool`/
/// `complex`; other indexing is numpy's, over the read-only view `a.numpy()` (which shares the
/// memory: no copy); `take(indices)` is `numpy.take(a.numpy(), indices, axis=0)`. It pickles
/// as a small handle.
#[pyclass(module = "rloader._rloader", frozen, sequence)]
pub struct SharedArray {
    data: &'static [u8],
    shape: Vec<usize>,
    dtype: String,
    /// How `a[i]` of a 1-D array of a common dtype is read without numpy.
    scalar: Option<Scalar>,
    container: Arc<Container>,
    key: Option<String>,
    /// The numpy view, made once. Its base is a `SharedBytes` (not this object: no cycle).
    view: PyOnceLock<Py<PyAny>>,
}

/// The elements of a `SharedArray`, exported read-only through the buffer protocol: the base
/// of its numpy view, keeping the container mapped while any view lives.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct SharedBytes {
    data: &'static [u8],
    _container: Arc<Container>,
}

#[derive(Clone, Copy)]
enum Scalar {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
}

impl Scalar {
    /// The fast path for `dtype` (in native byte order), if it has one.
    fn of(dtype: &str) -> Option<Scalar> {
        let native = if cfg!(target_endian = "little") {
            '<'
        } else {
            '>'
        };
        let (order, rest) = dtype.split_at(1);
        if order != "|" && !order.starts_with(native) {
            return None;
        }
        Some(match rest {
            "b1" => Scalar::Bool,
            "i1" => Scalar::I8,
            "i2" => Scalar::I16,
            "i4" => Scalar::I32,
            "i8" => Scalar::I64,
            "u1" => Scalar::U8,
            "u2" => Scalar::U16,
            "u4" => Scalar::U32,
            "u8" => Scalar::U64,
            "f4" => Scalar::F32,
            "f8" => Scalar::F64,
            _ => return None,
        })
    }

    fn read<'py>(self, py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        macro_rules! num {
            ($t:ty) => {
                <$t>::from_ne_bytes(b.try_into().expect("one element"))
                    .into_pyobject(py)?
                    .into_any()
            };
        }
        Ok(match self {
            Scalar::Bool => pyo3::types::PyBool::new(py, b[0] != 0)
                .to_owned()
                .into_any(),
            Scalar::I8 => num!(i8),
            Scalar::I16 => num!(i16),
            Scalar::I32 => num!(i32),
            Scalar::I64 => num!(i64),
            Scalar::U8 => num!(u8),
            Scalar::U16 => num!(u16),
            Scalar::U32 => num!(u32),
            Scalar::U64 => num!(u64),
            Scalar::F32 => (f32::from_ne_bytes(b.try_into().expect("one element")) as f64)
                .into_pyobject(py)?
                .into_any(),
            Scalar::F64 => num!(f64),
        })
    }
}

/// The bytes of a C-contiguous buffer (numpy's of a contiguous array), released on drop.
struct RawBytes(ffi::Py_buffer);

impl RawBytes {
    fn get(obj: &Bound<'_, PyAny>) -> PyResult<RawBytes> {
        let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
        // SAFETY: a buffer request; on success the view is released in Drop.
        let rc = unsafe {
            ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_C_CONTIGUOUS)
        };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: PyObject_GetBuffer succeeded.
        Ok(RawBytes(unsafe { view.assume_init() }))
    }

    fn bytes(&self) -> &[u8] {
        if self.0.len == 0 {
            return &[];
        }
        // SAFETY: a C-contiguous buffer of `len` bytes, exported while self lives.
        unsafe { std::slice::from_raw_parts(self.0.buf as *const u8, self.0.len as usize) }
    }
}

impl Drop for RawBytes {
    fn drop(&mut self) {
        // SAFETY: a view from a successful PyObject_GetBuffer, released once, with the GIL
        // (RawBytes never leaves the call that made it).
        unsafe { ffi::PyBuffer_Release(&mut self.0) };
    }
}

/// `data` as a C-contiguous numpy array of a numeric dtype in native byte order, and that
/// dtype's string.
fn normalized<'py>(data: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, String)> {
    let np = data.py().import("numpy")?;
    let arr = np.call_method1("asarray", (data,))?;
    let dtype = arr.getattr("dtype")?;
    let kind: String = dtype.getattr("kind")?.extract()?;
    if !["b", "i", "u", "f", "c"].contains(&kind.as_str()) {
        return Err(PyTypeError::new_err(format!(
            "SharedArray holds numbers (bool, integer, float or complex), not dtype {}: a \
             SharedList holds str and bytes",
            dtype.str()?
        )));
    }
    let ndim: usize = arr.getattr("ndim")?.extract()?;
    if ndim == 0 {
        return Err(PyValueError::new_err(
            "SharedArray needs an array of at least one dimension, not a single number",
        ));
    }
    let kwargs = PyDict::new(data.py());
    kwargs.set_item("dtype", dtype.call_method1("newbyteorder", ("=",))?)?;
    let arr = np.call_method("ascontiguousarray", (arr,), Some(&kwargs))?;
    let dt: String = arr.getattr("dtype")?.getattr("str")?.extract()?;
    Ok((arr, dt))
}

/// The sealed region of `data`, and its content hash.
fn region_of(data: &Bound<'_, PyAny>, key: Option<&str>) -> PyResult<SealedRegion> {
    let (arr, dtype) = normalized(data)?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let (header, len, raw) = plan(&arr, &dtype, &shape)?;
    write(&header, len, &raw, &dtype, &shape, key)
}

fn plan(
    arr: &Bound<'_, PyAny>,
    dtype: &str,
    shape: &[usize],
) -> PyResult<(rloader_shared::Header, usize, RawBytes)> {
    let (mut header, len) = array_layout(dtype, shape).map_err(to_py)?;
    let raw = RawBytes::get(arr)?;
    let mut h = ContentHasher::new(Kind::Array);
    h.item(dtype.as_bytes());
    for &d in shape {
        h.raw(&(d as u64).to_le_bytes());
    }
    h.item(raw.bytes());
    header.hash = h.finish();
    Ok((header, len, raw))
}

fn write(
    header: &rloader_shared::Header,
    len: usize,
    raw: &RawBytes,
    dtype: &str,
    shape: &[usize],
    key: Option<&str>,
) -> PyResult<SealedRegion> {
    let mut region = new_region(key, len)?;
    header.write(region.bytes_mut());
    write_meta(region.bytes_mut(), header, dtype, shape).copy_from_slice(raw.bytes());
    region.seal().map_err(to_py)
}

shared_class!(SharedArray, Array, region_of);

impl SharedClass for SharedArray {
    const NAME: &'static str = "SharedArray";
    const FAMILY: Family = Family::Array;

    fn wrap(
        _py: Python<'_>,
        container: Arc<Container>,
        key: Option<String>,
    ) -> PyResult<SharedArray> {
        let view = ArrayView::new(container.bytes(), container.header()).map_err(to_py)?;
        // SAFETY: the bytes belong to the container's read-only mapping, which `container`,
        // held in the same (frozen) object and never replaced, keeps mapped and unchanged.
        let data: &'static [u8] = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(view.data) };
        let scalar = if view.shape.len() == 1 {
            Scalar::of(view.dtype)
        } else {
            None
        };
        Ok(SharedArray {
            data,
            shape: view.shape.clone(),
            dtype: view.dtype.to_owned(),
            scalar,
            container,
            key,
            view: PyOnceLock::new(),
        })
    }

    fn nth<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        if i >= self.shape[0] {
            return Ok(None);
        }
        let index = i.into_pyobject(py)?.into_any();
        self.__getitem__(py, &index).map(Some)
    }
}

impl SharedArray {
    fn row_bytes(&self) -> usize {
        self.data.len() / self.shape[0].max(1)
    }

    fn view<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyAny>> {
        let v = self.view.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            let bytes = Bound::new(
                py,
                SharedBytes {
                    data: self.data,
                    _container: self.container.clone(),
                },
            )?;
            let np = py.import("numpy")?;
            let flat = np.call_method1("frombuffer", (bytes, self.dtype.as_str()))?;
            Ok(flat
                .call_method1("reshape", (PyTuple::new(py, &self.shape)?,))?
                .unbind())
        })?;
        Ok(v.bind(py))
    }
}

#[pymethods]
impl SharedArray {
    #[new]
    #[pyo3(signature = (data, *, key=None))]
    fn new(py: Python<'_>, data: &Bound<'_, PyAny>, key: Option<String>) -> PyResult<SharedArray> {
        let (arr, dtype) = normalized(data)?;
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        let (header, len, raw) = plan(&arr, &dtype, &shape)?;
        let container = match &key {
            None => unnamed(write(&header, len, &raw, &dtype, &shape, None)?)?,
            Some(k) => keyed_by_content(py, Family::Array, k, header.hash, &mut |_| {
                write(&header, len, &raw, &dtype, &shape, Some(k))
            })?,
        };
        drop(raw);
        SharedArray::wrap(py, container, key)
    }

    fn __len__(&self) -> usize {
        self.shape[0]
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let (Some(scalar), true) = (self.scalar, index.is_instance_of::<PyInt>()) {
            let i = one_index(index, self.shape[0], "SharedArray")?;
            let n = self.row_bytes();
            return scalar.read(py, &self.data[i * n..(i + 1) * n]);
        }
        let got = self.view(py)?.get_item(index)?;
        if self.shape.len() == 1 && index.is_instance_of::<PyInt>() {
            return got.call_method0("item");
        }
        Ok(got)
    }

    /// `numpy.take(self.numpy(), indices, axis=0)`: the rows at `indices` (a list, array or
    /// tensor of ints), as a new numpy array.
    fn take<'py>(
        &self,
        py: Python<'py>,
        indices: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("axis", 0)?;
        py.import("numpy")?
            .call_method("take", (self.view(py)?, indices), Some(&kwargs))
    }

    /// The data as a read-only numpy array over the shared memory (no copy).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.view(py)?.clone())
    }

    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let v = self.view(py)?.clone();
        let v = match dtype {
            Some(dt) => v.call_method1("astype", (dt,))?,
            None => v,
        };
        if copy == Some(true) {
            return v.call_method0("copy");
        }
        Ok(v)
    }

    fn __repr__(&self) -> String {
        format!(
            "SharedArray(key={}, shape={:?}, dtype={:?}, {} bytes shared)",
            self.key
                .as_deref()
                .map_or_else(|| "None".into(), |k| format!("{k:?}")),
            self.shape,
            self.dtype,
            self.container.bytes().len()
        )
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The numpy dtype.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.view(py)?.getattr("dtype")
    }
}

#[pymethods]
impl SharedBytes {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE != 0 {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "a shared container is read-only",
            ));
        }
        let data = slf.get().data;
        // SAFETY: the bytes stay mapped while `slf` lives (it holds the container), and
        // PyBuffer_FillInfo makes the view hold a reference to `slf`; readonly = 1.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::os::raw::c_void,
                data.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
