//! `SharedList`: a read-only list of `str` or `bytes` in shared memory.

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PySlice, PyString, PyTuple};

use rloader_shared::{
    prefetch_item, Container, ContentHasher, Family, Kind, ListPlanner, ListView, ListWriter,
    SealedRegion, SharedError,
};

use super::items::{new_bytes, new_list, new_str, one_index, read_indices, utf8, Utf8};
use super::{keyed_by_content, new_region, shared_class, unnamed, SharedClass};
use crate::errors::to_py;

/// A read-only list of `str` or `bytes` (file paths, captions) whose data lives once in shared
/// memory on this node, whichever process or thread reads it.
///
/// `SharedList(items, *, key=None)` builds it from a list or tuple of `str` (or of `bytes`).
/// With a `key`, processes that were not forked from one another (the ranks `torchrun` starts)
/// share one copy: the first to build serves it, the others, given the same items, attach to
/// it instead of building another. `SharedList.attach(key, version=..., build=...)` finds it
/// by key and version, so that only one process needs the items.
///
/// Indexing (`lst[i]`, negative indices, slices) and iteration return ordinary `str`/`bytes`;
/// `take(indices)` reads a batch in one call. Reads write nothing to the shared memory, so no
/// page of it is ever copied. A `SharedList` pickles as a small handle: a worker process that
/// unpickles it maps the same memory. See docs/shared.md.
#[pyclass(module = "rloader._rloader", frozen, sequence)]
pub struct SharedList {
    view: ListView<'static>,
    kind: Kind,
    container: Arc<Container>,
    key: Option<String>,
}

/// What pass one counted: the kind of items, their lengths, their content hash.
struct Plan {
    kind: Kind,
    lengths: ListPlanner,
    hash: [u8; 16],
}

enum Item<'py> {
    Str(Utf8<'py>),
    Bytes(Bound<'py, PyBytes>),
}

impl Item<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Item::Str(s) => s.bytes(),
            Item::Bytes(b) => b.as_bytes(),
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// Item `i`'s bytes, which must be of `kind` (the first item's).
fn item_bytes<'py>(
    kind: Kind,
    obj: &Bound<'py, PyAny>,
    i: usize,
    first: &str,
) -> PyResult<Item<'py>> {
    match kind {
        Kind::StrList => {
            if let Ok(s) = obj.cast::<PyString>() {
                return Ok(Item::Str(utf8(s)?));
            }
        }
        _ => {
            if let Ok(b) = obj.cast::<PyBytes>() {
                return Ok(Item::Bytes(b.clone()));
            }
        }
    }
    Err(PyTypeError::new_err(format!(
        "SharedList items must all be str or all be bytes: item 0 is {first}, item {i} is {}",
        type_name(obj)
    )))
}

/// `items` as a list (a list as it is; a tuple or any other iterable copied into one).
fn as_list<'py>(items: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    if let Ok(list) = items.cast::<PyList>() {
        return Ok(list.clone());
    }
    if items.is_instance_of::<PyString>() || items.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "SharedList takes a list of str or bytes, not a single {}",
            type_name(items)
        )));
    }
    if let Ok(tuple) = items.cast::<PyTuple>() {
        return Ok(tuple.to_list());
    }
    let list = PyList::empty(items.py());
    for item in items.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "SharedList takes a list of str or bytes, not {}",
            type_name(items)
        ))
    })? {
        list.append(item?)?;
    }
    Ok(list)
}

/// Pass one: checks every item's type, counts the bytes, hashes the content.
fn scan(items: &Bound<'_, PyList>) -> PyResult<Plan> {
    let (kind, first) = match items.iter().next() {
        None => (Kind::StrList, String::new()),
        Some(f) if f.is_instance_of::<PyString>() => (Kind::StrList, "str".into()),
        Some(f) if f.is_instance_of::<PyBytes>() => (Kind::BytesList, "bytes".into()),
        Some(f) => {
            return Err(PyTypeError::new_err(format!(
                "SharedList items must be str or bytes: item 0 is {}",
                type_name(&f)
            )))
        }
    };
    let mut hasher = ContentHasher::new(kind);
    let mut lengths = ListPlanner::new();
    for (i, obj) in items.iter().enumerate() {
        let item = item_bytes(kind, &obj, i, &first)?;
        hasher.item(item.bytes());
        lengths.add(item.bytes().len());
    }
    Ok(Plan {
        kind,
        lengths,
        hash: hasher.finish(),
    })
}

