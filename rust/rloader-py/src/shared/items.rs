//! Python objects in and out of a container: `str`/`bytes` as bytes and back, and the indices
//! a batch read takes.

use std::ffi::c_char;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};

/// A `str`'s UTF-8 bytes: its own bytes when it is ASCII (no copy, nothing cached in the
/// object), else a `bytes` encoded with `surrogatepass`, so that every `str` a list can hold
/// (lone surrogates included) round-trips.
pub enum Utf8<'py> {
    Ascii(Bound<'py, PyString>),
    Encoded(Bound<'py, PyBytes>),
}

impl Utf8<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Utf8::Ascii(s) => {
                let p = s.as_ptr();
                // SAFETY: `s` is a ready str (checked by `utf8`) of 1-byte kind whose characters
                // are all ASCII: its data is its UTF-8, `GET_LENGTH` bytes long, alive as long
                // as `s`, which `self` holds.
                unsafe {
                    std::slice::from_raw_parts(
                        ffi::PyUnicode_DATA(p) as *const u8,
                        ffi::PyUnicode_GET_LENGTH(p) as usize,
                    )
                }
            }
            Utf8::Encoded(b) => b.as_bytes(),
        }
    }
}

/// The UTF-8 of `s`, a `str`.
pub fn utf8<'py>(s: &Bound<'py, PyString>) -> PyResult<Utf8<'py>> {
    let p = s.as_ptr();
    // SAFETY: `p` is a live str; READY is a no-op from 3.12 and readies a legacy string before.
    if unsafe { ffi::PyUnicode_READY(p) } != 0 {
        return Err(PyErr::fetch(s.py()));
    }
    // SAFETY: a ready str: its kind, data and length are valid.
    let ascii = unsafe {
        ffi::PyUnicode_KIND(p) == ffi::PyUnicode_1BYTE_KIND && {
            let data = ffi::PyUnicode_DATA(p) as *const u8;
            let len = ffi::PyUnicode_GET_LENGTH(p) as usize;
            std::slice::from_raw_parts(data, len).is_ascii()
        }
    };
    if ascii {
        return Ok(Utf8::Ascii(s.clone()));
    }
    // SAFETY: a live str; the codec and error handler names are NUL-terminated.
    let encoded =
        unsafe { ffi::PyUnicode_AsEncodedString(p, c"utf-8".as_ptr(), c"surrogatepass".as_ptr()) };
    if encoded.is_null() {
        return Err(PyErr::fetch(s.py()));
    }
    // SAFETY: a new reference to a bytes object.
    let b = unsafe { Bound::from_owned_ptr(s.py(), encoded) };
    Ok(Utf8::Encoded(b.cast_into::<PyBytes>()?))
}

/// A `str` from UTF-8 written by [`utf8`] (surrogates passed through).
#[inline]
pub fn new_str(py: Python<'_>, bytes: &[u8]) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: `len` bytes at `ptr`; the error handler name is NUL-terminated.
    let p = unsafe {
        ffi::PyUnicode_DecodeUTF8(
            bytes.as_ptr() as *const c_char,
            bytes.len() as ffi::Py_ssize_t,
            c"surrogatepass".as_ptr(),
        )
    };
    if p.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok(p)
}

/// A `bytes` of `bytes`.
#[inline]
pub fn new_bytes(py: Python<'_>, bytes: &[u8]) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: `len` bytes at `ptr`, copied.
    let p = unsafe {
        ffi::PyBytes_FromStringAndSize(
            bytes.as_ptr() as *const c_char,
            bytes.len() as ffi::Py_ssize_t,
        )
    };
    if p.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok(p)
}

/// A Python list of `n` items made by `item(k)`, k = 0..n, each a new reference (or an error,
/// which drops what was made).
pub fn new_list<'py>(
    py: Python<'py>,
    n: usize,
    mut item: impl FnMut(usize) -> PyResult<*mut ffi::PyObject>,
) -> PyResult<Bound<'py, PyList>> {
    // SAFETY: a new list of n empty slots, owned by `list` at once (its dealloc skips the
    // slots not yet set); each slot is set exactly once with a new reference.
    unsafe {
        let raw = ffi::PyList_New(n as ffi::Py_ssize_t);
        if raw.is_null() {
            return Err(PyErr::fetch(py));
        }
        let list = Bound::from_owned_ptr(py, raw).cast_into_unchecked::<PyList>();
        for k in 0..n {
            ffi::PyList_SET_ITEM(raw, k as ffi::Py_ssize_t, item(k)?);
        }
        Ok(list)
    }
}

