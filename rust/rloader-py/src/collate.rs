//! The fast path of `default_collate`.
//!
//! `fast_collate(batch)` handles the batches most loaders produce — Python ints, floats and
//! bools, `torch.Tensor`s, plain numpy arrays, and tuples, lists and dicts of them — and writes
//! numbers and arrays straight into one output tensor. For anything else (namedtuples, numpy
//! scalars, subclasses, mixed element types, ragged or non-contiguous arrays, ...) it returns
//! `None` before doing anything visible, and the caller runs the general path
//! (`rloader.collate.collate`), which owns every error message. Whatever this path returns is
//! identical to what the general path returns for the same batch: the tests compare the two.
//!
//! Inside a worker process, tensors and arrays are collated straight into the batch's
//! shared-memory slot when there is one (NOTE [Slots] in rloader-workers' slots.rs), with
//! `torch.stack(..., out=...)` as torch's collate does in a worker. Elsewhere large arrays go
//! into the loader's recycled batch memory, and so do large tensors when that memory is pinned
//! (NOTE [Pinned blocks] in rloader-memory).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, PoisonError};

use crate::buffers::{ArrayView, PooledView};
use crate::slots;
use pyo3::exceptions::PyBufferError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use rloader_memory::BatchMemory;

/// The torch and numpy objects the fast path needs, looked up once.
struct Handles {
    empty: Py<PyAny>,
    frombuffer: Py<PyAny>,
    stack: Py<PyAny>,
    get_num_threads: Py<PyAny>,
    /// `torch._C._is_torch_function_mode_enabled` and `torch._C._len_torch_dispatch_stack`.
    function_mode: Py<PyAny>,
    dispatch_modes: Py<PyAny>,
    /// `torch.is_inference_mode_enabled`, `sys.is_finalizing`.
    inference_mode: Py<PyAny>,
    is_finalizing: Py<PyAny>,
    /// `torch._C._autograd._unsafe_set_version_counter`, where this torch has it.
    set_version: Option<Py<PyAny>>,
    tensor_type: Py<PyType>,
    strided: Py<PyAny>,
    int64: Py<PyAny>,
    float64: Py<PyAny>,
    bool_: Py<PyAny>,
    ndarray_type: Option<Py<PyType>>,
    /// numpy buffer format character → the torch dtype `torch.as_tensor` gives.
    dtypes: HashMap<&'static str, (Py<PyAny>, usize)>,
}

static HANDLES: PyOnceLock<Handles> = PyOnceLock::new();

fn handles(py: Python<'_>) -> PyResult<&Handles> {
    HANDLES.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(torch.getattr(name)?.unbind()) };
        let torch_c = torch.getattr("_C")?;
        let ndarray_type = match py.import("numpy") {
            Ok(np) => Some(np.getattr("ndarray")?.cast_into::<PyType>()?.unbind()),
            Err(_) => None,
        };
        let mut dtypes = HashMap::new();
        for (fmt, name, size) in [
            ("?", "bool", 1),
            ("b", "int8", 1),
            ("B", "uint8", 1),
            ("h", "int16", 2),
            ("i", "int32", 4),
            ("l", "int64", 8),
            ("q", "int64", 8),
            ("e", "float16", 2),
            ("f", "float32", 4),
            ("d", "float64", 8),
            ("Zf", "complex64", 8),
            ("Zd", "complex128", 16),
        ] {
            dtypes.insert(fmt, (get(name)?, size));
        }
        Ok(Handles {
            empty: get("empty")?,
            frombuffer: get("frombuffer")?,
            stack: get("stack")?,
            get_num_threads: get("get_num_threads")?,
            function_mode: torch_c.getattr("_is_torch_function_mode_enabled")?.unbind(),
            dispatch_modes: torch_c.getattr("_len_torch_dispatch_stack")?.unbind(),
            inference_mode: get("is_inference_mode_enabled")?,
            is_finalizing: py.import("sys")?.getattr("is_finalizing")?.unbind(),
            set_version: torch_c
                .getattr("_autograd")
                .and_then(|a| a.getattr("_unsafe_set_version_counter"))
                .ok()
                .map(Bound::unbind),
            tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
            strided: get("strided")?,
            int64: get("int64")?,
            float64: get("float64")?,
            bool_: get("bool")?,
            ndarray_type,
            dtypes,
        })
    })
}

