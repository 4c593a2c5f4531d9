//! `SharedDict`: a read-only mapping of `str` to `int` in shared memory.

use std::sync::Arc;

use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use rloader_shared::{
    map_layout, Container, ContentHasher, Family, Kind, MapView, MapWriter, SealedRegion,
};

use super::items::{new_list, new_str, utf8};
use super::{keyed_by_content, new_region, shared_class, unnamed, SharedClass};
use crate::errors::to_py;

/// A read-only mapping of `str` keys to `int` values (class names to indices, paths to
/// offsets) whose data lives once in shared memory on this node; its keys keep their order.
///
/// `SharedDict(mapping, *, key=None)` copies a dict (or any mapping, or iterable of pairs)
/// in; values must fit 64 bits. `SharedDict.attach(key, version=..., build=...)` finds it by
/// key and version (as `SharedList`'s). `d[k]`, `k in d`, `d.get(k, default)`, `len(d)`,
/// iteration over keys; `keys()`, `values()` and `items()` return lists; `take(keys)` looks a
/// batch of keys up in one call. It pickles as a small handle.
#[pyclass(module = "rloader._rloader", frozen, mapping)]
pub struct SharedDict {
    view: MapView<'static>,
    container: Arc<Container>,
    key: Option<String>,
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

fn as_dict<'py>(mapping: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    if let Ok(d) = mapping.cast::<PyDict>() {
        return Ok(d.clone());
    }
    if mapping.is_instance_of::<PyString>() || mapping.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "SharedDict takes a mapping of str to int, not {}",
            type_name(mapping)
        )));
    }
    Ok(mapping
        .py()
        .get_type::<PyDict>()
        .call1((mapping,))?
        .cast_into::<PyDict>()?)
}

fn entry<'py>(
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
) -> PyResult<(super::items::Utf8<'py>, i64)> {
    let Ok(s) = k.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "SharedDict keys must be str: key {} is {}",
            k.repr()?,
            type_name(k)
        )));
    };
    if !v.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "SharedDict values must be int: the value of key {} is {}",
            k.repr()?,
            type_name(v)
        )));
    }
    Ok((utf8(s)?, v.extract::<i64>()?))
}

/// The sealed region of `mapping`'s entries, in its order.
fn region_of(mapping: &Bound<'_, PyAny>, key: Option<&str>) -> PyResult<SealedRegion> {
    let d = as_dict(mapping)?;
    let (hash, keys_len) = scan(&d)?;
    build_region(&d, hash, keys_len, key)
}

fn scan(d: &Bound<'_, PyDict>) -> PyResult<([u8; 16], usize)> {
    let mut h = ContentHasher::new(Kind::StrIntMap);
    let mut keys_len = 0;
    for (k, v) in d.iter() {
        let (utf, value) = entry(&k, &v)?;
        h.item(utf.bytes());
        h.value(value);
        keys_len += utf.bytes().len();
    }
    Ok((h.finish(), keys_len))
}

fn build_region(
    d: &Bound<'_, PyDict>,
    hash: [u8; 16],
    keys_len: usize,
    key: Option<&str>,
) -> PyResult<SealedRegion> {
    let (mut header, len) = map_layout(d.len(), keys_len).map_err(to_py)?;
    header.hash = hash;
    let mut region = new_region(key, len)?;
    header.write(region.bytes_mut());
    let mut w = MapWriter::new(region.bytes_mut(), &header);
    for (k, v) in d.iter() {
        let (utf, value) = entry(&k, &v)?;
        w.push(utf.bytes(), value).map_err(to_py)?;
    }
    w.finish().map_err(to_py)?;
    region.seal().map_err(to_py)
}

shared_class!(SharedDict, Dict, region_of);

impl SharedClass for SharedDict {
    const NAME: &'static str = "SharedDict";
    const FAMILY: Family = Family::Map;

    fn wrap(
        _py: Python<'_>,
        container: Arc<Container>,
        key: Option<String>,
    ) -> PyResult<SharedDict> {
        let view = MapView::new(container.bytes(), container.header()).map_err(to_py)?;
        // SAFETY: the view borrows the container's read-only mapping, which `container`, held
        // in the same (frozen) object and never replaced, keeps mapped and unchanged.
        let view: MapView<'static> =
            unsafe { std::mem::transmute::<MapView<'_>, MapView<'static>>(view) };
        Ok(SharedDict {
            view,
            container,
            key,
        })
    }

    fn nth<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        if i >= self.view.len() {
            return Ok(None);
        }
        // SAFETY: a new reference.
        Ok(Some(unsafe {
            Bound::from_owned_ptr(py, self.key_at(py, i)?)
        }))
    }
}

impl SharedDict {
    /// The index of `key`, if it is a str the mapping holds.
    fn find(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let Ok(s) = key.cast::<PyString>() else {
            return Ok(None);
        };
        self.view.find(utf8(s)?.bytes()).map_err(to_py)
    }

    fn key_at(&self, py: Python<'_>, i: usize) -> PyResult<*mut pyo3::ffi::PyObject> {
        new_str(py, self.view.keys.get(i).map_err(to_py)?)
    }
}

fn missing(key: &Bound<'_, PyAny>) -> PyErr {
    PyKeyError::new_err(key.clone().unbind())
}

#[pymethods]
impl SharedDict {
    #[new]
    #[pyo3(signature = (mapping, *, key=None))]
    fn new(
        py: Python<'_>,
        mapping: &Bound<'_, PyAny>,
        key: Option<String>,
    ) -> PyResult<SharedDict> {
        let d = as_dict(mapping)?;
        let (hash, keys_len) = scan(&d)?;
        let container = match &key {
            None => unnamed(build_region(&d, hash, keys_len, None)?)?,
            Some(k) => keyed_by_content(py, Family::Map, k, hash, &mut |_| {
                build_region(&d, hash, keys_len, Some(k))
            })?,
        };
        SharedDict::wrap(py, container, key)
    }

    fn __len__(&self) -> usize {
        self.view.len()
    }

    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        match self.find(key)? {
            Some(i) => Ok(self.view.value(i)),
            None => Err(missing(key)),
        }
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.find(key)?.is_some())
    }

    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self.find(key)? {
            Some(i) => self.view.value(i).into_pyobject(py)?.into_any(),
            None => default.unwrap_or_else(|| py.None().into_bound(py)),
        })
    }

    /// The values of `keys` (an iterable of str), as a list, in one call; KeyError for the
    /// first one missing.
    fn take<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for k in keys.try_iter()? {
            let k = k?;
            match self.find(&k)? {
                Some(i) => out.append(self.view.value(i))?,
                None => return Err(missing(&k)),
            }
        }
        Ok(out)
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        new_list(py, self.view.len(), |i| self.key_at(py, i))
    }

    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        new_list(py, self.view.len(), |i| {
            Ok(self.view.value(i).into_pyobject(py)?.into_any().into_ptr())
        })
    }

    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        new_list(py, self.view.len(), |i| {
            // SAFETY: a new reference, owned by the tuple below.
            let k = unsafe { Bound::from_owned_ptr(py, self.key_at(py, i)?) };
            Ok(PyTuple::new(py, [k, self.view.value(i).into_pyobject(py)?.into_any()])?.into_ptr())
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "SharedDict(key={}, {} entries, {} bytes shared)",
            self.key
                .as_deref()
                .map_or_else(|| "None".into(), |k| format!("{k:?}")),
            self.view.len(),
            self.container.bytes().len()
        )
    }
}