/// `i` as an index into `len` items, negative ones counting from the end (as a list's).
#[inline]
pub fn index_in(i: isize, len: usize, what: &str) -> PyResult<usize> {
    let j = if i < 0 { i + len as isize } else { i };
    if j < 0 || j as usize >= len {
        return Err(PyIndexError::new_err(format!("{what} index out of range")));
    }
    Ok(j as usize)
}

/// One index: an int or anything with `__index__` (numpy integers, 0-d integer tensors).
#[inline]
pub fn one_index(obj: &Bound<'_, PyAny>, len: usize, what: &str) -> PyResult<usize> {
    let p = obj.as_ptr();
    // SAFETY: a live object; PyLong_AsSsize_t on an int sets an error only on overflow.
    let i = unsafe {
        if ffi::PyLong_CheckExact(p) != 0 {
            ffi::PyLong_AsSsize_t(p)
        } else {
            let idx = ffi::PyNumber_Index(p);
            if idx.is_null() {
                PyErr::take(obj.py());
                return Err(PyTypeError::new_err(format!(
                    "{what} indices must be integers, not {}",
                    obj.get_type().name()?
                )));
            }
            let v = ffi::PyLong_AsSsize_t(idx);
            ffi::Py_DECREF(idx);
            v
        }
    };
    if i == -1 {
        if let Some(e) = PyErr::take(obj.py()) {
            return Err(PyIndexError::new_err(format!(
                "cannot fit index into an index-sized integer: {e}"
            )));
        }
    }
    index_in(i, len, what)
}

macro_rules! from_buffer {
    ($obj:expr, $len:expr, $what:expr, $out:expr, $($t:ty),+) => {{
        $(
            if let Ok(buf) = PyBuffer::<$t>::get($obj) {
                if buf.dimensions() != 1 {
                    return Err(PyTypeError::new_err(format!(
                        "{} indices must be one-dimensional, got {} dimensions",
                        $what,
                        buf.dimensions()
                    )));
                }
                for v in buf.to_vec($obj.py())? {
                    let i = isize::try_from(v).map_err(|_| {
                        PyIndexError::new_err(format!("{} index out of range", $what))
                    })?;
                    $out.push(index_in(i, $len, $what)?);
                }
                return Ok(());
            }
        )+
    }};
}

/// The indices in `obj` (a list or tuple of ints, a 1-D integer array or tensor, or any
/// iterable of ints) into `out`, each checked against `len`.
pub fn read_indices(
    obj: &Bound<'_, PyAny>,
    len: usize,
    what: &str,
    out: &mut Vec<usize>,
) -> PyResult<()> {
    out.clear();
    if let Ok(list) = obj.cast::<PyList>() {
        out.reserve(list.len());
        for item in list.iter() {
            out.push(one_index(&item, len, what)?);
        }
        return Ok(());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        out.reserve(tuple.len());
        for item in tuple.iter() {
            out.push(one_index(&item, len, what)?);
        }
        return Ok(());
    }
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
    {
        return Err(PyTypeError::new_err(format!(
            "{what} indices must be integers, not {}",
            obj.get_type().name()?
        )));
    }
    from_buffer!(obj, len, what, out, i64, i32, u64, u32, i16, u16, i8, u8);
    // A tensor (or anything numpy can see as an array): its integers through numpy.
    if obj.hasattr("__array__")? {
        let arr = obj.call_method0("__array__")?;
        from_buffer!(&arr, len, what, out, i64, i32, u64, u32, i16, u16, i8, u8);
        return Err(PyTypeError::new_err(format!(
            "{what} indices must be integers, got an array of {}",
            arr.getattr("dtype")?.str()?
        )));
    }
    for item in obj.try_iter()? {
        out.push(one_index(&item?, len, what)?);
    }
    Ok(())
}