/// Where a batch's large outputs are made, outside a worker's slots.
#[derive(Clone, Copy, Default)]
pub struct Outputs<'a> {
    /// The loop's recycled batch memory (NOTE [Batch memory]); None: torch's allocator.
    pub memory: Option<&'a BatchMemory>,
    /// Threads that stack runs of a large tensor batch beside this one (NOTE [Stack helpers]);
    /// None: this thread stacks it alone.
    pub helpers: Option<&'a StackHelpers>,
}

/// Collates `batch` (a list or tuple) like `default_collate`, or returns `None` when the general
/// path must do it.
///
/// `to`: where large outputs go and who helps make them (the single-process loop's).
pub fn fast_collate<'py>(
    batch: &Bound<'py, PyAny>,
    to: Outputs<'_>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = batch.py();
    let h = handles(py)?;
    if torch_modes_active(py, h)? {
        return Ok(None);
    }
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = batch.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = batch.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Ok(None);
    };
    collate_items(py, h, to, batch, &items)
}

/// A torch function mode (`torch.set_default_device`, `with torch.device(...)`) or dispatch mode
/// (`FakeTensorMode`) is active: the tensors collation makes are theirs to place (torch's collate
/// makes numpy batches and numbers on the default device), so the general path, which calls the
/// same torch functions as torch's collate, does it. This path writes through `data_ptr()`, which
/// only a CPU tensor of its own allocation can take.
fn torch_modes_active(py: Python<'_>, h: &Handles) -> PyResult<bool> {
    Ok(h.function_mode.bind(py).call0()?.is_truthy()?
        || h.dispatch_modes.bind(py).call0()?.extract::<usize>()? > 0)
}

fn all_exact<'py, T: pyo3::type_object::PyTypeInfo>(items: &[Bound<'py, PyAny>]) -> bool {
    items.iter().all(|x| x.is_exact_instance_of::<T>())
}

fn collate_items<'py>(
    py: Python<'py>,
    h: &Handles,
    to: Outputs<'_>,
    batch: &Bound<'py, PyAny>,
    items: &[Bound<'py, PyAny>],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(first) = items.first() else {
        return Ok(None);
    };
    if first.is_exact_instance_of::<PyBool>() {
        if !all_exact::<PyBool>(items) {
            return Ok(None);
        }
        let values: Vec<u8> = items
            .iter()
            .map(|x| u8::from(x.is_truthy().unwrap_or(false)))
            .collect();
        return numbers_tensor(py, h, &h.bool_, &values).map(Some);
    }
    if first.is_exact_instance_of::<PyInt>() {
        if !all_exact::<PyInt>(items) {
            return Ok(None);
        }
        let mut values = Vec::with_capacity(items.len());
        for x in items {
            match x.extract::<i64>() {
                Ok(v) => values.push(v),
                Err(_) => return Ok(None), // too big for int64: torch's own error, from the general path
            }
        }
        return numbers_tensor(py, h, &h.int64, &values).map(Some);
    }
    if first.is_exact_instance_of::<PyFloat>() {
        if !all_exact::<PyFloat>(items) {
            return Ok(None);
        }
        let values: Vec<f64> = items
            .iter()
            .map(|x| x.cast::<PyFloat>().map(|f| f.value()).unwrap_or(0.0))
            .collect();
        return numbers_tensor(py, h, &h.float64, &values).map(Some);
    }
    if first.is_exact_instance_of::<PyString>() || first.is_exact_instance_of::<PyBytes>() {
        // Strings and bytes are returned as the batch itself, as torch does.
        return Ok(Some(batch.clone()));
    }
    let first_type = first.get_type();
    if first_type.is(h.tensor_type.bind(py)) {
        // Anything but plain tensors (an int, a subclass): the general path, whose errors
        // and results are torch's.
        if !items.iter().all(|x| x.get_type().is(&first_type)) {
            return Ok(None);
        }
        if first.getattr("is_nested")?.is_truthy()?
            || !first.getattr("layout")?.is(h.strided.bind(py))
        {
            return Ok(None);
        }
        let stack = h.stack.bind(py);
        if first.getattr("is_cpu")?.is_truthy()? {
            let mut shape = vec![items.len() as isize];
            shape.extend(first.getattr("shape")?.extract::<Vec<isize>>()?);
            let dtype = first.getattr("dtype")?;
            if let Some(out) = slots::slot_empty(py, &shape, &dtype)? {
                let kwargs = PyDict::new(py);
                kwargs.set_item("out", out)?;
                return Ok(Some(stack.call((batch, 0), Some(&kwargs))?));
            }
            if let Some(mem) = to.memory.filter(|m| m.is_pinning()) {
                if let Some(out) = pinned_stack(py, h, mem, batch, items, &shape, &dtype)? {
                    return Ok(Some(out));
                }
            }
            if let Some(helpers) = to.helpers {
                if let Some(out) = helpers.stack(py, h, items, &shape, &dtype)? {
                    return Ok(Some(out));
                }
            }
        }
        return Ok(Some(stack.call1((batch, 0))?));
    }
    if let Some(nd) = &h.ndarray_type {
        if first_type.is(nd.bind(py)) {
            return arrays_tensor(py, h, to.memory, nd.bind(py), items);
        }
    }
    if first.is_exact_instance_of::<PyTuple>() || first.is_exact_instance_of::<PyList>() {
        return collate_sequences(py, h, to, items);
    }
    if first.is_exact_instance_of::<PyDict>() {
        return collate_dicts(py, h, to, items);
    }
    Ok(None)
}

