//! `rloader.shared`: read-only containers whose data lives once per node in shared memory,
//! over rloader-shared (layout, sealed memfd regions, the serving of them between processes:
//! NOTE [Serving a container] in its service.rs).
//!
//! - `list.rs`: `SharedList`, a list of `str` or `bytes`;
//! - `array.rs`: `SharedArray`, a numeric array with a zero-copy numpy view;
//! - `dict.rs`: `SharedDict`, a mapping of `str` to `int`;
//! - `items.rs`: Python objects in and out (str as UTF-8, indices of a batch read);
//! - here: how each class gets its container — built, found under a key, or attached through
//!   a pickled handle — and the handle itself.
//!
//! Waits for another process (its build, its answer) release the GIL in slices (NOTE
//! [Waiting]); building reads the user's Python objects and holds it.

mod array;
mod dict;
mod items;
mod list;

use std::sync::Arc;

use pyo3::exceptions::{PyLookupError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple};

use rloader_shared::{
    Claim, Container, Expect, Family, Ident, Name, Polled, Registry, SealedRegion, Waiting,
    WritableRegion,
};

use crate::errors::to_py;
use crate::wait;

pub use array::SharedArray;
pub use dict::SharedDict;
pub use list::SharedList;

/// Builds a container's region, with the GIL (it reads the user's Python objects).
pub(crate) type BuildRegion<'a> = &'a mut dyn FnMut(Python<'_>) -> PyResult<SealedRegion>;

/// Builds a container's region from the items a `build()` returned, labelled with a key.
pub(crate) type FromItems = dyn Fn(&Bound<'_, PyAny>, Option<&str>) -> PyResult<SealedRegion>;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SharedList>()?;
    m.add_class::<SharedArray>()?;
    m.add_class::<SharedDict>()?;
    m.add_class::<SharedIter>()?;
    m.add_function(wrap_pyfunction!(_attach_shared, m)?)?;
    Ok(())
}

/// What the three container classes have in common, for [`shared_class!`].
pub(crate) trait SharedClass: Sized {
    /// The class's name, in messages.
    const NAME: &'static str;
    const FAMILY: Family;
    /// The object over `container`, found or built under `key`.
    fn wrap(py: Python<'_>, container: Arc<Container>, key: Option<String>) -> PyResult<Self>;
    /// The `i`-th object iteration yields, or None past the end.
    fn nth<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>>;
}

/// The methods every container class has, written once: `attach`, pickling, iteration and
/// the `key`, `nbytes`, `content_hash` and `_inode` properties. The class has the fields
/// `container: Arc<Container>` and `key: Option<String>`; `$region_of(items, key)` builds a
/// region from what a `build()` returned; `$source` is its `Source` variant.
macro_rules! shared_class {
    ($class:ident, $source:ident, $region_of:path) => {
        #[pyo3::pymethods]
        impl $class {
            /// The container served on this node under `key` and `version`; if no process
            /// serves one, `build()` is called for its items and this process serves them
            /// (other processes asking meanwhile wait for it). Without `build`, LookupError.
            #[staticmethod]
            #[pyo3(signature = (key, *, version, build=None))]
            fn attach(
                py: pyo3::Python<'_>,
                key: String,
                version: &pyo3::Bound<'_, pyo3::PyAny>,
                build: Option<pyo3::Bound<'_, pyo3::PyAny>>,
            ) -> pyo3::PyResult<Self> {
                use $crate::shared::SharedClass;
                let c = $crate::shared::attach_keyed(
                    py,
                    Self::NAME,
                    Self::FAMILY,
                    &key,
                    version,
                    build,
                    &$region_of,
                )?;
                Self::wrap(py, c, Some(key))
            }

            fn __reduce__<'py>(
                &self,
                py: pyo3::Python<'py>,
            ) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::types::PyTuple>> {
                use $crate::shared::SharedClass;
                $crate::shared::reduce(py, &self.container, Self::FAMILY, self.key.as_deref())
            }

            fn __iter__(slf: pyo3::Bound<'_, Self>) -> $crate::shared::SharedIter {
                $crate::shared::SharedIter::new($crate::shared::Source::$source(slf.unbind()))
            }

            /// The key it was built or found under (None: built without one).
            #[getter]
            fn key(&self) -> Option<&str> {
                self.key.as_deref()
            }

            /// Bytes of shared memory it takes (once per node).
            #[getter]
            fn nbytes(&self) -> usize {
                self.container.bytes().len()
            }

            /// The hash of its content (hex): the same items give the same hash in every
            /// process.
            #[getter]
            fn content_hash(&self) -> String {
                rloader_shared::hex(&self.container.header().hash)
            }

            /// The inode of its memfd, as /proc/<pid>/maps shows it (tests).
            #[getter]
            fn _inode(&self) -> u64 {
                self.container.inode()
            }
        }
    };
}
pub(crate) use shared_class;

/// What a [`SharedIter`] iterates over.
pub enum Source {
    List(Py<SharedList>),
    Array(Py<SharedArray>),
    Dict(Py<SharedDict>),
}

/// The iterator of a shared container: `lst[0]`, `lst[1]`, ... (a dict's keys).
#[pyclass(module = "rloader._rloader")]
pub struct SharedIter {
    source: Source,
    next: usize,
}

impl SharedIter {
    pub fn new(source: Source) -> SharedIter {
        SharedIter { source, next: 0 }
    }
}

#[pymethods]
impl SharedIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let item = match &self.source {
            Source::List(c) => c.get().nth(py, self.next)?,
            Source::Array(c) => c.get().nth(py, self.next)?,
            Source::Dict(c) => c.get().nth(py, self.next)?,
        };
        self.next += item.is_some() as usize;
        Ok(item)
    }
}

