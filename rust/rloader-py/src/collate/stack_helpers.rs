//! The stack helpers: threads that stack runs of a large tensor batch beside the thread that
//! collates it (NOTE [Stack helpers]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, PoisonError};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::copy_threads::copy_threads;
use super::pooled_tensor_min;
use crate::memory::pooled_empty;
use crate::torch_api::{nbytes_of, torch_api, TorchApi};
use rloader_memory::BatchMemory;

// NOTE [Stack helpers]
// torch.stack copies a batch of many small tensors (under 32768 elements each, torch's grain) on
// one thread, about 1 µs an input (a view and a copy kernel each) plus the copy itself, whatever
// torch.get_num_threads() says. The
// single-process loop (num_workers=0), which collates on the user's thread, therefore has the
// batch stacked in `copy_threads` runs at once: this thread stacks the first run into the first
// rows of the output, and helper threads the others into theirs, each a `torch.stack(run,
// out=rows)`, which lets go of the GIL while it copies.
//
// - The output is a block of the loop's recycled batch memory when it has one and the batch is
//   large (as `pooled_stack` in mod.rs makes it without helpers), else a fresh torch tensor.
// - The helpers are long-lived threads of the loop's fetcher, started on its first large batch
//   and joined when it is dropped: a thread started per batch costs about what the split saves.
// - A helper touches Python only inside a job, attached for that job alone. Idle, it waits on its
//   channel holding nothing, so it can be joined with the GIL held, and it never needs the
//   interpreter to end: closing its channel ends it.
// - Every job sent is waited for before `stack` returns (no `?` between the two), so a helper is
//   idle whenever the fetcher can be dropped.
// - The helpers belong to the process that started them (`pid`): a forked child has none of
//   its parent's threads, so it neither sends to them nor joins them. The lock is only ever
//   tried, never waited for: a fetcher used from two threads at once, or copied by a fork with
//   the lock held, stacks on its calling thread.
// - Any run that fails (sizes that differ, inputs that require grad, ...) leaves the batch to a
//   plain torch.stack, whose result or error is torch's.
// - Once the interpreter is finalizing, the batch is stacked by the calling thread alone: Python
//   ends a thread that attaches then, which would abort the process from a helper. (A daemon
//   thread whose batch is under way as finalizing begins is not covered.)

/// A job for a helper: runs with no GIL, attaches for what it needs.
type StackJob = Box<dyn FnOnce() + Send>;

struct Helper {
    jobs: mpsc::Sender<StackJob>,
    thread: std::thread::JoinHandle<()>,
}

/// The helper threads of one fetcher (NOTE [Stack helpers]).
pub struct StackHelpers {
    pid: u32,
    helpers: Mutex<Vec<Helper>>,
}

impl Default for StackHelpers {
    fn default() -> Self {
        StackHelpers {
            pid: std::process::id(),
            helpers: Mutex::new(Vec::new()),
        }
    }
}

impl StackHelpers {
    /// `torch.stack(items)` made by this thread and the helpers together, or None for a plain
    /// `torch.stack` to make it: one thread's worth of batch (`copy_threads`), items that torch
    /// copies on its own threads, inference mode, helpers busy or not to be had, items the runs
    /// cannot stack as torch would (`runs_of`), or a run that failed.
    pub fn stack<'py>(
        &self,
        py: Python<'py>,
        h: &TorchApi,
        items: &[Bound<'py, PyAny>],
        shape: &[isize],
        dtype: &Bound<'py, PyAny>,
        memory: Option<&BatchMemory>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(nbytes) = nbytes_of(shape, dtype)? else {
            return Ok(None);
        };
        if shape[1..].iter().product::<isize>() >= TORCH_GRAIN_SIZE {
            return Ok(None); // torch copies each such item on its own threads already
        }
        let threads = copy_threads(py, h, nbytes)?.min(items.len());
        if threads <= 1 || self.pid != std::process::id() {
            return Ok(None);
        }
        // Inference mode is the calling thread's: a helper's run, outside it, could not write
        // into an inference tensor. (Grad mode is too, but a run it matters to fails, and the
        // batch falls back.) Once the interpreter is finalizing, a helper could not attach.
        if h.inference_mode.bind(py).call0()?.is_truthy()?
            || h.is_finalizing.bind(py).call0()?.is_truthy()?
        {
            return Ok(None);
        }
        let Ok(mut helpers) = self.helpers.try_lock() else {
            return Ok(None);
        };
        while helpers.len() < threads - 1 {
            match spawn_helper() {
                Some(helper) => helpers.push(helper),
                None => break,
            }
        }
        let threads = threads.min(helpers.len() + 1);
        if threads <= 1 {
            return Ok(None);
        }
        let per = items.len().div_ceil(threads);
        // An error making the runs is no batch's: a plain torch.stack gives torch's.
        let memory = memory
            .filter(|m| nbytes >= pooled_tensor_min(m))
            .map(|m| (m, nbytes));
        let Ok(Some((out, runs))) = runs_of(py, h, items, shape, dtype, per, memory) else {
            return Ok(None);
        };
        let mut runs = runs.into_iter();
        let mine = runs.next().expect("threads >= 2 runs");
        // From here to the wait below nothing returns early: every job sent is waited for.
        let mut replies = Vec::with_capacity(threads - 1);
        for ((run, rows), helper) in runs.zip(helpers.iter()) {
            let (done, reply) = mpsc::channel();
            let job: StackJob = Box::new(move || {
                let ok = Python::attach(move |py| {
                    let ok = stack_run(py, &run, &rows).is_ok();
                    drop((run, rows)); // attached: references let go of here, not deferred
                    ok
                });
                let _ = done.send(ok);
            });
            // A helper that is gone drops the job (and its reply's sender): a failed run.
            let _ = helper.jobs.send(job);
            replies.push(reply);
        }
        let mine = stack_run(py, &mine.0, &mine.1).is_ok();
        // Every reply is waited for, a failed run's too (not `all`, which would stop at it).
        let oks: Vec<bool> = py.detach(|| {
            replies
                .into_iter()
                .map(|reply| reply.recv().unwrap_or(false))
                .collect()
        });
        let theirs = oks.into_iter().all(|ok| ok);
        if !theirs {
            // A helper that died (its reply never came) is not used again.
            if helpers.iter().any(|h| h.thread.is_finished()) {
                helpers.clear();
            }
        }
        if !(mine && theirs) {
            return Ok(None);
        }
        SPLIT_STACKS.fetch_add(1, Ordering::Relaxed);
        Ok(Some(out))
    }
}

