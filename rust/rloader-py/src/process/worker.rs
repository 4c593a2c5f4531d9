//! `worker_loop`: a worker process's side of multi-process loading.
//!
//! The worker maps its pool's region through the descriptor it was given, takes tasks from its
//! task ring (NOTE [Pool protocol] in rloader-workers' wire.rs), fetches and collates each batch
//! (fetch.rs) into a free batch slot when there is one (NOTE [Slots] in rloader-workers'
//! slots.rs), and answers through its answer ring, until the main process closes the ring or
//! is gone. It waits on its ring in slices (NOTE [Waiting] in wait.rs), and between slices
//! checks that the main process is still there (`MainProcess`, rloader-workers' parent.rs).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use rloader_queue::{Doorbell, QueueError, Ring, ShmRegion};
use rloader_workers::layout::DOORBELL_AT;
use rloader_workers::wire::{self, kind, BatchMessage, HEADER};
use rloader_workers::{times, Layout, MainProcess, PoolError};

use crate::errors::to_py;
use crate::fetch::{Collate, Fetcher};
use crate::memory::{contiguous_bytes, slots, stacking};
use crate::sampling::KeyBatch;
use crate::stats::{Stage, Stats};
use crate::vision;
use crate::wait;

/// What a worker needs to run its loop: the spec `start_pool` sends each worker, with what
/// `_worker_main` made of it (python/rloader/_engines/process/worker.py), as a dict (other keys
/// are ignored).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct WorkerSpec<'py> {
    /// The pool region's descriptor, in this process.
    region_fd: i32,
    worker_id: usize,
    /// The pool's shape, from which the region's `Layout` follows.
    num_workers: usize,
    prefetch_factor: usize,
    dataset: Py<PyAny>,
    /// An iterable-style dataset: every task is "the next batch" of `samples`.
    iterable: bool,
    /// `iter(dataset)` for an iterable dataset; None when making it failed (`init_error`).
    samples: Option<Bound<'py, PyAny>>,
    /// torch's auto-collation: keys come in batches (map-style datasets).
    auto_collation: bool,
    /// Batching of an iterable dataset (None: no auto-collation).
    batch_size: Option<usize>,
    drop_last: bool,
    collate_fn: Py<PyAny>,
    /// The `CollatePlan` (python/rloader/_collate.py) when `collate_fn` is a default collate.
    collate_plan: Option<Bound<'py, PyAny>>,
    /// The pickled error of `worker_init_fn` or `iter(dataset)`, the answer to the first task.
    init_error: Option<Py<PyBytes>>,
    /// The process that owns the loader (not always this worker's parent).
    parent_pid: i32,
    /// `_WorkerHooks`: what only Python does (pickling, a new epoch's iterator).
    hooks: Py<PyAny>,
}

