//! `Fetcher`: one batch of keys in, one collated batch out.
//!
//! The fetch-and-collate step of torch's `_MapDatasetFetcher` / `_IterableDatasetFetcher`,
//! shared by the single-process loop (single_process.rs), the worker process loop
//! (process/worker.rs) and worker threads (threads/worker.rs). Python is entered only for the
//! dataset (`__getitem__`, `__getitems__`, `__next__`) and a custom `collate_fn`; with the
//! default collate_fn, common batches are collated by collate/.
//!
//! `BatchOptions`, how each batch is made (collation, batching of an iterable dataset,
//! pinning, batch memory), is what the single-process loop and worker threads are built with.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyList};
use pyo3::{PyTraverseError, PyVisit};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::collate::{fast_collate, LargeOutputs, StackHelpers};
use crate::memory::stacking;
use crate::memory::BatchBuffers;
use crate::sampling::KeyBatch;
use crate::stats::{Stage, Stats};

/// How each batch is made: what `LoaderIter` (single_process.rs) and `ThreadPool`
/// (threads/pool.rs) are built with alike. Every argument is keyword-only, so a misspelled or
/// missing one is a `TypeError` here.
///
/// - `auto_collation`: torch's: each key is a batch of keys, whose samples are collated;
/// - `batch_size`, `drop_last`: how an iterable dataset's samples are batched (`batch_size`
///   None: no auto-collation; a map-style dataset's sampler does its batching);
/// - `collate_fn`; `collate_plan`: its `CollatePlan` (python/rloader/_collate.py) when it is a
///   default collate, else None;
/// - `pin`: pins each batch when set (pin_memory with an accelerator);
/// - `buffers`: the loader's recycled batch memory, kept across its epochs, which the default
///   collate's large outputs go to (NOTE [Batch memory] in rloader-memory).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct BatchOptions {
    auto_collation: bool,
    batch_size: Option<usize>,
    drop_last: bool,
    collate_fn: Py<PyAny>,
    collate_plan: Option<Py<PyAny>>,
    pin: Option<Py<PyAny>>,
    buffers: Option<Py<BatchBuffers>>,
}

#[pymethods]
impl BatchOptions {
    #[new]
    #[pyo3(signature = (*, auto_collation, batch_size, drop_last, collate_fn, collate_plan, pin,
                        buffers=None))]
    fn new(
        auto_collation: bool,
        batch_size: Option<usize>,
        drop_last: bool,
        collate_fn: Py<PyAny>,
        collate_plan: Option<Py<PyAny>>,
        pin: Option<Py<PyAny>>,
        buffers: Option<Py<BatchBuffers>>,
    ) -> Self {
        BatchOptions {
            auto_collation,
            batch_size,
            drop_last,
            collate_fn,
            collate_plan,
            pin,
            buffers,
        }
    }

    // It holds the user's collate_fn (an option object normally lives only for the call that
    // builds a loop, but the collector must see through it if one is kept).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.collate_fn)?;
        visit.call(&self.collate_plan)?;
        visit.call(&self.pin)?;
        visit.call(&self.buffers)
    }
}

impl BatchOptions {
    /// The fetcher of one loop over `dataset`: a map-style one (`samples` None), or an
    /// iterable one whose iterator is `samples`.
    pub fn fetcher(
        &self,
        py: Python<'_>,
        dataset: Py<PyAny>,
        samples: Option<Py<PyIterator>>,
    ) -> PyResult<Fetcher> {
        let plan = self.collate_plan.as_ref().map(|p| p.bind(py).clone());
        let buffers = self.buffers.as_ref().map(|b| b.clone_ref(py));
        let collate = Collate::new(self.collate_fn.clone_ref(py), plan)?.with_buffers(buffers);
        Ok(match samples {
            None => Fetcher::map(py, dataset, self.auto_collation, collate)?,
            Some(samples) => {
                Fetcher::iterable(dataset, samples, self.batch_size, self.drop_last, collate)
            }
        })
    }

    /// What pins each batch, if batches are pinned.
    pub fn pin(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.pin.as_ref().map(|p| p.clone_ref(py))
    }

    pub fn auto_collation(&self) -> bool {
        self.auto_collation
    }
}

pub enum Collate {
    /// A default collate, by its `CollatePlan` (python/rloader/_collate.py, which holds the
    /// rule): the fast path when `plan.fast_path_may_run()`, else (and for what the fast path
    /// does not handle) `plan.general(batch)`.
    /// `buffers`: the recycled batch memory large outputs go to (the single-process loop's).
    Default {
        plan: Py<PyAny>,
        general: Py<PyAny>,
        buffers: Option<Py<BatchBuffers>>,
    },
    /// Any other `collate_fn`.
    Call(Py<PyAny>),
}