/// Batches the stack helpers made, for the tests to see that they do (`_split_stacks()`).
static SPLIT_STACKS: AtomicUsize = AtomicUsize::new(0);

/// `_split_stacks()`: how many batches this process stacked with helpers (NOTE [Stack helpers]).
#[pyfunction(name = "_split_stacks")]
pub fn split_stacks() -> usize {
    SPLIT_STACKS.load(Ordering::Relaxed)
}

impl Drop for StackHelpers {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy: its parent's threads are not here to join.
            let helpers = self
                .helpers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            std::mem::forget(std::mem::take(helpers));
            return;
        }
        let helpers = std::mem::take(
            self.helpers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for Helper { jobs, thread } in helpers {
            drop(jobs); // its loop ends; idle, it holds nothing to wait for
            let _ = thread.join();
        }
    }
}

/// Elements from which torch's copy of one tensor runs on torch's own threads
/// (`at::internal::GRAIN_SIZE`).
const TORCH_GRAIN_SIZE: isize = 32768;

/// A run of rows = the items that one thread stacks, and the rows of the output they go into.
type Run = (Py<PyList>, Py<PyAny>);

/// The output of `torch.stack(items)` (uninitialized) and its runs of `per` items, or None when
/// the runs could not make torch's batch: an item of another dtype (torch promotes them, an out=
/// would cast), a first item that requires grad (out= refuses it) or is not contiguous (torch's
/// output then takes the inputs' memory format), or a run whose first item differs in shape from
/// the batch's first. torch.stack checks each run's items against the run's first, so with the
/// runs' firsts checked here no out= is ever resized.
fn runs_of<'py>(
    py: Python<'py>,
    h: &TorchApi,
    items: &[Bound<'py, PyAny>],
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
    per: usize,
    memory: Option<(&BatchMemory, usize)>,
) -> PyResult<Option<(Bound<'py, PyAny>, Vec<Run>)>> {
    let first = &items[0];
    if first.getattr(intern!(py, "requires_grad"))?.is_truthy()?
        || !first
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
    {
        return Ok(None);
    }
    let size = first.getattr(intern!(py, "shape"))?;
    for (i, x) in items.iter().enumerate() {
        if !x.getattr(intern!(py, "dtype"))?.is(dtype) {
            return Ok(None);
        }
        if i > 0 && i % per == 0 && !x.getattr(intern!(py, "shape"))?.eq(&size)? {
            return Ok(None);
        }
    }
    let out = match memory {
        Some((mem, nbytes)) => pooled_empty(py, h, mem, shape, dtype, nbytes)?,
        None => {
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "dtype"), dtype)?;
            h.empty
                .bind(py)
                .call((PyTuple::new(py, shape)?,), Some(&kwargs))?
        }
    };
    let writer = writer_of(py, h, &out, shape, dtype)?;
    let mut runs = Vec::with_capacity(items.len().div_ceil(per));
    for (r, run) in items.chunks(per).enumerate() {
        let rows = writer.call_method1(intern!(py, "narrow"), (0, r * per, run.len()))?;
        runs.push((PyList::new(py, run)?.unbind(), rows.unbind()));
    }
    Ok(Some((out, runs)))
}

fn spawn_helper() -> Option<Helper> {
    let (jobs, queue) = mpsc::channel::<StackJob>();
    let thread = std::thread::Builder::new()
        .name("rloader-stack".into())
        .spawn(move || {
            for job in queue {
                job();
            }
        })
        .ok()?;
    Some(Helper { jobs, thread })
}

/// `torch.stack(run, 0, out=rows)`.
fn stack_run(py: Python<'_>, run: &Py<PyList>, rows: &Py<PyAny>) -> PyResult<()> {
    let h = torch_api(py)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "out"), rows)?;
    h.stack.bind(py).call((run, 0), Some(&kwargs))?;
    Ok(())
}

/// An alias of `out` (contiguous, of `shape` and `dtype`) with a version counter of its own, for
/// a `torch.stack(..., out=)` to write through: an out= write bumps the version of the tensor it
/// writes, and torch.stack's own batch has version 0.
pub fn writer_of<'py>(
    py: Python<'py>,
    h: &TorchApi,
    out: &Bound<'py, PyAny>,
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "dtype"), dtype)?;
    h.empty.bind(py).call(((0,),), Some(&kwargs))?.call_method1(
        intern!(py, "set_"),
        (
            out.call_method0(intern!(py, "untyped_storage"))?,
            0,
            PyTuple::new(py, shape)?,
        ),
    )
}
