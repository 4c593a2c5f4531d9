//! `LengthWarning`: torch's warning when an IterableDataset yields more batches than
//! `len(loader)` said it would.

use pyo3::exceptions::PyUserWarning;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// torch's warning when an IterableDataset yields more batches than `len(loader)` said it
/// would: once per batch beyond it, from the iterator's `__next__` (`LoaderIter`, `PoolIter`,
/// and from Python, `PinnedBatches`).
#[pyclass(module = "rloader._rloader")]
pub struct LengthWarning {
    dataset: Py<PyAny>,
    reported: usize,
    yielded: usize,
    /// With workers, torch adds a hint about configuring each worker's replica.
    workers: bool,
}

impl LengthWarning {
    /// For `(dataset, len(loader) as reported)`, if `len(loader)` was called.
    pub fn new(reported: Option<(Py<PyAny>, usize)>, workers: bool) -> Option<Self> {
        reported.map(|(dataset, reported)| LengthWarning {
            dataset,
            reported,
            yielded: 0,
            workers,
        })
    }

    /// Counts one batch handed out, and warns past the reported length.
    pub fn yielded(&mut self, py: Python<'_>) -> PyResult<()> {
        self.yielded += 1;
        if self.yielded <= self.reported {
            return Ok(());
        }
        let mut msg = format!(
            "Length of IterableDataset {} was reported to be {}(when accessing len(dataloader)), \
             but {} samples have been fetched. ",
            self.dataset.bind(py).str()?,
            self.reported,
            self.yielded
        );
        if self.workers {
            msg.push_str(
                "For multiprocessing data-loading, this could be caused by not properly \
                 configuring the IterableDataset replica at each worker. Please see \
                 https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for \
                 examples.",
            );
        }
        PyErr::warn(
            py,
            &py.get_type::<PyUserWarning>(),
            &std::ffi::CString::new(msg)?,
            1,
        )
    }

    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.dataset)
    }
}

#[pymethods]
impl LengthWarning {
    #[new]
    fn py_new(dataset: Py<PyAny>, reported: usize, workers: bool) -> Self {
        LengthWarning {
            dataset,
            reported,
            yielded: 0,
            workers,
        }
    }

    /// Counts one batch handed out, and warns past the reported length.
    #[pyo3(name = "yielded")]
    fn py_yielded(&mut self, py: Python<'_>) -> PyResult<()> {
        self.yielded(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.traverse(&visit)
    }
}
