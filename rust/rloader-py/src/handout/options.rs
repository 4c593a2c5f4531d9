//! `HandOutOptions`: how a multi-worker iterator hands its batches out. Both `PoolIter`
//! (process/pool/) and `ThreadIter` (threads/iter.rs) are built with one, as the options mean
//! the same for both.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::Scheduler;

use super::{Answer, HandOutState};
use crate::stats::Stats;

/// How a multi-worker iterator hands its batches out: in which order, how long it waits, what
/// its length is, and whether its workers outlive the epoch. Every argument is keyword-only,
/// so a misspelled or missing one is a `TypeError` here.
///
/// - `in_order`: hand batches out in the sampler's order (torch's `in_order`);
/// - `timeout`: seconds a batch may take to come (0: no limit), torch's `timeout`;
/// - `persistent`: the workers stay for the next epoch (`persistent_workers`);
/// - `length_of`: `len(iterator)` is `len(length_of)`, the loader's index sampler as in torch
///   (None: `len()` is a `TypeError`, for the pin thread's iterator, whose `PinnedBatches`
///   answers it);
/// - `reported_len`: `(dataset, n)` when `len(loader)` of an iterable dataset was asked: torch's
///   warning once more than `n` batches were handed out;
/// - `first_worker`: the worker whose batch is handed out first, where the round robin begins
///   (a resumed iterable dataset's goes on with the worker whose batch came next).
#[pyclass(module = "rloader._rloader", frozen)]
pub struct HandOutOptions {
    in_order: bool,
    timeout: Option<Duration>,
    persistent: bool,
    length_of: Option<Py<PyAny>>,
    reported_len: Option<(Py<PyAny>, usize)>,
    first_worker: usize,
}

#[pymethods]
impl HandOutOptions {
    #[new]
    #[pyo3(signature = (*, in_order, timeout, persistent, length_of, reported_len=None,
                        first_worker=0))]
    fn new(
        in_order: bool,
        timeout: f64,
        persistent: bool,
        length_of: Option<Py<PyAny>>,
        reported_len: Option<(Py<PyAny>, usize)>,
        first_worker: usize,
    ) -> Self {
        HandOutOptions {
            in_order,
            timeout: (timeout > 0.0).then(|| Duration::from_secs_f64(timeout)),
            persistent,
            length_of,
            reported_len,
            first_worker,
        }
    }

    // It holds the user's sampler and dataset (an option object normally lives only for the
    // call that builds an iterator, but the collector must see through it if one is kept).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.length_of)?;
        if let Some((dataset, _)) = &self.reported_len {
            visit.call(dataset)?;
        }
        Ok(())
    }
}

impl HandOutOptions {
    /// The order of tasks and answers for `num_workers` workers, each with up to
    /// `prefetch_factor` tasks in flight.
    pub fn scheduler(&self, num_workers: usize, prefetch_factor: usize) -> Scheduler<Answer> {
        let mut scheduler = Scheduler::new(num_workers, prefetch_factor.max(1), self.in_order);
        scheduler.start_at(self.first_worker);
        scheduler
    }

    /// Nothing handed out yet by `num_workers` workers; the epoch's time goes to `stats`.
    pub fn state(
        &self,
        py: Python<'_>,
        num_workers: usize,
        stats: Py<Stats>,
    ) -> PyResult<HandOutState> {
        let length_of = self.length_of.as_ref().map(|l| l.clone_ref(py));
        let reported_len = self
            .reported_len
            .as_ref()
            .map(|(dataset, n)| (dataset.clone_ref(py), *n));
        HandOutState::new(py, num_workers, length_of, reported_len, stats)
    }

    /// How long a batch may take to come (None: no limit).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Whether the workers stay for the next epoch.
    pub fn persistent(&self) -> bool {
        self.persistent
    }
}

/// `_set_prefetch_factor` of the iterators: bounds `scheduler`'s tasks drawn and not handed
/// out to `prefetch_factor` per worker from now on (`prefetch_factor="auto"`;
/// `Scheduler::set_prefetch_factor`): more are drawn at the next `next()`, or fewer as batches
/// are handed out.
pub fn set_prefetch_factor(
    scheduler: &mut Scheduler<Answer>,
    prefetch_factor: usize,
) -> PyResult<()> {
    if prefetch_factor == 0 {
        return Err(PyValueError::new_err(
            "prefetch_factor must be greater than 0",
        ));
    }
    scheduler.set_prefetch_factor(prefetch_factor);
    Ok(())
}
