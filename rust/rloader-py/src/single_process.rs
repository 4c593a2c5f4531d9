//! `LoaderIter`: the single-process DataLoader loop (`num_workers=0`).
//!
//! Each `__next__` takes the next batch of keys and hands it to the `Fetcher` (fetch.rs), the
//! way torch's `_SingleProcessDataLoaderIter` does. When the keys come from an rloader
//! `BatchSampler` they stay `u64`s in Rust until the dataset is called.
//!
//! Nothing here waits, so nothing releases the GIL; reentrant use (a dataset that advances the
//! iterator it is being fetched by) gets pyo3's "already borrowed" error instead of a deadlock.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::errors::not_picklable;
use crate::fetch::{BatchOptions, Fetcher};
use crate::handout::LengthWarning;
use crate::sampling::SamplerKeys;
use crate::stats::{Stage, Stats};

/// The iterator `iter(DataLoader(..., num_workers=0))` returns.
#[pyclass(module = "rloader._rloader", weakref)]
pub struct LoaderIter {
    /// None for an iterable-style dataset.
    keys: Option<SamplerKeys>,
    fetcher: Fetcher,
    /// Pins each batch when set (an accelerator is available and pin_memory=True).
    pin: Option<Py<PyAny>>,
    /// `len(self)` is `len(length_of)`: the loader's index sampler, as in torch.
    length_of: Py<PyAny>,
    /// For iterable datasets whose `len(loader)` was asked: warns when it is exceeded.
    len_warning: Option<LengthWarning>,
    index_buf: Vec<u64>,
    /// Cleared by the garbage collector: yields nothing more.
    cleared: bool,
    /// Batches handed out this epoch (as batches or as their errors), and whether it ended.
    taken: u64,
    finished: bool,
    /// Where this epoch's time went (`DataLoader.stats()`).
    stats: Py<Stats>,
}

#[pymethods]
impl LoaderIter {
    /// Built by `rloader.dataloader`; every argument is keyword-only.
    ///
    /// - `keys`: `iter(loader._index_sampler)` for a map-style dataset, None for an iterable one.
    /// - `batch`: how each batch is made (`BatchOptions` in fetch.rs: collation, batching of an
    ///   iterable dataset, pinning, batch memory).
    /// - `length_of`: `len(self)` is `len(length_of)`; `reported_len`: an iterable dataset's
    ///   `len(loader)`, if it was asked (torch's warning past it).
    /// - `exhausted`: a resumed epoch whose iterable dataset had ended: nothing more comes
    ///   (`iter(dataset)` is not called).
    #[new]
    #[pyo3(signature = (*, dataset, keys, batch, length_of, reported_len, exhausted=false))]
    fn new(
        py: Python<'_>,
        dataset: Py<PyAny>,
        keys: Option<Bound<'_, PyAny>>,
        batch: PyRef<'_, BatchOptions>,
        length_of: Py<PyAny>,
        reported_len: Option<usize>,
        exhausted: bool,
    ) -> PyResult<Self> {
        let len_warning =
            LengthWarning::new(reported_len.map(|n| (dataset.clone_ref(py), n)), false);
        let stats = Py::new(py, Stats::new())?;
        let (keys, fetcher) = match keys {
            Some(keys) => (
                Some(SamplerKeys::new(&keys, batch.auto_collation())?),
                batch.fetcher(py, dataset, None)?,
            ),
            None => {
                let samples = if exhausted {
                    pyo3::types::PyTuple::empty(py).try_iter()?.unbind()
                } else {
                    dataset.bind(py).try_iter()?.unbind()
                };
                (None, batch.fetcher(py, dataset, Some(samples))?)
            }
        };
        let fetcher = fetcher.with_stats(stats.clone_ref(py));
        Ok(LoaderIter {
            keys,
            fetcher,
            pin: batch.pin(py),
            length_of,
            len_warning,
            index_buf: Vec::new(),
            cleared: false,
            taken: 0,
            finished: false,
            stats,
        })
    }

    /// This epoch's `Stats`.
    #[getter]
    fn _stats(&self, py: Python<'_>) -> Py<Stats> {
        self.stats.clone_ref(py)
    }

    /// Whether an iterable dataset's iterator has ended (its last batch, if short, may not have
    /// been handed out yet): a resume then makes nothing more of it.
    #[getter]
    fn _exhausted(&self) -> bool {
        self.fetcher.ended()
    }

    /// (batches of keys taken from the sampler, whether the epoch has ended): a batch whose
    /// fetch failed was handed out too, as an exception. `DataLoader.state_dict()` reads it.
    #[getter]
    fn _progress(&self) -> (u64, bool) {
        (self.taken, self.finished)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.length_of.bind(py).len()
    }

    /// Iterators do not pickle: torch's error.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable("LoaderIter"))
    }

    // A dataset (or sampler) that refers to the iterator makes a cycle; the garbage collector
    // must see through the Rust side to free it, as it frees torch's pure-Python iterator.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(keys) = &self.keys {
            keys.traverse(&visit)?;
        }
        self.fetcher.traverse(&visit)?;
        visit.call(&self.pin)?;
        if let Some(warning) = &self.len_warning {
            warning.traverse(&visit)?;
        }
        visit.call(&self.length_of)
    }

    fn __clear__(&mut self) {
        self.keys = None;
        self.pin = None;
        self.len_warning = None;
        self.cleared = true;
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let stats = self.stats.clone_ref(py);
        stats.get().next_called();
        let next = self.next_batch(py);
        stats.get().next_returned(matches!(next, Ok(Some(_))));
        next
    }
}

impl LoaderIter {
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.cleared {
            return Ok(None);
        }
        let batch = match &self.keys {
            Some(keys) => match keys.next(py, &mut self.index_buf)? {
                None => {
                    self.finished = true;
                    return Ok(None);
                }
                Some(k) => {
                    self.taken += 1;
                    self.fetcher.fetch_keys(py, k, &mut self.index_buf)?
                }
            },
            None => match self.fetcher.fetch_next(py) {
                Ok(None) => {
                    self.finished = true;
                    return Ok(None);
                }
                Ok(Some(b)) => {
                    self.taken += 1;
                    b
                }
                Err(e) => {
                    self.taken += 1; // a batch handed out as its error
                    return Err(e);
                }
            },
        };
        let batch = match &self.pin {
            Some(pin) => self
                .stats
                .get()
                .time(Stage::Pin, || pin.bind(py).call1((batch,)))?,
            None => batch,
        };
        if let Some(warning) = &mut self.len_warning {
            warning.yielded(py)?;
        }
        Ok(Some(batch))
    }
}
