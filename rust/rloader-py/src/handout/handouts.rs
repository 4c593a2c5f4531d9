//! `HandOuts`: what a multi-worker iterator has handed out to the user this epoch, for
//! `DataLoader.state_dict()` (NOTE [Resume] in python/rloader/_resume/__init__.py).
//!
//! It records, per batch handed out (or raised as its error): the task it answered (tasks are
//! numbered in the order their keys were drawn; `rloader_workers::HandedOutTasks` keeps the set
//! small out of order too), the worker that made it, and for a dataset that says where it is,
//! that worker's dataset state right after making it and whether its iterator ended there (a
//! short last batch). The workers of such an iterable dataset also say their dataset's state as
//! they start an epoch (persistent workers) and as their stream ends: what a loader between
//! epochs saves.
//!
//! Whoever hands batches to the user records them: `PoolIter.__next__`, or with pin_memory
//! `PinnedBatches.__next__` on the main thread (the pin thread only polls the PoolIter, and
//! gets each batch's record with it). The PoolIter itself touches its `HandOuts` only in
//! `__next__` and in `_reset`, which `PinnedBatches` calls with its thread stopped: the two are
//! never borrowed at once.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::HandedOutTasks;

#[pyclass(module = "rloader._rloader")]
pub struct HandOuts {
    tasks: HandedOutTasks,
    /// Per worker: its dataset's state after its last batch handed out, or at the start of the
    /// epoch (persistent workers say it when they restart), or None: as the loader's dataset;
    /// and whether its iterator had ended there.
    states: Vec<Option<Py<PyAny>>>,
    /// Per worker: whether `states` says where it is this epoch, even as None (its state could
    /// not be taken: a resume starts it afresh), or it says nothing yet.
    said: Vec<bool>,
    ended: Vec<bool>,
    /// Per worker: its dataset's state once its stream ended this epoch.
    end_states: Vec<Option<Py<PyAny>>>,
    /// The worker whose batch was handed out last.
    last_worker: Option<usize>,
}

fn nones(n: usize) -> Vec<Option<Py<PyAny>>> {
    (0..n).map(|_| None).collect()
}

fn cloned(py: Python<'_>, states: &[Option<Py<PyAny>>]) -> Vec<Option<Py<PyAny>>> {
    states
        .iter()
        .map(|s| s.as_ref().map(|s| s.clone_ref(py)))
        .collect()
}

impl HandOuts {
    pub fn new(num_workers: usize) -> Self {
        HandOuts {
            tasks: HandedOutTasks::new(),
            states: nones(num_workers),
            said: vec![false; num_workers],
            ended: vec![false; num_workers],
            end_states: nones(num_workers),
            last_worker: None,
        }
    }

    /// A new epoch (persistent workers): nothing handed out yet.
    pub fn reset(&mut self) {
        *self = HandOuts::new(self.states.len());
    }

    /// `worker`'s dataset state as it starts an epoch.
    pub fn set_start_state(&mut self, worker: usize, state: Py<PyAny>) {
        if let Some(slot) = self.states.get_mut(worker) {
            *slot = Some(state);
            self.said[worker] = true;
        }
    }

    /// `worker`'s dataset state once its stream ended.
    pub fn set_end_state(&mut self, worker: usize, state: Py<PyAny>) {
        if let Some(slot) = self.end_states.get_mut(worker) {
            *slot = Some(state);
        }
    }
}

#[pymethods]
impl HandOuts {
    /// Task `task`'s result, made by `worker`, was handed out; `state` is `(the worker's
    /// dataset state after making it, whether its iterator ended there)` (None: unchanged, as
    /// for an error).
    #[pyo3(signature = (task, worker, state=None))]
    pub fn record(&mut self, task: u64, worker: usize, state: Option<(Py<PyAny>, bool)>) {
        self.tasks.mark(task);
        self.last_worker = Some(worker);
        if let Some((state, ended)) = state {
            if worker < self.states.len() {
                self.states[worker] = Some(state);
                self.said[worker] = true;
                self.ended[worker] = ended;
            }
        }
    }

    /// `(end, holes)`: every task below `end` was handed out but those in `holes` (sorted).
    #[getter]
    fn tasks(&self) -> (u64, Vec<u64>) {
        (self.tasks.end(), self.tasks.holes().collect())
    }

    /// How many batches were handed out.
    #[getter]
    fn count(&self) -> u64 {
        self.tasks.count()
    }

    #[getter]
    fn states(&self, py: Python<'_>) -> Vec<Option<Py<PyAny>>> {
        cloned(py, &self.states)
    }

    /// Per worker: whether `states` holds where it is this epoch (None there: its state could
    /// not be taken), rather than nothing said yet.
    #[getter]
    fn said(&self) -> Vec<bool> {
        self.said.clone()
    }

    #[getter]
    fn ended(&self) -> Vec<bool> {
        self.ended.clone()
    }

    #[getter]
    fn end_states(&self, py: Python<'_>) -> Vec<Option<Py<PyAny>>> {
        cloned(py, &self.end_states)
    }

    #[getter]
    fn last_worker(&self) -> Option<usize> {
        self.last_worker
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for state in self.states.iter().chain(&self.end_states).flatten() {
            visit.call(state)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.states.iter_mut().for_each(|s| *s = None);
        self.end_states.iter_mut().for_each(|s| *s = None);
    }
}