/// A new region of `len` bytes for a container under `key` (its memfd is labelled with the
/// key, as /proc/<pid>/maps shows it).
pub(crate) fn new_region(key: Option<&str>, len: usize) -> PyResult<WritableRegion> {
    let label = format!(
        "rloader-shared:{}",
        key.map_or_else(|| "-".into(), rloader_shared::readable)
    );
    WritableRegion::create(&label, len).map_err(to_py)
}

/// Waits, without the GIL, for the region `waiting` is to receive: the container, or None when
/// its server closed the connection first (it failed or died: the name is to be claimed again).
fn wait_for(py: Python<'_>, mut waiting: Waiting) -> PyResult<Option<Arc<Container>>> {
    let polled = wait::until(
        py,
        None,
        |len| match waiting.poll(len) {
            Ok(Polled::Pending) => None,
            other => Some(other),
        },
        || Ok(None),
    )?
    .expect("a wait without a deadline ends with a value");
    match polled.map_err(to_py)? {
        Polled::Ready(c) => Ok(Some(c)),
        Polled::Closed => Ok(None),
        Polled::Pending => unreachable!("a pending poll goes on waiting"),
    }
}

/// The container named `name`: the one this process holds already; else the copy another
/// process serves (waiting while it is built); else, with `build`, the one built here and
/// served from now on (other processes waiting for it meanwhile). Without `build`, a name
/// nobody serves is a LookupError saying `what` was looked for.
pub(crate) fn open(
    py: Python<'_>,
    name: &Name,
    expect: Expect,
    mut build: Option<BuildRegion<'_>>,
    what: &dyn Fn() -> String,
) -> PyResult<Arc<Container>> {
    let service = Registry::global();
    loop {
        if let Some(c) = service.local(name) {
            if !matches!(expect.hash, Some(h) if h != c.header().hash) {
                return Ok(c);
            }
        }
        let waiting = match build.as_mut() {
            Some(build) => match py.detach(|| service.claim(name, expect)).map_err(to_py)? {
                Claim::Build(builder) => return builder.serve(build(py)?).map_err(to_py),
                Claim::Wait(w) => w,
            },
            None => match py.detach(|| service.connect(name, expect)).map_err(to_py)? {
                Some(w) => w,
                None => return Err(PyLookupError::new_err(what())),
            },
        };
        if let Some(c) = wait_for(py, waiting)? {
            return Ok(c);
        }
    }
}

/// `version` as a name takes it: a str, or an int written in decimal.
pub(crate) fn version_text(version: &Bound<'_, PyAny>) -> PyResult<String> {
    if version.is_instance_of::<PyString>() || version.is_instance_of::<PyInt>() {
        return Ok(version.str()?.to_string());
    }
    Err(PyTypeError::new_err(format!(
        "version must be a str or an int, not {}",
        version.get_type().name()?
    )))
}

