//! `rloader._rloader`: the Python face of rloader's Rust core.
//!
//! One file per Python-facing type:
//! - `streams.rs`: `IndexChunks` and `BatchStream`, the index streams every sampler hands out;
//! - `samplers.rs`: the functions the Python samplers call to start a stream;
//! - `collate.rs`: the fast path of `default_collate`;
//! - `loader.rs`: `LoaderIter`, the single-process fetch-and-collate loop;
//! - `errors.rs`: how core errors become the exceptions torch raises.

use pyo3::prelude::*;

mod collate;
mod errors;
mod fetch;
mod loader;
mod samplers;
mod streams;

#[pymodule]
fn _rloader(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<streams::IndexChunks>()?;
    m.add_class::<streams::BatchStream>()?;
    m.add_class::<loader::LoaderIter>()?;
    samplers::register(m)?;
    collate::register(m)?;
    Ok(())
}
