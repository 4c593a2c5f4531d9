//! The index streams every rloader sampler hands out.
//!
//! A sampler's order lives in Rust (`rloader-core`) and reaches its two kinds of consumer
//! through these types, so both always see the same order:
//! - Python code iterating a sampler gets `itertools.chain.from_iterable(IndexChunks)`: each
//!   `__next__` here returns a list of up to `CHUNK` ints, and `chain` hands them out one by one
//!   at C speed;
//! - `BatchStream` (what `BatchSampler.__iter__` returns) yields one list per batch, and the
//!   DataLoader's loop pulls batches from it as plain `u64`s without creating a Python object
//!   per index.
//!
//! Seeds are drawn lazily, as torch's generator-based samplers do: a stream starts `Pending`
//! with a Python factory, and the first pull calls it (drawing the seed from the user's
//! `torch.Generator` or torch's global RNG), so the RNG is consumed in the same order as with
//! torch.utils.data.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyList};

use crate::wait;

/// An index stream built by `samplers.rs`. `Sync` because pyclasses may be shared across threads.
pub trait IndexSource: Send + Sync {
    /// Appends up to `max` indices to `out`; fewer only at the end of the stream.
    fn fill(&mut self, out: &mut Vec<u64>, max: usize);

    /// Whether `fill` may wait for another thread (then callers release the GIL around it).
    fn may_wait(&self) -> bool {
        false
    }
}

/// Discards the next `n` indices of `it` (fewer if it ends first): the draws happen as if they
/// were handed out, so what follows is what would have followed. Computing (and, for a
/// prefetched stream, short waits for its thread), so without the GIL.
fn skip_in(py: Python<'_>, it: &mut Indices, n: u64) -> PyResult<()> {
    wait::briefly(py, || {
        let mut scratch = Vec::with_capacity(CHUNK);
        let mut left = n;
        while left > 0 {
            scratch.clear();
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(CHUNK);
            it.fill(&mut scratch, want);
            if scratch.is_empty() {
                break;
            }
            left -= scratch.len() as u64;
        }
    })
}

/// Fills `out` from `it`, without the GIL when the fill may wait (NOTE [Waiting] in wait.rs).
fn fill_from(py: Python<'_>, it: &mut Indices, out: &mut Vec<u64>, max: usize) -> PyResult<()> {
    if it.may_wait() {
        wait::briefly(py, || it.fill(out, max))
    } else {
        it.fill(out, max);
        Ok(())
    }
}

pub type Indices = Box<dyn IndexSource>;

/// Any iterator of indices, filled one `next()` at a time.
pub struct Plain<I>(pub I);

impl<I: Iterator<Item = u64> + Send + Sync> IndexSource for Plain<I> {
    fn fill(&mut self, out: &mut Vec<u64>, max: usize) {
        out.extend(self.0.by_ref().take(max));
    }
}

impl IndexSource for rloader_core::weighted::WeightedIndices {
    fn fill(&mut self, out: &mut Vec<u64>, max: usize) {
        self.next_chunk(out, max);
    }
}

/// NOTE [Prefetched indices] in rloader-core's prefetch.rs: the draws run a few chunks ahead on
/// a thread of their own.
impl<S: rloader_core::prefetch::ChunkSource + Sync + 'static> IndexSource
    for rloader_core::prefetch::Prefetched<S>
{
    fn fill(&mut self, out: &mut Vec<u64>, max: usize) {
        rloader_core::prefetch::Prefetched::fill(self, out, max);
    }

    fn may_wait(&self) -> bool {
        true
    }
}

/// `Indices` from any iterator.
pub fn plain<I: Iterator<Item = u64> + Send + Sync + 'static>(it: I) -> Indices {
    Box::new(Plain(it))
}

/// How many indices one `IndexChunks.__next__` returns.
const CHUNK: usize = 8192;

/// An index stream whose seed may not be drawn yet.
pub enum LazyIndices {
    /// Not started: calling the factory returns a ready `IndexChunks`.
    Pending(Py<PyAny>),
    Ready(Indices),
}