/// Tuples and lists of equal length → a list of collated columns (each column a tuple, as
/// torch's `zip(*batch)` makes them).
fn collate_sequences<'py>(
    py: Python<'py>,
    h: &Handles,
    to: Outputs<'_>,
    items: &[Bound<'py, PyAny>],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    // Row-major, all rows in one vector: one allocation per batch, not one per sample.
    let mut cells: Vec<Bound<'py, PyAny>> = Vec::new();
    let mut width = None;
    for x in items {
        let len = if let Ok(t) = x.cast_exact::<PyTuple>() {
            cells.extend(t.iter());
            t.len()
        } else if let Ok(l) = x.cast_exact::<PyList>() {
            cells.extend(l.iter());
            l.len()
        } else {
            return Ok(None);
        };
        match width {
            None => {
                width = Some(len);
                cells.reserve(len * (items.len() - 1));
            }
            // The general path raises torch's error for ragged batches.
            Some(w) if w != len => return Ok(None),
            Some(_) => {}
        }
    }
    let width = width.unwrap_or(0);
    let out = PyList::empty(py);
    for col in 0..width {
        let column: Vec<Bound<'py, PyAny>> =
            cells.iter().skip(col).step_by(width).cloned().collect();
        let column_obj = PyTuple::new(py, &column)?;
        match collate_items(py, h, to, column_obj.as_any(), &column)? {
            Some(v) => out.append(v)?,
            None => return Ok(None),
        }
    }
    Ok(Some(out.into_any()))
}

/// Dicts → a dict with the first dict's keys, each mapped to its collated column (a list).
fn collate_dicts<'py>(
    py: Python<'py>,
    h: &Handles,
    to: Outputs<'_>,
    items: &[Bound<'py, PyAny>],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mut dicts = Vec::with_capacity(items.len());
    for x in items {
        match x.cast_exact::<PyDict>() {
            Ok(d) => dicts.push(d.clone()),
            Err(_) => return Ok(None),
        }
    }
    let out = PyDict::new(py);
    for key in dicts[0].keys() {
        let mut column = Vec::with_capacity(dicts.len());
        for d in &dicts {
            match d.get_item(&key)? {
                Some(v) => column.push(v),
                None => return Ok(None), // the general path raises the KeyError
            }
        }
        let column_obj = PyList::new(py, &column)?;
        match collate_items(py, h, to, column_obj.as_any(), &column)? {
            Some(v) => out.set_item(key, v)?,
            None => return Ok(None),
        }
    }
    Ok(Some(out.into_any()))
}