/// Pass two: the sealed region of `items`, as `plan` counted them.
fn build_region(
    items: &Bound<'_, PyList>,
    plan: &Plan,
    key: Option<&str>,
) -> PyResult<SealedRegion> {
    let (mut header, len) = plan.lengths.layout(plan.kind).map_err(to_py)?;
    header.hash = plan.hash;
    let mut region = new_region(key, len)?;
    header.write(region.bytes_mut());
    let first = if plan.kind == Kind::StrList {
        "str"
    } else {
        "bytes"
    };
    let mut w = ListWriter::new(region.bytes_mut(), &header);
    if items.len() != plan.lengths.count() {
        return Err(to_py(SharedError::Changed));
    }
    for (i, obj) in items.iter().enumerate() {
        w.push(item_bytes(plan.kind, &obj, i, first)?.bytes())
            .map_err(to_py)?;
    }
    w.finish().map_err(to_py)?;
    region.seal().map_err(to_py)
}

fn region_of(items: &Bound<'_, PyAny>, key: Option<&str>) -> PyResult<SealedRegion> {
    let items = as_list(items)?;
    let plan = scan(&items)?;
    build_region(&items, &plan, key)
}

shared_class!(SharedList, List, region_of);

impl SharedClass for SharedList {
    const NAME: &'static str = "SharedList";
    const FAMILY: Family = Family::List;

    fn wrap(
        _py: Python<'_>,
        container: Arc<Container>,
        key: Option<String>,
    ) -> PyResult<SharedList> {
        let view = ListView::new(container.bytes(), container.header()).map_err(to_py)?;
        // SAFETY: the view borrows the container's read-only mapping, which `container`, held
        // in the same (frozen) object and never replaced, keeps mapped and unchanged.
        let view: ListView<'static> =
            unsafe { std::mem::transmute::<ListView<'_>, ListView<'static>>(view) };
        Ok(SharedList {
            view,
            kind: container.header().kind,
            container,
            key,
        })
    }

    fn nth<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        if i >= self.view.len() {
            return Ok(None);
        }
        self.item(py, i).map(Some)
    }
}

impl SharedList {
    #[inline]
    fn make(&self, py: Python<'_>, bytes: &[u8]) -> PyResult<*mut ffi::PyObject> {
        match self.kind {
            Kind::StrList => new_str(py, bytes),
            _ => new_bytes(py, bytes),
        }
    }

    fn item<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyAny>> {
        let p = self.make(py, self.view.get(i).map_err(to_py)?)?;
        // SAFETY: a new reference.
        Ok(unsafe { Bound::from_owned_ptr(py, p) })
    }

    /// Items `idx` (each < len) as a list: where each lies is read first, for all of them
    /// (`ListView::gather`, prefetching), then the objects are made, each item's bytes
    /// prefetched a few items ahead.
    fn take_indices<'py>(&self, py: Python<'py>, idx: &[usize]) -> PyResult<Bound<'py, PyList>> {
        const AHEAD: usize = 8;
        let mut items = Vec::new();
        self.view.gather(idx, &mut items).map_err(to_py)?;
        for item in items.iter().take(AHEAD) {
            prefetch_item(item);
        }
        new_list(py, items.len(), |k| {
            if let Some(later) = items.get(k + AHEAD) {
                prefetch_item(later);
            }
            self.make(py, items[k])
        })
    }
}

#[pymethods]
impl SharedList {
    #[new]
    #[pyo3(signature = (items, *, key=None))]
    fn new(py: Python<'_>, items: &Bound<'_, PyAny>, key: Option<String>) -> PyResult<SharedList> {
        let list = as_list(items)?;
        let plan = scan(&list)?;
        let container = match &key {
            None => unnamed(build_region(&list, &plan, None)?)?,
            Some(k) => keyed_by_content(py, Family::List, k, plan.hash, &mut |_| {
                build_region(&list, &plan, Some(k))
            })?,
        };
        SharedList::wrap(py, container, key)
    }

    fn __len__(&self) -> usize {
        self.view.len()
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(slice) = index.cast::<PySlice>() {
            let s = slice.indices(self.view.len() as isize)?;
            let idx: Vec<usize> = (0..s.slicelength)
                .map(|k| (s.start + k as isize * s.step) as usize)
                .collect();
            return Ok(self.take_indices(py, &idx)?.into_any());
        }
        let i = one_index(index, self.view.len(), "SharedList")?;
        self.item(py, i)
    }

    /// The items at `indices` (a list or tuple of ints, a 1-D integer array or tensor, any
    /// iterable of ints; negative ones count from the end), as a list, in one call.
    fn take<'py>(
        &self,
        py: Python<'py>,
        indices: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut idx = Vec::new();
        read_indices(indices, self.view.len(), "SharedList", &mut idx)?;
        self.take_indices(py, &idx)
    }

    fn __repr__(&self) -> String {
        let what = if self.kind == Kind::StrList {
            "str"
        } else {
            "bytes"
        };
        format!(
            "SharedList(key={}, {} {what} items, {} bytes shared)",
            self.key
                .as_deref()
                .map_or_else(|| "None".into(), |k| format!("{k:?}")),
            self.view.len(),
            self.container.bytes().len()
        )
    }
}