impl LazyIndices {
    /// Starts the stream if needed and returns it.
    pub fn ready(&mut self, py: Python<'_>) -> PyResult<&mut Indices> {
        if let LazyIndices::Pending(factory) = self {
            let made = factory.bind(py).call0()?;
            let mut chunks = made.extract::<PyRefMut<'_, IndexChunks>>().map_err(|_| {
                PyTypeError::new_err("an index-stream factory must return an IndexChunks")
            })?;
            match std::mem::replace(
                &mut chunks.source,
                LazyIndices::Ready(plain(std::iter::empty())),
            ) {
                LazyIndices::Ready(it) => *self = LazyIndices::Ready(it),
                LazyIndices::Pending(_) => {
                    return Err(PyTypeError::new_err(
                        "an index-stream factory must return a started stream",
                    ))
                }
            }
        }
        match self {
            LazyIndices::Ready(it) => Ok(it),
            LazyIndices::Pending(_) => unreachable!("started above"),
        }
    }
}

/// A sampler's indices as lists of up to 8192 ints; see the module docs.
#[pyclass(module = "rloader._rloader")]
pub struct IndexChunks {
    pub(crate) source: LazyIndices,
}

impl IndexChunks {
    pub fn ready(indices: Indices) -> Self {
        IndexChunks {
            source: LazyIndices::Ready(indices),
        }
    }
}

#[pymethods]
impl IndexChunks {
    /// A stream whose first pull calls `factory()`, which must return a ready `IndexChunks`.
    #[staticmethod]
    fn lazy(factory: Py<PyAny>) -> Self {
        IndexChunks {
            source: LazyIndices::Pending(factory),
        }
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let it = self.source.ready(py)?;
        let mut chunk = Vec::with_capacity(CHUNK);
        fill_from(py, it, &mut chunk, CHUNK)?;
        if chunk.is_empty() {
            return Ok(None);
        }
        Ok(Some(PyList::new(py, chunk)?))
    }
}

enum BatchSource {
    /// Indices generated in Rust.
    Rust(LazyIndices),
    /// Any Python iterable of keys (a user's sampler), not iterated yet: like torch's generator,
    /// `iter(sampler)` runs at the first pull. Keys pass through untouched.
    PythonPending(Py<PyAny>),
    Python(Py<PyIterator>),
}

/// Batches of indices: what `BatchSampler.__iter__` returns.
#[pyclass(module = "rloader._rloader")]
pub struct BatchStream {
    source: BatchSource,
    batch_size: usize,
    drop_last: bool,
    done: bool,
    /// A resumed epoch's batches that were handed out before: dropped as they come.
    handed: Option<Resumed>,
}

/// Of the first `end` batches, which a resumed epoch must still produce (`keep`, increasing;
/// every other one was handed out before the checkpoint); `pos` is the next batch's number.
struct Resumed {
    pos: u64,
    end: u64,
    keep: std::collections::VecDeque<u64>,
}

/// One batch as `BatchStream` produces it.
pub enum Batch {
    Indices(Vec<u64>),
    Keys(Vec<Py<PyAny>>),
}

impl Batch {
    /// The batch as Python sees it from an iterator: a list of its keys.
    pub fn into_list(self, py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
        match self {
            Batch::Indices(ix) => PyList::new(py, ix),
            Batch::Keys(keys) => PyList::new(py, keys),
        }
    }
}

impl BatchStream {
    /// Pulls the next batch, or `None` at the end. `buf` is reused between calls.
    pub fn next_batch(&mut self, py: Python<'_>, buf: &mut Vec<u64>) -> PyResult<Option<Batch>> {
        self.drop_handed(py)?;
        if let Some(r) = &mut self.handed {
            // The batch about to be made is the next kept one, or the first past `end`.
            if r.keep.front() == Some(&r.pos) {
                r.keep.pop_front();
            }
            r.pos += 1;
            if r.pos >= r.end && r.keep.is_empty() {
                self.handed = None;
            }
        }
        self.produce(py, buf)
    }

    /// Drops the batches handed out before a resume, up to the next one to produce.
    fn drop_handed(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(r) = &mut self.handed else {
            return Ok(());
        };
        let next = r.keep.front().copied().unwrap_or(r.end).min(r.end);
        let dropped = next.saturating_sub(r.pos);
        r.pos = r.pos.max(next);
        self.discard(py, dropped)
    }