/// The container of `SharedX.attach(key, version=..., build=...)`: found under (key, version),
/// or built from what `build()` returns by `from_items`.
pub(crate) fn attach_keyed(
    py: Python<'_>,
    class: &str,
    family: Family,
    key: &str,
    version: &Bound<'_, PyAny>,
    build: Option<Bound<'_, PyAny>>,
    from_items: &FromItems,
) -> PyResult<Arc<Container>> {
    let version = version_text(version)?;
    let name = Name::keyed(family, key, Ident::Version(&version));
    let expect = Expect { family, hash: None };
    let mut run_build = |_: Python<'_>| -> PyResult<SealedRegion> {
        let items = build.as_ref().expect("called only with a build").call0()?;
        from_items(&items, Some(key))
    };
    let what = || {
        format!(
            "no process on this node serves the {class} with key {key:?} and version {version:?} \
             (give build= to build it here)"
        )
    };
    let build_fn: Option<BuildRegion<'_>> = if build.is_some() {
        Some(&mut run_build)
    } else {
        None
    };
    open(py, &name, expect, build_fn, &what)
}

/// The container of `SharedX(items, key=...)`: the copy of the same items (same content hash)
/// another process serves under `key`, or `region()` built here and served.
pub(crate) fn keyed_by_content(
    py: Python<'_>,
    family: Family,
    key: &str,
    hash: [u8; 16],
    region: BuildRegion<'_>,
) -> PyResult<Arc<Container>> {
    let name = Name::keyed(family, key, Ident::Content(hash));
    let expect = Expect {
        family,
        hash: Some(hash),
    };
    open(py, &name, expect, Some(region), &|| String::new())
}

/// A container built here without a key: found by no other process until pickled.
pub(crate) fn unnamed(region: SealedRegion) -> PyResult<Arc<Container>> {
    Container::unnamed(region, Registry::global()).map_err(to_py)
}

/// What pickles a container: `(_attach_shared, (family, name, content hash, key))`. The
/// container is published first (a container built without a key starts being served).
pub(crate) fn reduce<'py>(
    py: Python<'py>,
    container: &Arc<Container>,
    family: Family,
    key: Option<&str>,
) -> PyResult<Bound<'py, PyTuple>> {
    let name = container.publish(family).map_err(to_py)?;
    let attach = py.import("rloader._rloader")?.getattr("_attach_shared")?;
    let args = (
        family.label(),
        PyBytes::new(py, name.as_bytes()),
        PyBytes::new(py, &container.header().hash),
        key,
    );
    PyTuple::new(py, [attach, args.into_pyobject(py)?.into_any()])
}

/// Unpickles a container's handle: the container this process holds under the name, or the
/// copy its server sends (no data is copied). A LookupError when no process serves it any
/// more; a ValueError when the one served has other content than the handle's.
#[pyfunction]
fn _attach_shared(
    py: Python<'_>,
    family: &str,
    name: &[u8],
    hash: &[u8],
    key: Option<String>,
) -> PyResult<Py<PyAny>> {
    let family = match family {
        "list" => Family::List,
        "array" => Family::Array,
        "map" => Family::Map,
        other => {
            return Err(PyTypeError::new_err(format!(
                "unknown container family {other:?}"
            )))
        }
    };
    let name = Name::from_bytes(name).map_err(to_py)?;
    let hash: [u8; 16] = hash
        .try_into()
        .map_err(|_| PyTypeError::new_err("a content hash is 16 bytes"))?;
    let expect = Expect {
        family,
        hash: Some(hash),
    };
    let what = || {
        format!(
            "no process on this node holds the shared container {name} (key {key:?}) any more: \
             the process that built it and every process that attached to it have ended"
        )
    };
    let container = open(py, &name, expect, None, &what)?;
    Ok(match family {
        Family::List => Py::new(py, SharedList::wrap(py, container, key)?)?.into_any(),
        Family::Array => Py::new(py, SharedArray::wrap(py, container, key)?)?.into_any(),
        Family::Map => Py::new(py, SharedDict::wrap(py, container, key)?)?.into_any(),
    })
}
