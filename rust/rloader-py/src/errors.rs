//! The one place where errors become Python exceptions.
//!
//! Each error of the Rust core (`WeightError` of rloader-core, `QueueError` of rloader-queue,
//! `PoolError` of rloader-workers) maps to the exception type torch raises for the same
//! failure, with the core's message, which says what to fix. The few errors that only the
//! binding can make (a Python protocol not met) are made here too.

use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyTypeError};
use pyo3::PyErr;
use rloader_core::WeightError;
use rloader_queue::QueueError;
use rloader_workers::PoolError;

/// An error of the Rust core on its way to Python: `?` converts it (the orphan rule forbids
/// `From<WeightError> for PyErr`), and `.map_err(to_py)` where a `PyErr` is wanted at once.
#[derive(Debug)]
pub enum CoreError {
    Weight(WeightError),
    Queue(QueueError),
    Pool(PoolError),
}

impl From<WeightError> for CoreError {
    fn from(e: WeightError) -> Self {
        CoreError::Weight(e)
    }
}

impl From<QueueError> for CoreError {
    fn from(e: QueueError) -> Self {
        CoreError::Queue(e)
    }
}

impl From<PoolError> for CoreError {
    fn from(e: PoolError) -> Self {
        CoreError::Pool(e)
    }
}

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        match e {
            // torch.multinomial raises RuntimeError for every invalid distribution.
            CoreError::Weight(e) => PyRuntimeError::new_err(e.to_string()),
            // The hand-off between processes failing is the loader failing: torch raises
            // RuntimeError for its dead or stuck workers and its timeouts too.
            CoreError::Queue(e) => PyRuntimeError::new_err(e.to_string()),
            CoreError::Pool(PoolError::NoWorkers) => {
                PyTypeError::new_err(PoolError::NoWorkers.to_string())
            }
            CoreError::Pool(e) => PyRuntimeError::new_err(e.to_string()),
        }
    }
}

/// Any core error as the Python exception it maps to.
pub fn to_py(e: impl Into<CoreError>) -> PyErr {
    e.into().into()
}

/// The error torch's DataLoader iterators raise when pickled (its arguments as torch gives them).
pub fn not_picklable(class: &str) -> PyErr {
    PyNotImplementedError::new_err(("{} cannot be pickled", class.to_string()))
}

/// `len()` of an iterator that does not know its length (the pin thread's).
pub fn no_length() -> PyErr {
    PyTypeError::new_err("this iterator has no length")
}

/// A worker's ExceptionWrapper whose `reraise()` returned instead of raising.
pub fn did_not_reraise() -> PyErr {
    PyRuntimeError::new_err("a worker's error did not re-raise")
}