    /// Discards the next `batches` batches, drawing them as if they had been handed out (a
    /// stream's seed is drawn now if it was not yet, even for 0).
    fn discard(&mut self, py: Python<'_>, batches: u64) -> PyResult<()> {
        match &mut self.source {
            BatchSource::Rust(src) => {
                let it = src.ready(py)?;
                skip_in(py, it, batches.saturating_mul(self.batch_size as u64))?;
            }
            _ => {
                let mut buf = Vec::new();
                if let BatchSource::PythonPending(iterable) = &self.source {
                    let iter = iterable.bind(py).try_iter()?.unbind();
                    self.source = BatchSource::Python(iter);
                }
                for _ in 0..batches {
                    if self.produce(py, &mut buf)?.is_none() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn produce(&mut self, py: Python<'_>, buf: &mut Vec<u64>) -> PyResult<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        let want = self.batch_size;
        let batch = match &mut self.source {
            BatchSource::Rust(src) => {
                let it = src.ready(py)?;
                buf.clear();
                fill_from(py, it, buf, want)?;
                if buf.is_empty() || (self.drop_last && buf.len() < want) {
                    None
                } else {
                    Some(Batch::Indices(std::mem::take(buf)))
                }
            }
            BatchSource::PythonPending(iterable) => {
                let iter = iterable.bind(py).try_iter()?.unbind();
                self.source = BatchSource::Python(iter);
                return self.produce(py, buf);
            }
            BatchSource::Python(iter) => {
                let mut iter = iter.bind(py).clone();
                // Room grows with the keys: a batch_size of 10^12 over 3 keys is valid.
                let mut keys = Vec::with_capacity(want.min(1 << 12));
                while keys.len() < want {
                    match iter.next() {
                        Some(key) => keys.push(key?.unbind()),
                        None => break,
                    }
                }
                if keys.is_empty() || (self.drop_last && keys.len() < want) {
                    None
                } else {
                    Some(Batch::Keys(keys))
                }
            }
        };
        if batch.is_none() {
            self.done = true;
        }
        Ok(batch)
    }
}

#[pymethods]
impl BatchStream {
    /// Discards the first `batches` batches as if they had been handed out, but those numbered
    /// in `keep` (a resumed epoch out of order: NOTE [Resume]), which still come, in order,
    /// before the rest. The batches up to the first kept one are discarded now (the sampler's
    /// seed is drawn now if it was not yet, even for 0), the others as the stream reaches
    /// them. Indices made in Rust are skipped without a Python object each; keys of a Python
    /// sampler are drawn and dropped.
    #[pyo3(signature = (batches, keep=Vec::new()))]
    fn skip(&mut self, py: Python<'_>, batches: u64, mut keep: Vec<u64>) -> PyResult<()> {
        keep.retain(|&k| k < batches);
        keep.sort_unstable();
        keep.dedup();
        self.handed = Some(Resumed {
            pos: 0,
            end: batches,
            keep: keep.into(),
        });
        self.discard(py, 0)?; // the seed, now
        self.drop_handed(py)
    }

    /// Batches of a Rust index stream (`IndexChunks`, started or not).
    #[staticmethod]
    fn from_indices(
        mut chunks: PyRefMut<'_, IndexChunks>,
        batch_size: usize,
        drop_last: bool,
    ) -> Self {
        let source = std::mem::replace(
            &mut chunks.source,
            LazyIndices::Ready(plain(std::iter::empty())),
        );
        BatchStream {
            source: BatchSource::Rust(source),
            batch_size,
            drop_last,
            done: false,
            handed: None,
        }
    }

    /// Batches of any Python iterable.
    #[staticmethod]
    fn from_iterable(iterable: Py<PyAny>, batch_size: usize, drop_last: bool) -> Self {
        BatchStream {
            source: BatchSource::PythonPending(iterable),
            batch_size,
            drop_last,
            done: false,
            handed: None,
        }
    }

    /// Whether the stream has ended (a draw found no batch left).
    #[getter]
    fn exhausted(&self) -> bool {
        self.done
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let mut buf = Vec::new();
        let batch = self.next_batch(py, &mut buf)?;
        batch.map(|b| b.into_list(py)).transpose()
    }
}
