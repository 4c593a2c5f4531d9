//! `GilProbe`: rloader-workers' probe (how much of the main process's loading a second thread
//! could not take the GIL), whose thread takes the GIL and gives it back at once.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use rloader_workers::gil_probe;

#[pyclass(module = "rloader._rloader", frozen)]
pub struct GilProbe {
    probe: gil_probe::GilProbe,
    period: Duration,
}

#[pymethods]
impl GilProbe {
    /// Starts the probe's thread: while `loading(True)`, it takes the GIL, waits `period_s`,
    /// and takes it again.
    #[new]
    fn new(period_s: f64) -> PyResult<GilProbe> {
        let period = Duration::try_from_secs_f64(period_s).map_err(|_| {
            PyValueError::new_err(format!("period_s must be seconds >= 0, got {period_s}"))
        })?;
        let probe = gil_probe::GilProbe::start(period, || Python::attach(|_py| ()))?;
        Ok(GilProbe { probe, period })
    }

    /// The main process begins (True) or ends (False) loading a batch.
    fn loading(&self, loading: bool) {
        self.probe.set_loading(loading);
    }

    /// `(blocked_s, observed_s, loading_s)`: the probe's seconds blocked on the GIL while the
    /// main process loaded, the probe's own seconds then (blocked, and its periods between
    /// asks: `Share::blocked_share`), and the seconds it loaded.
    fn share(&self) -> (f64, f64, f64) {
        let share = self.probe.share();
        (
            share.blocked.as_secs_f64(),
            share.observed(self.period),
            share.loading.as_secs_f64(),
        )
    }

    /// Ends the probe's thread and waits for it, the GIL released (it may be waiting for it).
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.probe.stop());
    }
}
