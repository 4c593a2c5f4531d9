//! The functions the Python samplers call to start their index streams.
//!
//! Each takes the seed the Python side drew (see `python/rloader/_seed.py`) and returns a
//! ready stream or a list; all the index arithmetic is in `rloader-core`.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyZeroDivisionError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::Arc;

use super::streams::{plain, IndexChunks, Indices};
use crate::errors::CoreError;
use rloader_core::{distributed, random, weighted, Rng};

/// `0, 1, …, n-1`: SequentialSampler's stream.
#[pyfunction]
fn sequential(n: u64) -> IndexChunks {
    IndexChunks::ready(plain(0..n))
}

/// RandomSampler's stream.
#[pyfunction]
fn random_indices(
    py: Python<'_>,
    n: u64,
    num_samples: u64,
    replacement: bool,
    seed: u64,
) -> IndexChunks {
    // Building the first permutation of a large dataset takes a while: let other threads run.
    let it = py.detach(|| random::RandomIndices::new(n, num_samples, replacement, seed));
    IndexChunks::ready(plain(it))
}

/// SubsetRandomSampler's stream over non-negative integer indices.
#[pyfunction]
fn subset_indices(py: Python<'_>, indices: Vec<u64>, seed: u64) -> IndexChunks {
    let order = py.detach(|| {
        let mut rng = Rng::from_seed(seed);
        random::permutation(indices.len() as u64, &mut rng)
    });
    IndexChunks::ready(plain(order.into_iter().map(move |p| indices[p as usize])))
}

/// WeightedRandomSampler's stream. `weights` is a contiguous float64 buffer.
#[pyfunction]
fn weighted_indices(
    py: Python<'_>,
    weights: &Bound<'_, PyAny>,
    num_samples: u64,
    replacement: bool,
    seed: u64,
) -> PyResult<IndexChunks> {
    let buffer = PyBuffer::<f64>::get(weights)?;
    // A private copy, so the table is built with the GIL released; in huge pages when large.
    let mut weights = rloader_core::buffer::filled(0.0f64, buffer.item_count());
    buffer.copy_to_slice(py, &mut weights)?;
    let stream: Indices = py.detach(|| -> Result<_, CoreError> {
        Ok(if replacement {
            let table = Arc::new(weighted::AliasTable::new(&weights)?);
            // NOTE [Prefetched indices]: the draws overlap the consumer's ints.
            Box::new(rloader_core::prefetch::Prefetched::new(
                weighted::WeightedIndices::new(table, num_samples, seed),
            )) as Indices
        } else {
            plain(weighted::weighted_without_replacement(&weights, num_samples, seed)?.into_iter())
        })
    })?;
    Ok(IndexChunks::ready(stream))
}

/// A random permutation of `0..n` as a list (random_split's order).
#[pyfunction]
fn permutation(py: Python<'_>, n: u64, seed: u64) -> PyResult<Bound<'_, PyList>> {
    let perm = py.detach(|| random::permutation(n, &mut Rng::from_seed(seed)));
    PyList::new(py, perm)
}

/// DistributedSampler's `(num_samples, total_size)`, as torch computes them (rloader-core's
/// `distributed_sizes`).
#[pyfunction]
fn distributed_sizes(n: u64, num_replicas: u64, drop_last: bool) -> PyResult<(u64, u128)> {
    if num_replicas == 0 {
        // Python's error for the same arithmetic (DistributedSampler's rank check comes first).
        return Err(PyZeroDivisionError::new_err(
            "integer division or modulo by zero",
        ));
    }
    Ok(distributed::distributed_sizes(n, num_replicas, drop_last))
}

/// This rank's shard of DistributedSampler's order, as a list.
///
/// The two shard functions take DistributedSampler's seven numbers and no `py` (clippy's bound
/// on parameters): Python calls them, so the thread is attached, and `Python::attach` only gives
/// its token, to make the shard with the GIL released (a shuffled shard of a large dataset
/// takes a while).
#[pyfunction]
fn distributed_indices(
    n: u64,
    num_replicas: u64,
    rank: u64,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    num_samples: u64,
) -> PyResult<Py<PyList>> {
    Python::attach(|py| {
        let shard = py.detach(|| {
            distributed::distributed_shard(n, num_replicas, rank, shuffle, seed, epoch, num_samples)
        });
        Ok(PyList::new(py, shard)?.unbind())
    })
}

/// The same shard as a stream, for BatchSampler and the DataLoader.
#[pyfunction]
fn distributed_stream(
    n: u64,
    num_replicas: u64,
    rank: u64,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    num_samples: u64,
) -> IndexChunks {
    let shard = Python::attach(|py| {
        py.detach(|| {
            distributed::distributed_shard(n, num_replicas, rank, shuffle, seed, epoch, num_samples)
        })
    });
    IndexChunks::ready(plain(shard.into_iter()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sequential, m)?)?;
    m.add_function(wrap_pyfunction!(random_indices, m)?)?;
    m.add_function(wrap_pyfunction!(subset_indices, m)?)?;
    m.add_function(wrap_pyfunction!(weighted_indices, m)?)?;
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    m.add_function(wrap_pyfunction!(distributed_indices, m)?)?;
    m.add_function(wrap_pyfunction!(distributed_stream, m)?)?;
    m.add_function(wrap_pyfunction!(distributed_sizes, m)?)?;
    Ok(())
}
