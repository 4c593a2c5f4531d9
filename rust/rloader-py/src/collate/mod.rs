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
//! `torch.stack(..., out=...)` as torch's collate does in a worker. Elsewhere large arrays and
//! tensors go into the loader's recycled batch memory (NOTE [Batch memory] in rloader-memory),
//! pinned or not.

mod copy_threads;
mod stack_helpers;

pub use copy_threads::copy_on_this_thread_only;
pub use stack_helpers::StackHelpers;

use copy_threads::{copy_threads, split_copy};
use stack_helpers::{split_stacks, writer_of};

use crate::memory::{pooled_empty, slot_empty, ArrayView};
use crate::torch_api::{nbytes_of, torch_api, TorchApi};
use pyo3::exceptions::PyBufferError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use rloader_memory::BatchMemory;

/// Where a batch's large outputs are made, outside a worker's slots.
#[derive(Clone, Copy, Default)]
pub struct LargeOutputs<'a> {
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
    to: LargeOutputs<'_>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = batch.py();
    let h = torch_api(py)?;
    if torch_modes_active(py)? {
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
pub(crate) fn torch_modes_active(py: Python<'_>) -> PyResult<bool> {
    let h = torch_api(py)?;
    Ok(h.function_mode.bind(py).call0()?.is_truthy()?
        || h.dispatch_modes.bind(py).call0()?.extract::<usize>()? > 0)
}

fn all_exact<'py, T: pyo3::type_object::PyTypeInfo>(items: &[Bound<'py, PyAny>]) -> bool {
    items.iter().all(|x| x.is_exact_instance_of::<T>())
}

fn collate_items<'py>(
    py: Python<'py>,
    h: &TorchApi,
    to: LargeOutputs<'_>,
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
        if first.getattr(intern!(py, "is_nested"))?.is_truthy()?
            || !first.getattr(intern!(py, "layout"))?.is(h.strided.bind(py))
        {
            return Ok(None);
        }
        let stack = h.stack.bind(py);
        if first.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
            let mut shape = vec![items.len() as isize];
            shape.extend(
                first
                    .getattr(intern!(py, "shape"))?
                    .extract::<Vec<isize>>()?,
            );
            let dtype = first.getattr(intern!(py, "dtype"))?;
            if let Some(out) = slot_empty(py, &shape, &dtype)? {
                let kwargs = PyDict::new(py);
                kwargs.set_item(intern!(py, "out"), out)?;
                return Ok(Some(stack.call((batch, 0), Some(&kwargs))?));
            }
            if let Some(helpers) = to.helpers {
                if let Some(out) = helpers.stack(py, h, items, &shape, &dtype, to.memory)? {
                    return Ok(Some(out));
                }
            }
            if let Some(mem) = to.memory {
                if let Some(out) = pooled_stack(py, h, mem, batch, items, &shape, &dtype)? {
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
    h: &TorchApi,
    to: LargeOutputs<'_>,
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
    h: &TorchApi,
    to: LargeOutputs<'_>,
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
    h: &TorchApi,
    dtype: &Py<PyAny>,
    values: &[T],
) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "dtype"), dtype.bind(py))?;
    let out = h.empty.bind(py).call((values.len(),), Some(&kwargs))?;
    let ptr = out
        .call_method0(intern!(py, "data_ptr"))?
        .extract::<usize>()? as *mut T;
    // SAFETY: `out` is a fresh contiguous CPU tensor of `values.len()` elements of this size.
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), ptr, values.len()) };
    Ok(out)
}

/// Outputs from this size on come from the loop's recycled batch memory when it has one.
/// Smaller ones come from torch's allocator: glibc serves them from its heap's free lists,
/// below its initial mmap threshold (128 KiB), which are warm and not given back per batch.
pub(crate) const POOLED_MIN: usize = 128 * 1024;

