//! Keys as the loops take them: batches of keys from `iter(loader._index_sampler)`.

use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyList};
use pyo3::{PyTraverseError, PyVisit};

use super::streams::{Batch, BatchStream};

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
    /// Any other iterator: batches (lists of keys) with auto-collation, else single keys.
    Python(Py<PyIterator>),
}

impl SamplerKeys {
    /// `iter(loader._index_sampler)` as a key source.
    pub fn new(keys: &Bound<'_, PyAny>, auto_collation: bool) -> PyResult<SamplerKeys> {
        Ok(match keys.cast::<BatchStream>() {
            Ok(stream) if auto_collation => SamplerKeys::RustBatches(stream.clone().unbind()),
            _ => SamplerKeys::Python(keys.try_iter()?.unbind()),
        })
    }

    /// Lets the garbage collector see the sampler's iterator.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            SamplerKeys::RustBatches(stream) => visit.call(stream),
            SamplerKeys::Python(it) => visit.call(it),
        }
    }

    /// The next batch of keys, or None when the sampler is exhausted.
    pub fn next<'py>(
        &self,
        py: Python<'py>,
        buf: &mut Vec<u64>,
    ) -> PyResult<Option<KeyBatch<'py>>> {
        Ok(match self {
            SamplerKeys::RustBatches(stream) => {
                match stream.bind(py).borrow_mut().next_batch(py, buf)? {
                    None => None,
                    Some(Batch::Indices(ix)) => Some(KeyBatch::Indices(ix)),
                    Some(Batch::Keys(k)) => Some(KeyBatch::Object(PyList::new(py, k)?.into_any())),
                }
            }
            SamplerKeys::Python(it) => match it.bind(py).clone().next() {
                None => None,
                Some(batch) => Some(KeyBatch::Object(batch?)),
            },
        })
    }
}
