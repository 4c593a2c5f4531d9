//! The staged start of a pool's worker processes: worker 0 in `iter()`, the others from the
//! waits for answers (NOTE [Staged start]).

use std::time::Instant;

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

use super::PoolIter;

impl PoolIter {
    /// NOTE [Staged start]: starting a worker process costs the main process time that grows
    /// with its memory (fork copies its page tables: tens of milliseconds in a process with a
    /// CUDA context, more with memory pinned privately), and torch starts every worker in
    /// `iter()`, so its first batch waits for all of them. Here `iter()` starts worker 0, which
    /// finds its first tasks waiting (`_prefill`), and the others are started from the waits
    /// for answers, in order, one at a time, with the answers taken in between: a batch that
    /// is ready is handed out before the next start. A wait starts the next worker at once when
    /// the answer it waits for is owed by a worker not started yet (or no started worker owes
    /// any), and otherwise after letting the started ones answer for `grace` (what starting
    /// worker 0 took), once per pool; from then on back to back. So the first batch comes
    /// after one start instead of `num_workers`, and the pool is fully started at most one
    /// start's time later than torch's would be. The epoch's end starts any left (every
    /// worker runs, if only its `worker_init_fn`); stopping the pool starts none. `timeout` does
    /// not count a start (torch's clock runs once all are started). Tasks are
    /// assigned to workers not started yet as to the others (their rings hold them), so which
    /// worker makes which batch is torch's. With `pin_memory`, the pin thread waits here, and
    /// the main thread starts the workers instead (`PinnedBatches`), from its own waits:
    /// `_stage(starts=False)` then only tells this iterator which are started.
    ///
    /// None: start the next worker now; else wait no later than the instant returned.
    pub(super) fn start_now(&mut self) -> Option<Instant> {
        let started = self.to_workers.len() - self.unstarted;
        if !self.scheduler.answer_coming_from(started) {
            return None;
        }
        let until = *self
            .grace_until
            .get_or_insert_with(|| Instant::now() + self.grace);
        (Instant::now() < until).then_some(until)
    }

    /// Starts the next worker (the starter's `start_next`); a failure stops the pool, but for
    /// Ctrl-C, after which the iterator goes on as after Ctrl-C in any wait.
    pub(super) fn start_next(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(starter) = self.starter.as_ref().map(|s| s.clone_ref(py)) else {
            self.unstarted = 0;
            return Ok(());
        };
        let started = starter.bind(py).call_method0("start_next");
        self.started_one = Some(Instant::now());
        // (a start that raised may have started its worker: the starter knows)
        let pending = starter.bind(py).getattr("pending").and_then(|p| p.len());
        self.unstarted = pending.unwrap_or(0).min(self.to_workers.len());
        match started {
            Ok(_) => Ok(()),
            Err(err) if err.is_instance_of::<PyKeyboardInterrupt>(py) => Err(err),
            Err(err) => {
                self.shutdown(py)?;
                Err(err)
            }
        }
    }

    /// How many workers (the first ones) are started: NOTE [Staged start].
    pub(super) fn started_workers(&self, py: Python<'_>) -> usize {
        let n = self.to_workers.len();
        match &self.starter {
            _ if self.unstarted > 0 => n - self.unstarted,
            // (`pin_memory`: the main thread starts them; asked only for tasks streamed to a
            // worker, which are rare)
            Some(starter) => {
                let pending = starter.bind(py).getattr("pending").and_then(|p| p.len());
                n.saturating_sub(pending.unwrap_or(0))
            }
            None => n,
        }
    }
}