impl Collate {
    /// `collate_fn`, or the default collate whose plan is `plan`.
    pub fn new(collate_fn: Py<PyAny>, plan: Option<Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(match plan {
            Some(plan) => Collate::Default {
                general: plan.getattr(intern!(plan.py(), "general"))?.unbind(),
                plan: plan.unbind(),
                buffers: None,
            },
            None => Collate::Call(collate_fn),
        })
    }

    /// The default collate writes its large outputs into `buffers` (a custom collate_fn is
    /// left as it is).
    pub fn with_buffers(mut self, buffers: Option<Py<BatchBuffers>>) -> Self {
        if let Collate::Default { buffers: b, .. } = &mut self {
            *b = buffers;
        }
        self
    }
}

enum Kind {
    Map {
        batched: bool,
        getitems: Option<Py<PyAny>>,
    },
    Iterable {
        samples: Py<PyIterator>,
        batch_size: Option<usize>,
        drop_last: bool,
        ended: bool,
    },
}

pub struct Fetcher {
    dataset: Py<PyAny>,
    kind: Kind,
    collate: Collate,
    /// Where the time of fetching and collating is added (`DataLoader.stats()`).
    stats: Option<Py<Stats>>,
    /// Set when the fetcher's pool is stopping (worker threads): a batch being fetched is
    /// abandoned between two samples instead of being finished for no one.
    stop: Option<Arc<AtomicBool>>,
    /// Threads that stack large tensor batches beside this one (NOTE [Stack helpers]).
    helpers: StackHelpers,
}

/// The error of a fetch abandoned because its pool is stopping (`Fetcher::with_stop`); no one
/// sees it.
fn stopping_error() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err("rloader: the worker's pool is stopping")
}

impl Fetcher {
    /// For a map-style dataset; `batched` is torch's auto-collation.
    pub fn map(
        py: Python<'_>,
        dataset: Py<PyAny>,
        batched: bool,
        collate: Collate,
    ) -> PyResult<Self> {
        // torch checks `hasattr(ds, "__getitems__") and ds.__getitems__`.
        let getitems = match dataset.bind(py).getattr_opt("__getitems__")? {
            Some(f) if f.is_truthy()? => Some(f.unbind()),
            _ => None,
        };
        Ok(Fetcher {
            dataset,
            kind: Kind::Map { batched, getitems },
            collate,
            stats: None,
            stop: None,
            helpers: StackHelpers::default(),
        })
    }

    /// For an iterable-style dataset whose iterator is `samples`.
    pub fn iterable(
        dataset: Py<PyAny>,
        samples: Py<PyIterator>,
        batch_size: Option<usize>,
        drop_last: bool,
        collate: Collate,
    ) -> Self {
        Fetcher {
            dataset,
            kind: Kind::Iterable {
                samples,
                batch_size,
                drop_last,
                ended: false,
            },
            collate,
            stats: None,
            stop: None,
            helpers: StackHelpers::default(),
        }
    }

    /// Adds this fetcher's fetch and collate times to `stats`.
    pub fn with_stats(mut self, stats: Py<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Abandons a batch between two samples once `stop` is set (see `stop`).
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = Some(stop);
        self
    }

    fn timed<T>(&self, stage: Stage, f: impl FnOnce() -> T) -> T {
        match &self.stats {
            Some(stats) => stats.get().time(stage, f),
            None => f(),
        }
    }

