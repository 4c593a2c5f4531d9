//! `LoaderIter`: the single-process DataLoader loop (`num_workers=0`).
//!
//! Each `__next__` takes the next batch of keys, fetches the samples and collates them, the
//! way torch's `_SingleProcessDataLoaderIter` and its fetchers do, with Python entered only for
//! the dataset (`__getitem__`, `__getitems__`, `__iter__`), a custom `collate_fn` and pinning.
//! When the keys come from an rloader sampler they stay `u64`s in Rust until the dataset is
//! called; with the default collate_fn, common batches are collated by `collate.rs`.
//!
//! Nothing here waits, so nothing releases the GIL; reentrant use (a dataset that advances the
//! iterator it is being fetched by) gets pyo3's "already borrowed" error instead of a deadlock.

use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList};

use crate::collate::fast_collate;
use crate::streams::{Batch, BatchStream};

/// Where the keys of a map-style dataset come from.
enum Keys {
    /// An rloader `BatchSampler`: batches of `u64` made in Rust.
    RustBatches(Py<BatchStream>),
    /// Any other iterator: batches (lists of keys) with auto-collation, else single keys.
    Python(Py<PyIterator>),
}

enum Fetch {
    Map {
        keys: Keys,
        batched: bool,
        getitems: Option<Py<PyAny>>,
    },
    Iterable {
        samples: Py<PyIterator>,
        batch_size: Option<usize>,
        drop_last: bool,
        ended: bool,
    },
}

/// One batch of keys for a map-style dataset.
enum KeyBatch<'py> {
    Indices(Vec<u64>),
    Object(Bound<'py, PyAny>),
}

enum Collate {
    /// `default_collate`: the fast path while `live_map == pristine`, else `general(batch)`.
    Default {
        general: Py<PyAny>,
        live_map: Py<PyDict>,
        pristine: Py<PyDict>,
    },
    Call(Py<PyAny>),
}

/// The iterator `iter(DataLoader(..., num_workers=0))` returns.
#[pyclass(module = "rloader._rloader")]
pub struct LoaderIter {
    dataset: Py<PyAny>,
    fetch: Fetch,
    collate: Collate,
    /// Pins each batch when set (CUDA available and pin_memory=True).
    pin: Option<Py<PyAny>>,
    /// `len(self)` is `len(length_of)`: the loader's index sampler, as in torch.
    length_of: Py<PyAny>,
    num_yielded: usize,
    /// For iterable datasets: the length `len(loader)` reported, to warn when exceeded.
    reported_len: Option<usize>,
    index_buf: Vec<u64>,
}

