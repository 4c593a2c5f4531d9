//! `rloader._rloader`: the Python face of rloader's Rust core.
//!
//! One file per Python-facing type:
//! - `streams.rs`: `IndexChunks` and `BatchStream`, the index streams every sampler hands out;
//! - `samplers.rs`: the functions the Python samplers call to start a stream;
//! - `collate.rs`: the fast path of `default_collate`;
//! - `fetch.rs`: the fetch-and-collate step shared by both loops;
//! - `loader.rs`: `LoaderIter`, the single-process loop;
//! - `workers.rs`: `PoolIter` and `worker_loop`, multi-process loading;
//! - `errors.rs`: how core errors become the exceptions torch raises.

use pyo3::prelude::*;

mod collate;
mod errors;
mod fetch;
mod loader;
mod samplers;
mod slots;
mod streams;
mod workers;

#[pymodule]
fn _rloader(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<streams::IndexChunks>()?;
    m.add_class::<streams::BatchStream>()?;
    m.add_class::<loader::LoaderIter>()?;
    m.add_class::<loader::LengthWarning>()?;
    samplers::register(m)?;
    collate::register(m)?;
    workers::register(m)?;
    slots::register(m)?;
    Ok(())
}
