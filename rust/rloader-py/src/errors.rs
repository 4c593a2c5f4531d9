//! The one place where errors become Python exceptions.
//!
//! Each error of the Rust core (`WeightError` of rloader-core, `QueueError` of rloader-queue,
//! `PoolError` of rloader-workers) maps to the exception type torch raises for the same
//! failure, with the core's message, which says what to fix. `SharedError` (rloader-shared,
//! which torch has no counterpart of) maps to the built-in exception Python raises for the
//! same kind of failure. The few errors that only the
//! binding can make (a Python protocol not met) are made here too.

use pyo3::exceptions::{
    PyLookupError, PyMemoryError, PyNotImplementedError, PyOSError, PyOverflowError,
    PyPermissionError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::PyErr;
use rloader_core::WeightError;
use rloader_queue::QueueError;
use rloader_shared::SharedError;
use rloader_workers::PoolError;

/// An error of the Rust core on its way to Python: `?` converts it (the orphan rule forbids
/// `From<WeightError> for PyErr`), and `.map_err(to_py)` where a `PyErr` is wanted at once.
#[derive(Debug)]
pub enum CoreError {
    Weight(WeightError),
    Queue(QueueError),
    Pool(PoolError),
    Shared(SharedError),
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

impl From<SharedError> for CoreError {
    fn from(e: SharedError) -> Self {
        CoreError::Shared(e)
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
            CoreError::Shared(e) => shared_error(e),
        }
    }
}

fn shared_error(e: SharedError) -> PyErr {
    let msg = e.to_string();
    match e {
        SharedError::Os { source, .. } => match source.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, msg)),
            None => PyOSError::new_err(msg),
        },
        SharedError::NoMemory { .. } => PyMemoryError::new_err(msg),
        SharedError::BadInput(_) | SharedError::Mismatch(_) => PyValueError::new_err(msg),
        SharedError::TooLarge(_) => PyOverflowError::new_err(msg),
        SharedError::Changed | SharedError::Corrupt(_) => PyRuntimeError::new_err(msg),
        SharedError::NotServed(_) => PyLookupError::new_err(msg),
        SharedError::Untrusted { .. } => PyPermissionError::new_err(msg),
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