    /// Lets the garbage collector see the dataset, its iterator and the collate function.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.dataset)?;
        match &self.kind {
            Kind::Map { getitems, .. } => visit.call(getitems)?,
            Kind::Iterable { samples, .. } => visit.call(samples)?,
        }
        match &self.collate {
            Collate::Default {
                plan,
                general,
                buffers,
            } => {
                visit.call(plan)?;
                visit.call(general)?;
                visit.call(buffers)
            }
            Collate::Call(f) => visit.call(f),
        }
    }

    /// Whether an iterable dataset's iterator has ended (the last batch may have been short).
    pub fn ended(&self) -> bool {
        matches!(self.kind, Kind::Iterable { ended: true, .. })
    }

    /// Replaces an iterable dataset's iterator (a new epoch of persistent workers).
    pub fn restart(&mut self, new_samples: Py<PyIterator>) {
        if let Kind::Iterable { samples, ended, .. } = &mut self.kind {
            *samples = new_samples;
            *ended = false;
        }
    }

    /// Fetches and collates the samples of `keys` (map-style datasets). `spent` gets the
    /// indices vector back for reuse.
    pub fn fetch_keys<'py>(
        &self,
        py: Python<'py>,
        keys: KeyBatch<'py>,
        spent: &mut Vec<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Kind::Map { batched, getitems } = &self.kind else {
            unreachable!("fetch_keys is for map-style datasets")
        };
        let ds = self.dataset.bind(py);
        if !*batched {
            let key = match keys {
                KeyBatch::Object(k) => k,
                KeyBatch::Indices(ix) => ix[0].into_pyobject(py)?.into_any(),
            };
            let sample = self.timed(Stage::Fetch, || ds.get_item(key))?;
            return self.collate(py, sample);
        }
        let stop = self.stop.as_deref();
        let samples = self.timed(Stage::Fetch, || {
            // A `__getitems__` may make its samples where the default collate puts the batch
            // (and no fetch sees an outer fetch's lending).
            let _lent = match &self.collate {
                Collate::Default { buffers, .. } => {
                    stacking::lend(py, getitems.is_some(), buffers.as_ref())
                }
                Collate::Call(_) => stacking::lend(py, false, None),
            };
            Self::samples(py, ds, getitems, keys, spent, stop)
        })?;
        self.collate(py, samples)
    }

    /// The samples of `keys`, as torch's fetcher gets them.
    fn samples<'py>(
        py: Python<'py>,
        ds: &Bound<'py, PyAny>,
        getitems: &Option<Py<PyAny>>,
        keys: KeyBatch<'py>,
        spent: &mut Vec<u64>,
        stop: Option<&AtomicBool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let stopping = || stop.is_some_and(|s| s.load(Ordering::Acquire));
        // As torch's fetcher: `__getitems__(batch)` when the dataset has it, else one
        // `dataset[key]` per key. A batch sampler's own batch object is passed as it is.
        Ok(match (getitems, keys) {
            (Some(f), KeyBatch::Indices(ix)) => {
                let list = PyList::new(py, &ix)?;
                *spent = ix;
                f.bind(py).call1((list,))?
            }
            (Some(f), KeyBatch::Object(batch)) => f.bind(py).call1((batch,))?,
            (None, KeyBatch::Indices(ix)) => {
                let samples = PyList::empty(py);
                for &i in &ix {
                    if stopping() {
                        return Err(stopping_error());
                    }
                    samples.append(ds.get_item(i)?)?;
                }
                *spent = ix;
                samples.into_any()
            }
            (None, KeyBatch::Object(batch)) => {
                let samples = PyList::empty(py);
                for key in batch.try_iter()? {
                    if stopping() {
                        return Err(stopping_error());
                    }
                    samples.append(ds.get_item(key?)?)?;
                }
                samples.into_any()
            }
        })
    }

    /// The next collated batch of an iterable-style dataset, or None once it is exhausted.
    pub fn fetch_next<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Kind::Iterable {
            samples,
            batch_size,
            drop_last,
            ended,
        } = &mut self.kind
        else {
            unreachable!("fetch_next is for iterable-style datasets")
        };
        if *ended {
            return Ok(None);
        }
        let start = std::time::Instant::now();
        let mut it = samples.bind(py).clone();
        let data = match *batch_size {
            None => match it.next() {
                None => {
                    *ended = true;
                    return Ok(None);
                }
                Some(x) => x?,
            },
            Some(want) => {
                let out = PyList::empty(py);
                while out.len() < want {
                    match it.next() {
                        Some(x) => out.append(x?)?,
                        None => {
                            *ended = true;
                            break;
                        }
                    }
                }
                if out.is_empty() || (*drop_last && out.len() < want) {
                    *ended = true;
                    return Ok(None);
                }
                out.into_any()
            }
        };
        if let Some(stats) = &self.stats {
            stats.get().add(Stage::Fetch, start.elapsed());
        }
        self.collate(py, data).map(Some)
    }

    fn collate<'py>(
        &self,
        py: Python<'py>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.timed(Stage::Collate, || self.collate_untimed(py, data))
    }

    fn collate_untimed<'py>(
        &self,
        py: Python<'py>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.collate {
            Collate::Call(f) => f.bind(py).call1((data,)),
            Collate::Default {
                plan,
                general,
                buffers,
            } => {
                let may_run = plan
                    .bind(py)
                    .call_method0(intern!(py, "fast_path_may_run"))?;
                if may_run.is_truthy()? {
                    if let Some(out) = stacking::collate_stacked(&data, general.bind(py))? {
                        return Ok(out);
                    }
                    let to = LargeOutputs {
                        memory: buffers.as_ref().map(|b| b.get().memory()),
                        helpers: Some(&self.helpers),
                    };
                    if let Some(out) = fast_collate(&data, to)? {
                        return Ok(out);
                    }
                }
                general.bind(py).call1((data,))
            }
        }
    }
}