/// Tensor batches from this size on come from the recycled batch memory when it is not pinned.
/// Stacking into a block costs more than a plain `torch.stack` (the block's tensor and its
/// writer are made through Python, and each item's dtype is read: ~40 µs a batch of 256 small
/// tensors), which on smaller batches is more than the page faults it saves: token windows'
/// 256 KiB batches collated 40% slower. From 1 MiB glibc may serve each fresh batch with pages
/// it has just given back (it trims its heap's top whenever more than its trim threshold lies
/// free there, and where a batch lands depends on all else the process allocated): 3 MiB
/// batches of (float32[3, 32, 32], int) pairs ran at 1.25-1.4M samples/s in some processes and
/// 0.24-0.4M in others, faulting every page of every batch (torch's own loop too); from blocks,
/// 1.05-1.1M in every one. Above 32 MiB (glibc's largest mmap threshold) every fresh batch is a
/// new mapping: 38 MiB of images faults for ~35 ms.
const POOLED_TENSOR_MIN: usize = 1 << 20;

/// The size from which a tensor batch is stacked into `mem` (pinned memory: every large batch,
/// since pinning one elsewhere copies it).
pub(crate) fn pooled_tensor_min(mem: &BatchMemory) -> usize {
    if mem.is_pinning() {
        POOLED_MIN
    } else {
        POOLED_TENSOR_MIN
    }
}

/// `torch.stack(batch)` written into a block of the loop's recycled batch memory (NOTE [Batch
/// memory]): a large batch lands on pages the process already has, instead of pages a fresh
/// allocation faults in (and the kernel zeroes) batch after batch, about ten times the copy's
/// own cost for 38 MB of images; pinned (NOTE [Pinned blocks]), pinning it copies nothing.
/// Or None, for `torch.stack` to make it as usual: a small
/// batch, mixed dtypes (torch promotes them, an `out=` would cast), a first item that is not
/// contiguous (torch's output then takes the inputs' memory format, channels-last for instance;
/// from a contiguous first item it is contiguous, as the block is), or a stack into `out=` that
/// raises (inputs that require grad; torch's own error then comes from the plain stack).
fn pooled_stack<'py>(
    py: Python<'py>,
    h: &TorchApi,
    mem: &BatchMemory,
    batch: &Bound<'py, PyAny>,
    items: &[Bound<'py, PyAny>],
    shape: &[isize],
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(nbytes) = nbytes_of(shape, dtype)?.filter(|&n| n >= pooled_tensor_min(mem)) else {
        return Ok(None);
    };
    for x in items {
        if !x.getattr(intern!(py, "dtype"))?.is(dtype) {
            return Ok(None);
        }
    }
    if !items[0]
        .call_method0(intern!(py, "is_contiguous"))?
        .is_truthy()?
    {
        return Ok(None);
    }
    let out = pooled_empty(py, h, mem, shape, dtype, nbytes)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "out"), writer_of(py, h, &out, shape, dtype)?)?;
    match h.stack.bind(py).call((batch, 0), Some(&kwargs)) {
        Ok(_) => Ok(Some(out)),
        Err(_) => Ok(None),
    }
}

/// Bytes from which `arrays_tensor` copies without the GIL.
const DETACHED_COPY: usize = 64 * 1024;

/// numpy arrays of one dtype and shape → one tensor `[len(batch), *shape]`, filled by memcpy.
fn arrays_tensor<'py>(
    py: Python<'py>,
    h: &TorchApi,
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
    let out = match slot_empty(py, &shape, dtype.bind(py))? {
        Some(out) => out,
        None => match mem {
            Some(mem) if each * views.len() >= POOLED_MIN => {
                pooled_empty(py, h, mem, &shape, dtype.bind(py), each * views.len())?
            }
            _ => {
                let kwargs = PyDict::new(py);
                kwargs.set_item(intern!(py, "dtype"), dtype.bind(py))?;
                h.empty
                    .bind(py)
                    .call((PyTuple::new(py, shape)?,), Some(&kwargs))?
            }
        },
    };
    let base = out
        .call_method0(intern!(py, "data_ptr"))?
        .extract::<usize>()?;
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

/// `fast_collate(batch)`: the collated batch, or None when the general path must run.
#[pyfunction(name = "fast_collate")]
fn py_fast_collate<'py>(batch: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    fast_collate(batch, LargeOutputs::default())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(py_fast_collate, m)?)?;
    m.add_function(wrap_pyfunction!(split_stacks, m)?)?;
    Ok(())
}