/// A 1-d tensor of `dtype` holding `values` (whose element size matches `dtype`).
fn numbers_tensor<'py, T: Copy>(
    py: Python<'py>,
    h: &Handles,
    dtype: &Py<PyAny>,
    values: &[T],
) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype.bind(py))?;
    let out = h.empty.bind(py).call((values.len(),), Some(&kwargs))?;
    let ptr = out.call_method0("data_ptr")?.extract::<usize>()? as *mut T;
    // SAFETY: `out` is a fresh contiguous CPU tensor of `values.len()` elements of this size.
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), ptr, values.len()) };
    Ok(out)
}

/// Outputs from this size on come from the loop's recycled batch memory when it has one.
/// Smaller ones come from torch's allocator: glibc serves them from its heap's free lists,
/// below its initial mmap threshold (128 KiB), which are warm and not given back per batch.
const POOLED_MIN: usize = 128 * 1024;

/// An uninitialized contiguous CPU tensor of `shape` and `dtype` (`nbytes` bytes) over a block
/// of `mem` (NOTE [Batch memory] in rloader-memory): the block returns to `mem`
/// when the last tensor over it is gone. The tensor is set over the block's storage rather than
/// viewed from it (or detached from a view, which would refuse `unsqueeze_` and the like), so
/// that, like torch.empty's, it is no view (`_base` is None). Unlike torch.empty's, its storage
/// cannot grow: `resize_` to more elements raises.
fn pooled_empty<'py>(
    py: Python<'py>,
    h: &Handles,
    mem: &BatchMemory,
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
    nbytes: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let block = mem
        .take(nbytes)
        .map_err(|e| pyo3::exceptions::PyMemoryError::new_err(e.to_string()))?;
    let view = Py::new(py, PooledView::new(block, nbytes))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype)?;
    let flat = h.frombuffer.bind(py).call((view,), Some(&kwargs))?;
    let storage = flat.call_method0("untyped_storage")?;
    let out = h.empty.bind(py).call(((0,),), Some(&kwargs))?;
    let out = out.call_method1("set_", (storage, 0, PyTuple::new(py, shape)?))?;
    reset_version(py, h, &out);
    Ok(out)
}

/// Sets the version counter of `out`, which `set_` made 1, back to the 0 of torch's fresh
/// batch, where this torch lets us (`_unsafe_set_version_counter`, whose arguments changed from
/// a tensor and an int to sequences of them); elsewhere it stays 1.
fn reset_version(py: Python<'_>, h: &Handles, out: &Bound<'_, PyAny>) {
    if let Some(set_version) = &h.set_version {
        let set_version = set_version.bind(py);
        if set_version.call1(((out,), (0,))).is_err() {
            let _ = set_version.call1((out, 0));
        }
    }
}

/// Bytes of a tensor of `shape` and `dtype`; None for a negative dimension.
pub fn nbytes_of(shape: &[isize], dtype: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    let mut n: usize = dtype.getattr("itemsize")?.extract()?;
    for &d in shape {
        let Ok(d) = usize::try_from(d) else {
            return Ok(None);
        };
        n = n.saturating_mul(d);
    }
    Ok(Some(n))
}

/// `torch.stack(batch)` written into a block of pinned batch memory (NOTE [Pinned blocks]), so
/// that pinning it copies nothing; or None, for `torch.stack` to make it as usual: a small
/// batch, mixed dtypes (torch promotes them, an `out=` would cast), a first item that is not
/// contiguous (torch's output then takes the inputs' memory format, channels-last for instance;
/// from a contiguous first item it is contiguous, as the block is), or a stack into `out=` that
/// raises (inputs that require grad; torch's own error then comes from the plain stack).
fn pinned_stack<'py>(
    py: Python<'py>,
    h: &Handles,
    mem: &BatchMemory,
    batch: &Bound<'py, PyAny>,
    items: &[Bound<'py, PyAny>],
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(nbytes) = nbytes_of(shape, dtype)?.filter(|&n| n >= POOLED_MIN) else {
        return Ok(None);
    };
    for x in items {
        if !x.getattr("dtype")?.is(dtype) {
            return Ok(None);
        }
    }
    if !items[0].call_method0("is_contiguous")?.is_truthy()? {
        return Ok(None);
    }
    let out = pooled_empty(py, h, mem, shape, dtype, nbytes)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("out", writer_of(py, h, &out, shape, dtype)?)?;
    match h.stack.bind(py).call((batch, 0), Some(&kwargs)) {
        Ok(_) => Ok(Some(out)),
        Err(_) => Ok(None),
    }
}