/// A worker process's loop: take tasks, fetch and collate, send answers, until told to stop.
#[pyfunction]
pub fn worker_loop(py: Python<'_>, spec: WorkerSpec<'_>) -> PyResult<()> {
    let WorkerSpec {
        region_fd,
        worker_id,
        num_workers,
        prefetch_factor,
        dataset,
        iterable,
        samples,
        auto_collation,
        batch_size,
        drop_last,
        collate_fn,
        collate_plan,
        init_error,
        parent_pid,
        hooks,
    } = spec;
    // A worker must never outlive its loader (rloader-workers' parent.rs).
    let main = MainProcess::new(parent_pid);
    let layout = Layout::new(num_workers, prefetch_factor);
    // SAFETY: the descriptor multiprocessing gave this process for the pool's region (or, under
    // fork, the main process's, inherited); nothing else in this process uses or closes it.
    let shm = Arc::new(
        unsafe { ShmRegion::from_fd(region_fd, "rloader DataLoader workers") }.map_err(to_py)?,
    );
    if main.gone() {
        return Ok(());
    }
    let (task_at, task_len) = layout.task_ring(worker_id);
    let (answer_at, answer_len) = layout.answer_ring(worker_id);
    let tasks = Ring::attach(shm.clone(), task_at, task_len).map_err(to_py)?;
    // Every answer (and every part of a streamed one) rings the main process's doorbell.
    let answers = Ring::attach(shm.clone(), answer_at, answer_len)
        .map_err(to_py)?
        .with_doorbell(Doorbell::attach(shm.clone(), DOORBELL_AT));
    // Collation and send_batch find this worker's slots here (NOTE [Slots]).
    let _arena = slots::install(layout.arena(shm.clone(), worker_id));
    stacking::forget(); // (a fork inside a lending would leave it to this thread)
    let collate = Collate::new(collate_fn, collate_plan)?;
    // This worker's fetch and collate times, added to its cell in the region after each task
    // for the main process's `DataLoader.stats()` (rloader-workers' times.rs).
    let timed = Py::new(py, Stats::new())?;
    let times_at = layout.times(worker_id);
    let fetcher = if iterable {
        // Without an iterator (its creation failed: `init_error` reports it) the worker stays
        // empty-handed.
        let samples = match samples {
            Some(s) => s.try_iter()?,
            None => pyo3::types::PyTuple::empty(py).try_iter()?,
        };
        Fetcher::iterable(dataset, samples.unbind(), batch_size, drop_last, collate)
    } else {
        Fetcher::map(py, dataset, auto_collation, collate)?
    };
    let mut fetcher = fetcher.with_stats(timed.clone_ref(py));
    let hooks = hooks.bind(py);
    // A main process that is gone reads as a closed ring: the worker leaves.
    let main_gone = || Ok(main.gone().then_some(Err(QueueError::Closed)));
    // Ok(false): the main process closed the ring (it is done with this worker), or is gone.
    let send = |parts: &[&[u8]]| -> PyResult<bool> {
        let sent = wait::until(
            py,
            None,
            |len| wait::send_slice(&answers, parts, len),
            &main_gone,
        )?;
        match sent.unwrap_or(Err(QueueError::Closed)) {
            Ok(()) => Ok(true),
            Err(QueueError::Closed) => Ok(false),
            Err(e) => Err(to_py(e)),
        }
    };
    let mut init_error = init_error;
    let mut ended = false;
    let mut msg = Vec::new();
    let mut spent = Vec::new();
    let mut vision_seen = vision::nanos();
    loop {
        let got = wait::until(
            py,
            None,
            |len| match tasks.recv(&mut msg, Some(len)) {
                Err(QueueError::Timeout) => None,
                other => Some(other),
            },
            &main_gone,
        )?;
        match got.unwrap_or(Err(QueueError::Closed)) {
            Ok(()) => {}
            Err(QueueError::Closed) => return Ok(()),
            Err(e) => return Err(to_py(e)),
        }
        let wire::Header { kind: k, task, .. } = wire::parse_header(&msg).map_err(to_py)?;
        match k {
            kind::RESUME => {
                // The dataset's state as the epoch starts (pickled; empty unless it has one),
                // taken before iter(): what resuming a worker that hands out nothing sets.
                let state = hooks.call_method0("dump_state")?;
                let fresh = hooks.call_method0("restart")?;
                fetcher.restart(fresh.try_iter()?.unbind());
                ended = false;
                let state = state.cast::<PyBytes>()?.as_bytes();
                if !send(&[&wire::header(kind::RESUMED, worker_id, 0), state])? {
                    return Ok(());
                }
                continue;
            }
            kind::TASK_INDICES | kind::TASK_OBJECT => {}
            other => {
                return Err(to_py(PoolError::UnexpectedKind {
                    kind: other,
                    from: None,
                }))
            }
        }
        if ended {
            continue; // tasks sent before the main process learnt this worker had ended
        }
        if let Some(err) = init_error.take() {
            if !send(&[
                &wire::header(kind::ERROR, worker_id, task),
                err.bind(py).as_bytes(),
            ])? {
                return Ok(());
            }
            continue;
        }
        slots::with_arena(|a| a.begin());
        let result = if iterable {
            fetcher.fetch_next(py)
        } else {
            let body = &msg[HEADER..];
            let keys = if k == kind::TASK_INDICES {
                KeyBatch::Indices(wire::indices(body))
            } else {
                KeyBatch::Object(hooks.call_method1("load_keys", (PyBytes::new(py, body),))?)
            };
            fetcher.fetch_keys(py, keys, &mut spent).map(Some)
        };
        if let Some(Some(warning)) = slots::with_arena(|a| a.take_warning()) {
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
                &std::ffi::CString::new(warning).unwrap_or_default(),
                1,
            )?;
        }
        times::add(&shm, times_at, times::FETCH, timed.get().take(Stage::Fetch));
        times::add(
            &shm,
            times_at,
            times::COLLATE,
            timed.get().take(Stage::Collate),
        );
        let vision_now = vision::nanos();
        for (which, i) in [(times::DECODE, 0), (times::TRANSFORM, 1)] {
            times::add(
                &shm,
                times_at,
                which,
                vision_now[i].wrapping_sub(vision_seen[i]),
            );
        }
        vision_seen = vision_now;
        // A batch that cannot be encoded or sent (its pickling raises, say) is that batch's
        // error, reported as any error of the dataset or collate_fn is: never a dead worker.
        let ended_with_it = iterable && fetcher.ended(); // a short last batch
        let result = result.and_then(|batch| match batch {
            Some(batch) => {
                encode_and_send(hooks, &send, worker_id, task, batch, ended_with_it).map(Some)
            }
            None => Ok(None),
        });
        let delivered = match result {
            Ok(Some(delivered)) => delivered,
            Ok(None) => {
                slots::with_arena(|a| a.finish(false));
                ended = true;
                // The dataset's state now its stream has ended (empty unless it has one): a
                // persistent worker's next epoch starts from it.
                let state = hooks.call_method0("dump_state")?;
                let state = state.cast::<PyBytes>()?.as_bytes();
                send(&[&wire::header(kind::ENDED, worker_id, task), state])?
            }
            Err(e) => {
                slots::with_arena(|a| a.finish(false));
                if !e.is_instance_of::<pyo3::exceptions::PyException>(py) {
                    // SystemExit (a library's sys.exit), KeyboardInterrupt: not an error of
                    // the batch but the end of this process, as in torch's workers (whose loop
                    // catches Exception only): the main process reports the worker's death.
                    return Err(e);
                }
                let wrapped = hooks.call_method1("dump_error", (e.value(py), e.traceback(py)))?;
                send(&[
                    &wire::header(kind::ERROR, worker_id, task),
                    wrapped.cast::<PyBytes>()?.as_bytes(),
                ])?
            }
        };
        if !delivered {
            return Ok(());
        }
    }
}

