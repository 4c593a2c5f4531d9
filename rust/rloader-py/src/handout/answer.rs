//! `Answer`: what a worker, process or thread, answered to one task.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::errors::did_not_reraise;

/// A worker's dataset state after a batch, and whether its iterator ended making it.
pub type WorkerState = (Py<PyAny>, bool);

/// What a worker (process or thread) answered to one task.
pub enum Answer {
    /// A batch, and with `worker_states` its worker's dataset state right after making it and
    /// whether the dataset's iterator ended there.
    Batch(Py<PyAny>, Option<WorkerState>),
    /// A worker's exception (an ExceptionWrapper, re-raised when handed out).
    Error(Py<PyAny>),
    /// The answer could not be taken in (unpickling the batch failed, say): the task's result
    /// is that error, raised in its turn, so no task is left unanswered.
    Failed(PyErr),
}

impl Answer {
    /// The worker's dataset state a batch came with, taken out of it (None: not said).
    pub fn take_state(&mut self) -> Option<WorkerState> {
        match self {
            Answer::Batch(_, state) => state.take(),
            _ => None,
        }
    }

    /// The batch to hand out, or the error to raise in its place.
    pub fn into_batch(self, py: Python<'_>) -> Result<Bound<'_, PyAny>, PyErr> {
        match self {
            Answer::Batch(batch, _) => Ok(batch.into_bound(py)),
            Answer::Error(wrapper) => Err(reraise(py, &wrapper)),
            Answer::Failed(err) => Err(err),
        }
    }

    /// Lets the garbage collector see a result waiting to be handed out.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Answer::Batch(obj, state) => {
                visit.call(obj)?;
                if let Some((state, _)) = state {
                    visit.call(state)?;
                }
                Ok(())
            }
            Answer::Error(obj) => visit.call(obj),
            Answer::Failed(_) => Ok(()),
        }
    }
}

/// The exception a worker's ExceptionWrapper stands for (its `reraise()`).
pub fn reraise(py: Python<'_>, wrapper: &Py<PyAny>) -> PyErr {
    match wrapper.bind(py).call_method0("reraise") {
        Err(err) => err,
        Ok(_) => did_not_reraise(),
    }
}
