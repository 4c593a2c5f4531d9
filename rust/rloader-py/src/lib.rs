//! `rloader._rloader`: the Python face of rloader's Rust core.
//!
//! One folder per concern, as pydantic-core groups `src/input/`, `src/validators/`:
//! - `sampling/`: where indices and keys come from: the sampler functions (whose index
//!   arithmetic, shuffles included, is rloader-core's), the index streams `IndexChunks` and
//!   `BatchStream`, and `SamplerKeys`, batches of keys as every loop takes them;
//! - `fetch.rs`: `Fetcher`, one batch of keys in, one collated batch out, shared by every loop,
//!   and `BatchOptions`, how each batch is made (what the single-process loop and worker
//!   threads are built with);
//! - `collate/`: the fast path of `default_collate`, and its stack helpers;
//! - `single_process.rs`: `LoaderIter`, the single-process loop (`num_workers=0`);
//! - `handout/`: handing batches out, what both multi-worker iterators share (`HandOutOptions`,
//!   `HandOutState`, `Answer`, `HandOuts`, `LengthWarning`);
//! - `process/`: worker processes, where a batch crosses the process boundary: `PoolRegion`,
//!   `PoolIter` (the main process's side), `worker_loop` (a worker's), `KeyFeed`;
//! - `threads/`: worker threads: `ThreadPool`, a worker thread's loop, `ThreadIter`;
//! - `memory/`: who owns a batch's bytes and who frees them: the buffer protocol written once,
//!   batch slots (`SlotView`, `Lease`), the recycled batch memory (`BatchBuffers`), and pinning
//!   (`PinnedSlots`, `PinnedBlocks`);
//! - `shared/`: `rloader.shared`'s read-only containers in shared memory, one copy per node
//!   (`SharedList`, `SharedArray`, `SharedDict`, over rloader-shared);
//! - `vision.rs`: rloader.vision's encoded files and the steps run on them (rloader-vision);
//! - `torch_api.rs`: the torch objects the crate calls, looked up once;
//! - `stats.rs`: `Stats`, where an epoch's time went (`DataLoader.stats()`);
//! - `wait.rs`: waiting without the GIL (NOTE [Waiting]);
//! - `errors.rs`: how core errors become the exceptions torch raises.
//!
//! What needs no interpreter lives in the pure-Rust crates: index arithmetic in rloader-core,
//! batch memory in rloader-memory, the rings in rloader-queue, the pool's scheduler, messages,
//! layout and slots in rloader-workers, the shared containers' layout and serving in
//! rloader-shared.

use pyo3::prelude::*;

mod collate;
mod errors;
mod fetch;
mod gil_probe;
mod handout;
mod memory;
mod process;
mod sampling;
mod shared;
mod single_process;
mod stats;
mod threads;
mod torch_api;
mod vision;
mod wait;

/// Free-threaded CPython (3.13t, 3.14t): the module declares that it does not need the GIL, so
/// thread workers (threads/) run in parallel there. Nothing in this crate relies on the GIL
/// for mutual exclusion: the `#[pyclass]` types are either `frozen` with their mutable parts
/// behind mutexes or atomics (`ThreadPool`, `Reporter`), or borrowed mutably through PyO3's
/// runtime borrow checking, which is atomic on those builds (two threads advancing one
/// iterator get "Already borrowed", never a race); the process-wide caches are `PyOnceLock`s;
/// a worker's batch slots are thread-local (memory/slots.rs). On a standard build this changes
/// nothing.
#[pymodule(gil_used = false)]
fn _rloader(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<sampling::IndexChunks>()?;
    m.add_class::<sampling::BatchStream>()?;
    m.add_class::<sampling::KeySegment>()?;
    m.add_class::<fetch::BatchOptions>()?;
    m.add_class::<single_process::LoaderIter>()?;
    m.add_class::<handout::LengthWarning>()?;
    sampling::register(m)?;
    collate::register(m)?;
    m.add_class::<handout::HandOutOptions>()?;
    m.add_class::<process::PoolIter>()?;
    m.add_class::<handout::HandOuts>()?;
    m.add_class::<process::KeyFeed>()?;
    m.add_class::<memory::Message>()?;
    m.add_class::<process::PoolRegion>()?;
    m.add_function(wrap_pyfunction!(process::worker_loop, m)?)?;
    m.add_class::<threads::ThreadPool>()?;
    m.add_class::<threads::PoolStopper>()?;
    m.add_class::<threads::ThreadIter>()?;
    m.add_class::<threads::Reporter>()?;
    m.add_class::<stats::Stats>()?;
    m.add_class::<gil_probe::GilProbe>()?;
    m.add_class::<memory::SlotView>()?;
    m.add_class::<memory::Lease>()?;
    m.add_class::<memory::PooledView>()?;
    m.add_class::<memory::BatchBuffers>()?;
    m.add_function(wrap_pyfunction!(memory::slots::py_slot_empty, m)?)?;
    m.add_function(wrap_pyfunction!(memory::slots::in_slot_worker, m)?)?;
    m.add_function(wrap_pyfunction!(memory::stacking::batch_empty, m)?)?;
    shared::register(m)?;
    vision::register(m)?;
    Ok(())
}