/// Encodes `batch` (the hooks' `dumps`, told whether the dataset's iterator ended making it)
/// and sends it: Ok(false) when the main process closed the ring. On an error nothing was
/// sent and no slot is left held (the caller's `finish(false)` ends the batch).
fn encode_and_send(
    hooks: &Bound<'_, PyAny>,
    send: &dyn Fn(&[&[u8]]) -> PyResult<bool>,
    worker_id: usize,
    task: u64,
    batch: Bound<'_, PyAny>,
    ended: bool,
) -> PyResult<bool> {
    let encoded = hooks.call_method1("dumps", (batch, ended))?;
    let (data, buffers): (Bound<'_, PyBytes>, Bound<'_, PyList>) = encoded.extract()?;
    let views: Vec<pyo3::buffer::PyBuffer<u8>> = buffers
        .iter()
        .map(|b| pyo3::buffer::PyBuffer::<u8>::get(&b))
        .collect::<PyResult<_>>()?;
    send_batch(send, worker_id, task, data.as_bytes(), &views)
}

/// Sends one batch as a DATA message: each buffer goes in the batch's slot (collated there
/// already, or copied there if it fits) or inline, and the slot, if used, becomes the main
/// process's (NOTE [Slots]).
fn send_batch(
    send: &dyn Fn(&[&[u8]]) -> PyResult<bool>,
    worker_id: usize,
    task: u64,
    pickle: &[u8],
    views: &[pyo3::buffer::PyBuffer<u8>],
) -> PyResult<bool> {
    let bytes: Vec<&[u8]> = views
        .iter()
        .map(contiguous_bytes)
        .collect::<PyResult<_>>()?;
    // Each buffer's place in the slot: collated there already, or copied there if it fits.
    let places: Vec<Option<usize>> = bytes
        .iter()
        .map(|b| {
            slots::with_arena(|a| {
                a.offset_of(b.as_ptr(), b.len()).or_else(|| {
                    let (at, dst) = a.alloc(b.len())?;
                    // SAFETY: `dst` has `b.len()` bytes of the slot, which no one else uses.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
                    Some(at)
                })
            })
            .flatten()
        })
        .collect();
    let slot = slots::with_arena(|a| a.finish(places.iter().any(Option::is_some))).flatten();
    let message = BatchMessage::new(worker_id, task, slot, pickle, &bytes, &places);
    let sent = send(&message.parts());
    if let (Err(_), Some(slot)) = (&sent, slot) {
        // The message naming the slot never left: the slot is the worker's again.
        slots::with_arena(|a| a.unhold(slot));
    }
    sent
}
