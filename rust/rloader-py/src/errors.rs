//! The one place where errors of the Rust core become Python exceptions.
//!
//! Each variant maps to the exception type torch raises for the same bad input, with a
//! message that says what to fix.

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyErr;
use rloader_core::WeightError;

/// Wraps a core error so `?` converts it (the orphan rule forbids `From<WeightError> for PyErr`).
pub struct CoreError(pub WeightError);

impl From<WeightError> for CoreError {
    fn from(e: WeightError) -> Self {
        CoreError(e)
    }
}

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        // torch.multinomial raises RuntimeError for every invalid distribution.
        PyRuntimeError::new_err(e.0.to_string())
    }
}
