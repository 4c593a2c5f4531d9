//! Keys as the loops take them: batches of keys from `iter(loader._index_sampler)`.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyList};
use pyo3::{PyTraverseError, PyVisit};

use super::streams::{Batch, BatchStream};

/// One engine's share of an auto loader's epoch of keys (NOTE [Auto workers] in _auto/__init__.py): the
/// stream's batches until it ends or the share is closed, after which the next engine's share
/// goes on with the same stream. Loops take it as they take the stream (in Rust, no Python list
/// per batch); `closed` is an atomic so that closing needs no mutable borrow while an engine
/// holds a shared one.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct KeySegment {
    stream: Py<BatchStream>,
    closed: AtomicBool,
}

impl KeySegment {
    fn next_batch(&self, py: Python<'_>, buf: &mut Vec<u64>) -> PyResult<Option<Batch>> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(None);
        }
        // (an error, not a panic: as `SamplerKeys::next`)
        let stream = self.stream.bind(py);
        let mut stream = stream.try_borrow_mut()?;
        stream.next_batch(py, buf)
    }
}

#[pymethods]
impl KeySegment {
    #[new]
    fn new(stream: Py<BatchStream>) -> Self {
        KeySegment {
            stream,
            closed: AtomicBool::new(false),
        }
    }

    /// Ends this share: it draws nothing more (to its engine the sampler has ended).
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let mut buf = Vec::new();
        let batch = self.next_batch(py, &mut buf)?;
        batch.map(|b| b.into_list(py)).transpose()
    }
}

/// One batch of keys for a map-style dataset.
pub enum KeyBatch<'py> {
    /// Made by an rloader sampler: plain indices.
    Indices(Vec<u64>),
    /// Whatever a user's sampler yielded (a batch, or one key without auto-collation).
    Object(Bound<'py, PyAny>),
}

/// Where the keys of a map-style dataset come from.
pub enum SamplerKeys {
    /// An rloader `BatchSampler`: batches of `u64` made in Rust.
    RustBatches(Py<BatchStream>),
    /// An auto engine's share of one (`KeySegment`).
    RustSegment(Py<KeySegment>),
    /// Any other iterator: batches (lists of keys) with auto-collation, else single keys.
    Python(Py<PyIterator>),
}

impl SamplerKeys {
    /// `iter(loader._index_sampler)` as a key source.
    pub fn new(keys: &Bound<'_, PyAny>, auto_collation: bool) -> PyResult<SamplerKeys> {
        if auto_collation {
            if let Ok(stream) = keys.cast::<BatchStream>() {
                return Ok(SamplerKeys::RustBatches(stream.clone().unbind()));
            }
            if let Ok(segment) = keys.cast::<KeySegment>() {
                return Ok(SamplerKeys::RustSegment(segment.clone().unbind()));
            }
        }
        Ok(SamplerKeys::Python(keys.try_iter()?.unbind()))
    }

    /// Lets the garbage collector see the sampler's iterator.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            SamplerKeys::RustBatches(stream) => visit.call(stream),
            SamplerKeys::RustSegment(segment) => visit.call(segment),
            SamplerKeys::Python(it) => visit.call(it),
        }
    }

    /// The next batch of keys, or None when the sampler is exhausted.
    pub fn next<'py>(
        &self,
        py: Python<'py>,
        buf: &mut Vec<u64>,
    ) -> PyResult<Option<KeyBatch<'py>>> {
        let made = match self {
            // (an error, not a panic, if a user's sampler draws from this loader while it draws)
            SamplerKeys::RustBatches(stream) => {
                stream.bind(py).try_borrow_mut()?.next_batch(py, buf)?
            }
            SamplerKeys::RustSegment(segment) => segment.get().next_batch(py, buf)?,
            SamplerKeys::Python(it) => {
                return Ok(match it.bind(py).clone().next() {
                    None => None,
                    Some(batch) => Some(KeyBatch::Object(batch?)),
                });
            }
        };
        Ok(match made {
            None => None,
            Some(Batch::Indices(ix)) => Some(KeyBatch::Indices(ix)),
            Some(keys) => Some(KeyBatch::Object(keys.into_list(py)?.into_any())),
        })
    }
}