/// An alias of `out` (contiguous, of `shape` and `dtype`) with a version counter of its own, for
/// a `torch.stack(..., out=)` to write through: an out= write bumps the version of the tensor it
/// writes, and torch.stack's own batch has version 0.
fn writer_of<'py>(
    py: Python<'py>,
    h: &Handles,
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

// NOTE [Stack helpers]
// torch.stack copies a batch of many small tensors (under 32768 elements each, torch's grain) on
// one thread, about 1 µs an input (a view and a copy kernel each) plus the copy itself, whatever
// torch.get_num_threads() says. The
// single-process loop (num_workers=0), which collates on the user's thread, therefore has the
// batch stacked in `copy_threads` runs at once: this thread stacks the first run into the first
// rows of the output, and helper threads the others into theirs, each a `torch.stack(run,
// out=rows)`, which lets go of the GIL while it copies.
//
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
type Job = Box<dyn FnOnce() + Send>;

struct Helper {
    jobs: mpsc::Sender<Job>,
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
    fn stack<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        items: &[Bound<'py, PyAny>],
        shape: &[isize],
        dtype: &Bound<'py, PyAny>,
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
        let Ok(Some((out, runs))) = runs_of(py, h, items, shape, dtype, per) else {
            return Ok(None);
        };
        let mut runs = runs.into_iter();
        let mine = runs.next().expect("threads >= 2 runs");
        // From here to the wait below nothing returns early: every job sent is waited for.
        let mut replies = Vec::with_capacity(threads - 1);
        for ((run, rows), helper) in runs.zip(helpers.iter()) {
            let (done, reply) = mpsc::channel();
            let job: Job = Box::new(move || {
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
fn split_stacks() -> usize {
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
    h: &Handles,
    items: &[Bound<'py, PyAny>],
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
    per: usize,
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
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "dtype"), dtype)?;
    let out = h
        .empty
        .bind(py)
        .call((PyTuple::new(py, shape)?,), Some(&kwargs))?;
    let writer = writer_of(py, h, &out, shape, dtype)?;
    let mut runs = Vec::with_capacity(items.len().div_ceil(per));
    for (r, run) in items.chunks(per).enumerate() {
        let rows = writer.call_method1(intern!(py, "narrow"), (0, r * per, run.len()))?;
        runs.push((PyList::new(py, run)?.unbind(), rows.unbind()));
    }
    Ok(Some((out, runs)))
}

fn spawn_helper() -> Option<Helper> {
    let (jobs, queue) = mpsc::channel::<Job>();
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
    let h = handles(py)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "out"), rows)?;
    h.stack.bind(py).call((run, 0), Some(&kwargs))?;
    Ok(())
}

/// Bytes from which `arrays_tensor` copies without the GIL.
const DETACHED_COPY: usize = 64 * 1024;

/// numpy arrays of one dtype and shape → one tensor `[len(batch), *shape]`, filled by memcpy.
fn arrays_tensor<'py>(
    py: Python<'py>,
    h: &Handles,
    mem: Option<&BatchMemory>,
    ndarray: &Bound<'py, PyType>,
    items: &[Bound<'py, PyAny>],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mut views = Vec::with_capacity(items.len());
    for x in items {
        if !x.get_type().is(ndarray) {
            return Ok(None);
        }
        match ArrayView::get(x) {
            Some(v) => views.push(v),
            None => return Ok(None),
        }
    }
    let first = &views[0];
    let Some((dtype, itemsize)) = h.dtypes.get(first.format()) else {
        return Ok(None);
    };
    if first.itemsize() != *itemsize {
        return Ok(None);
    }
    for v in &views[1..] {
        if v.format() != first.format() || v.shape() != first.shape() {
            return Ok(None); // torch.stack's promotion or its size error: the general path
        }
    }
    let mut shape: Vec<isize> = Vec::with_capacity(first.shape().len() + 1);
    shape.push(views.len() as isize);
    shape.extend(first.shape().iter().copied());
    let each = first.bytes().len();
    let out = match slots::slot_empty(py, &shape, dtype.bind(py))? {
        Some(out) => out,
        None => match mem {
            Some(mem) if each * views.len() >= POOLED_MIN => {
                pooled_empty(py, h, mem, &shape, dtype.bind(py), each * views.len())?
            }
            _ => {
                let kwargs = PyDict::new(py);
                kwargs.set_item("dtype", dtype.bind(py))?;
                h.empty
                    .bind(py)
                    .call((PyTuple::new(py, shape)?,), Some(&kwargs))?
            }
        },
    };
    let base = out.call_method0("data_ptr")?.extract::<usize>()?;
    let mut sources = Vec::with_capacity(views.len());
    for v in &views {
        let src = v.bytes();
        if src.len() != each {
            return Err(PyBufferError::new_err(
                "numpy array changed size during collation",
            ));
        }
        sources.push(src.as_ptr() as usize);
    }
    let copy_rows = move |first_row: usize, rows: &[usize]| {
        for (i, &src) in rows.iter().enumerate() {
            // SAFETY: `out` holds len(views) * each bytes, row r at [r*each, (r+1)*each), and
            // no one else has it yet; each source is `each` bytes of an array whose buffer
            // export (`views`, alive until this function returns) keeps it from being freed
            // or resized.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src as *const u8,
                    (base as *mut u8).add((first_row + i) * each),
                    each,
                )
            };
        }
    };
    let total = each * views.len();
    // A large copy lets go of the GIL (worker threads run Python meanwhile, as torch.stack
    // lets them); a small one is not worth the hand-over.
    if total >= DETACHED_COPY {
        let threads = copy_threads(py, h, total)?;
        py.detach(|| split_copy(&sources, threads, copy_rows));
    } else {
        copy_rows(0, &sources);
    }
    drop(views);
    Ok(Some(out))
}