#[pymethods]
impl LoaderIter {
    /// Built by `rloader.dataloader`; every argument is keyword-only.
    ///
    /// - `keys`: `iter(loader._index_sampler)` for a map-style dataset, None for an iterable one.
    /// - `batch_size`/`drop_last`: batching of an iterable dataset (None: no auto-collation).
    /// - `default_collate`: `(general_fn, live_map, pristine_map)` when `collate_fn` is a
    ///   default collate whose fast path may run, else None.
    #[new]
    #[pyo3(signature = (*, dataset, keys, auto_collation, batch_size, drop_last, collate_fn,
                        default_collate, pin, length_of, reported_len))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: Py<PyAny>,
        keys: Option<Bound<'_, PyAny>>,
        auto_collation: bool,
        batch_size: Option<usize>,
        drop_last: bool,
        collate_fn: Py<PyAny>,
        default_collate: Option<(Py<PyAny>, Py<PyDict>, Py<PyDict>)>,
        pin: Option<Py<PyAny>>,
        length_of: Py<PyAny>,
        reported_len: Option<usize>,
    ) -> PyResult<Self> {
        let fetch = match keys {
            Some(keys) => {
                let keys = match keys.cast::<BatchStream>() {
                    Ok(stream) if auto_collation => Keys::RustBatches(stream.clone().unbind()),
                    _ => Keys::Python(keys.try_iter()?.unbind()),
                };
                let ds = dataset.bind(py);
                // torch checks `hasattr(ds, "__getitems__") and ds.__getitems__`.
                let getitems = match ds.getattr_opt("__getitems__")? {
                    Some(f) if f.is_truthy()? => Some(f.unbind()),
                    _ => None,
                };
                Fetch::Map {
                    keys,
                    batched: auto_collation,
                    getitems,
                }
            }
            None => Fetch::Iterable {
                samples: dataset.bind(py).try_iter()?.unbind(),
                batch_size,
                drop_last,
                ended: false,
            },
        };
        let collate = match default_collate {
            Some((general, live_map, pristine)) => Collate::Default {
                general,
                live_map,
                pristine,
            },
            None => Collate::Call(collate_fn),
        };
        Ok(LoaderIter {
            dataset,
            fetch,
            collate,
            pin,
            length_of,
            num_yielded: 0,
            reported_len,
            index_buf: Vec::new(),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.length_of.bind(py).len()
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(data) = self.fetch_next(py)? else {
            return Ok(None);
        };
        let mut batch = self.collate_batch(py, data)?;
        if let Some(pin) = &self.pin {
            batch = pin.bind(py).call1((batch,))?;
        }
        self.num_yielded += 1;
        if let Some(reported) = self.reported_len {
            if self.num_yielded > reported {
                let msg = format!(
                    "Length of IterableDataset {} was reported to be {}(when accessing len(dataloader)), \
                     but {} samples have been fetched. ",
                    self.dataset.bind(py).str()?,
                    reported,
                    self.num_yielded
                );
                PyErr::warn(
                    py,
                    &py.get_type::<PyUserWarning>(),
                    &std::ffi::CString::new(msg)?,
                    1,
                )?;
            }
        }
        Ok(Some(batch))
    }
}

impl LoaderIter {
    /// The next sample or list of samples, before collation; None at the end.
    fn fetch_next<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let ds = self.dataset.bind(py);
        match &mut self.fetch {
            Fetch::Map {
                keys,
                batched: false,
                ..
            } => {
                let Keys::Python(it) = keys else {
                    unreachable!("RustBatches implies batched")
                };
                match it.bind(py).clone().next() {
                    None => Ok(None),
                    Some(key) => Ok(Some(ds.get_item(key?)?)),
                }
            }
            Fetch::Map {
                keys,
                batched: true,
                getitems,
            } => {
                let batch = match keys {
                    Keys::RustBatches(stream) => {
                        match stream
                            .bind(py)
                            .borrow_mut()
                            .next_batch(py, &mut self.index_buf)?
                        {
                            None => return Ok(None),
                            Some(Batch::Indices(ix)) => KeyBatch::Indices(ix),
                            Some(Batch::Keys(k)) => {
                                KeyBatch::Object(PyList::new(py, k)?.into_any())
                            }
                        }
                    }
                    Keys::Python(it) => match it.bind(py).clone().next() {
                        None => return Ok(None),
                        Some(batch) => KeyBatch::Object(batch?),
                    },
                };
                // As torch's fetcher: `__getitems__(batch)` when the dataset has it, else one
                // `dataset[key]` per key. A batch sampler's own batch object is passed as it is.
                let samples = match (getitems.as_ref(), batch) {
                    (Some(f), KeyBatch::Indices(ix)) => {
                        let keys = PyList::new(py, &ix)?;
                        self.index_buf = ix;
                        f.bind(py).call1((keys,))?
                    }
                    (Some(f), KeyBatch::Object(keys)) => f.bind(py).call1((keys,))?,
                    (None, KeyBatch::Indices(ix)) => {
                        let samples = PyList::empty(py);
                        for &i in &ix {
                            samples.append(ds.get_item(i)?)?;
                        }
                        self.index_buf = ix;
                        samples.into_any()
                    }
                    (None, KeyBatch::Object(keys)) => {
                        let samples = PyList::empty(py);
                        for key in keys.try_iter()? {
                            samples.append(ds.get_item(key?)?)?;
                        }
                        samples.into_any()
                    }
                };
                Ok(Some(samples))
            }
            Fetch::Iterable {
                samples,
                batch_size,
                drop_last,
                ended,
            } => {
                if *ended {
                    return Ok(None);
                }
                let mut it = samples.bind(py).clone();
                let Some(want) = *batch_size else {
                    return match it.next() {
                        None => {
                            *ended = true;
                            Ok(None)
                        }
                        Some(x) => Ok(Some(x?)),
                    };
                };
                let out = PyList::empty(py);
                while out.len() < want {
                    match it.next() {
                        Some(x) => out.append(x?)?,
                        None => {
                            *ended = true;
                            break;
                        }
                    }
                }
                if out.is_empty() || (*drop_last && out.len() < want) {
                    *ended = true;
                    return Ok(None);
                }
                Ok(Some(out.into_any()))
            }
        }
    }

    fn collate_batch<'py>(
        &self,
        py: Python<'py>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.collate {
            Collate::Call(f) => f.bind(py).call1((data,)),
            Collate::Default {
                general,
                live_map,
                pristine,
            } => {
                if live_map.bind(py).eq(pristine.bind(py))? {
                    if let Some(out) = fast_collate(&data)? {
                        return Ok(out);
                    }
                }
                general.bind(py).call1((data,))
            }
        }
    }
}
