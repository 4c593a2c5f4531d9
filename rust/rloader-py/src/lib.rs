//! `rloader._rloader`: the Python face of rloader's Rust core.
//!
//! One file per Python-facing family:
//! - `streams.rs`: `IndexChunks` and `BatchStream`, the index streams every sampler hands out;
//! - `samplers.rs`: the functions the Python samplers call to start a stream;
//! - `collate.rs`: the fast path of `default_collate`;
//! - `fetch.rs`: the fetch-and-collate step shared by both loops;
//! - `loader.rs`: `LoaderIter`, the single-process loop;
//! - `length_warning.rs`: `LengthWarning`, torch's warning past an IterableDataset's length;
//! - `pool.rs`: `PoolIter`, the main process's side of multi-process loading;
//! - `handouts.rs`: `HandOuts`, what a PoolIter handed out (for `DataLoader.state_dict()`);
//! - `key_feed.rs`: `KeyFeed`, keys drawn on the main thread for the pin thread's `PoolIter`;
//! - `region.rs`: `PoolRegion`, the shared memory of a loader's worker pools;
//! - `pinned.rs`: `PinnedSlots`, a region's slots registered with the accelerator's driver;
//! - `worker.rs`: `worker_loop`, a worker process's side;
//! - `threads.rs`: `ThreadPool` and `ThreadIter`, loading with worker threads;
//! - `slots.rs`: a worker's batch slots as its collate reaches them (`slot_empty`);
//! - `buffers.rs`: every buffer-protocol export and read (`Message`, `SlotView`, `Lease`);
//! - `wait.rs`: waiting without the GIL (NOTE [Waiting]);
//! - `stats.rs`: `Stats`, where an epoch's time went (`DataLoader.stats()`);
//! - `errors.rs`: how core errors become the exceptions torch raises.
//!
//! What needs no interpreter lives in the pure-Rust crates: index arithmetic in rloader-core,
//! batch memory in rloader-memory, the rings in rloader-queue, the pool's scheduler, messages,
//! layout and slots in rloader-workers.

use pyo3::prelude::*;

mod buffers;
mod collate;
mod errors;
mod fetch;
mod handouts;
mod key_feed;
mod length_warning;
mod loader;
mod pinned;
mod pool;
mod region;
mod samplers;
mod slots;
mod stats;
mod streams;
mod threads;
mod wait;
mod worker;

/// Free-threaded CPython (3.13t, 3.14t): the module declares that it does not need the GIL, so
/// thread workers (threads.rs) run in parallel there. Nothing in this crate relies on the GIL
/// for mutual exclusion: the `#[pyclass]` types are either `frozen` with their mutable parts
/// behind mutexes or atomics (`ThreadPool`, `Reporter`), or borrowed mutably through PyO3's
/// runtime borrow checking, which is atomic on those builds (two threads advancing one
/// iterator get "Already borrowed", never a race); the process-wide caches are `PyOnceLock`s;
/// a worker's batch slots are thread-local (slots.rs). On a standard build this changes nothing.
#[pymodule(gil_used = false)]
fn _rloader(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<streams::IndexChunks>()?;
    m.add_class::<streams::BatchStream>()?;
    m.add_class::<loader::LoaderIter>()?;
    m.add_class::<length_warning::LengthWarning>()?;
    samplers::register(m)?;
    collate::register(m)?;
    m.add_class::<pool::PoolIter>()?;
    m.add_class::<handouts::HandOuts>()?;
    m.add_class::<key_feed::KeyFeed>()?;
    m.add_class::<buffers::Message>()?;
    m.add_class::<region::PoolRegion>()?;
    m.add_function(wrap_pyfunction!(worker::worker_loop, m)?)?;
    m.add_class::<threads::ThreadPool>()?;
    m.add_class::<threads::ThreadIter>()?;
    m.add_class::<threads::Reporter>()?;
    m.add_class::<stats::Stats>()?;
    m.add_class::<buffers::SlotView>()?;
    m.add_class::<buffers::Lease>()?;
    m.add_class::<buffers::PooledView>()?;
    m.add_class::<buffers::BatchBuffers>()?;
    m.add_function(wrap_pyfunction!(slots::py_slot_empty, m)?)?;
    m.add_function(wrap_pyfunction!(slots::in_slot_worker, m)?)?;
    Ok(())
}