/// Batches at least this large are copied on several threads (`copy_threads`).
const SPLIT_COPY_MIN: usize = 1 << 20;
/// At most this many threads copy one batch.
const SPLIT_COPY_THREADS: usize = 4;

thread_local! {
    /// Set on worker threads (threads.rs), which already collate side by side: each copies
    /// its own batches on its own thread.
    static ONE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread copies the batches it collates by itself (a worker thread).
pub fn copy_on_this_thread_only() {
    ONE_THREAD.with(|one| one.set(true));
}

/// How many threads copy a batch of `total` bytes: `torch.get_num_threads()`, as torch.stack
/// copies large inputs, up to `SPLIT_COPY_THREADS`, for a batch of at least `SPLIT_COPY_MIN`
/// bytes; one on a worker thread, and in a worker process (torch.set_num_threads(1) there, as
/// in torch's workers).
fn copy_threads(py: Python<'_>, h: &Handles, total: usize) -> PyResult<usize> {
    if total < SPLIT_COPY_MIN || ONE_THREAD.with(|one| one.get()) {
        return Ok(1);
    }
    let n: usize = h.get_num_threads.call0(py)?.extract(py)?;
    Ok(n.clamp(1, SPLIT_COPY_THREADS))
}

/// `copy_rows(first_row, rows)` over `rows` in `threads` contiguous chunks, each on a thread of
/// this call (none outlives it, so a fork never finds one half-way).
fn split_copy(rows: &[usize], threads: usize, copy_rows: impl Fn(usize, &[usize]) + Sync) {
    if threads <= 1 || rows.len() < 2 {
        return copy_rows(0, rows);
    }
    let per = rows.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut chunks = rows.chunks(per).enumerate();
        let mine = chunks.next();
        for (c, chunk) in chunks {
            let copy_rows = &copy_rows;
            scope.spawn(move || copy_rows(c * per, chunk));
        }
        if let Some((_, chunk)) = mine {
            copy_rows(0, chunk);
        }
    });
}

/// `fast_collate(batch)`: the collated batch, or None when the general path must run.
#[pyfunction(name = "fast_collate")]
fn py_fast_collate<'py>(batch: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    fast_collate(batch, Outputs::default())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(py_fast_collate, m)?)?;
    m.add_function(wrap_pyfunction!(split_stacks, m)?)?;
    Ok(())
}
