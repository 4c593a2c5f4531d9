//! Receiving answers: the main process waits on the doorbell without the GIL, takes every
//! whole answer out of the workers' rings, turns each into the scheduler's `Answer` (a batch
//! built over its slot, a worker's error, an iterable dataset's end), and notices a worker
//! that died owing answers.

use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use rloader_workers::slots::SlotLease;
use rloader_workers::wire::{self, kind, HEADER};
use rloader_workers::PoolError;

use super::PoolIter;
use crate::errors::to_py;
use crate::handout::Answer;
use crate::memory::{Lease, Message};
use crate::process::key_feed::TaskKeySource;
use crate::stats::Stage;
use crate::wait;

impl PoolIter {
    /// Blocks until at least one answer has been taken in, checking workers between slices.
    pub(super) fn wait_for_answer(
        &mut self,
        py: Python<'_>,
        started: Instant,
        until: Option<Instant>,
    ) -> PyResult<bool> {
        loop {
            // `timeout` counts from the later of the wait's start and the last worker's start
            // (torch starts them all before its clock runs: NOTE [Staged start])
            let started = self.started_one.map_or(started, |s| s.max(started));
            let timeout_at = self.timeout.and_then(|limit| started.checked_add(limit));
            let deadline = match (timeout_at, until) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let seen = self.doorbell.current();
            let mut got = false;
            for w in 0..self.from_workers.len() {
                got |= self.drain(py, w)?;
            }
            self.flush_unsent(py, true)?;
            if got || self.can_send_fed_keys() {
                return Ok(true);
            }
            if let Some(limit) = self.timeout {
                if started.elapsed() >= limit {
                    return Err(to_py(PoolError::TimedOut(limit)));
                }
            }
            if until.is_some_and(|until| Instant::now() >= until) {
                return Ok(false);
            }
            let mut slice_end = deadline;
            if self.unstarted > 0 {
                match self.start_now() {
                    None => {
                        self.start_next(py)?;
                        continue; // (and look for answers between two starts)
                    }
                    Some(grace_until) => {
                        slice_end = Some(slice_end.map_or(grace_until, |d| d.min(grace_until)));
                    }
                }
            }
            let bell = &self.doorbell;
            let rang = wait::slice(py, slice_end, |len| bell.wait(seen, len))?;
            if !rang && self.check_workers(py)? {
                return Ok(true);
            }
        }
    }

    /// Takes in every whole answer waiting from worker `w`; true if there was one.
    pub(super) fn drain(&mut self, py: Python<'_>, w: usize) -> PyResult<bool> {
        let mut got = false;
        while self.from_workers[w]
            .try_recv(&mut self.inbox[w])
            .map_err(to_py)?
        {
            let msg = std::mem::take(&mut self.inbox[w]);
            self.take_answer(py, w, msg)?;
            got = true;
        }
        Ok(got)
    }

    /// Raises (after stopping the pool) if a worker process has ended before its time; true
    /// if an ended worker's last answers were taken in.
    pub(super) fn check_workers(&mut self, py: Python<'_>) -> PyResult<bool> {
        let exited: Vec<(usize, i32)> = self.hooks.bind(py).call_method0("exited")?.extract()?;
        let mut got = false;
        for (w, code) in exited {
            // It can write nothing more: what it sent is all there will be.
            got |= self.drain(py, w)?;
            if self.told_to_stop && !self.scheduler.owes(w) {
                // It left as told with every answer in; an exit code other than 0 (a crash in
                // interpreter teardown, say) costs nothing, and torch would not notice it.
                continue;
            }
            let dead = self.hooks.bind(py).call_method1("death", (w, code))?;
            self.shutdown(py)?;
            return Err(PyErr::from_value(dead));
        }
        Ok(got)
    }

    pub(super) fn take_answer(
        &mut self,
        py: Python<'_>,
        worker: usize,
        msg: Vec<u8>,
    ) -> PyResult<()> {
        let wire::Header { kind: k, task, .. } = wire::parse_header(&msg).map_err(to_py)?;
        match k {
            kind::DATA => {
                let pool = self.pool_region.get();
                let table = wire::decode_batch_table(&msg).map_err(to_py)?;
                let in_slots = table.buffers.iter().filter(|b| b.0).count() as u64;
                self.buffers_in_slots += in_slots;
                self.buffers_inline += table.buffers.len() as u64 - in_slots;
                let lease = match table.slot {
                    None => None,
                    Some(slot) if slot < pool.layout.slots_per_worker() => {
                        let (slot_at, state_at) = pool.layout.slot(worker, slot);
                        let lease =
                            SlotLease::new(pool.shm.clone(), state_at, slot_at, table.in_slot)
                                .map_err(to_py)?;
                        let stats = self.hand_out.stats();
                        let pinned = self.pinned.as_ref().filter(|p| {
                            stats.time(Stage::Pin, || p.ensure(py, slot_at, table.in_slot))
                        });
                        Some(Py::new(py, Lease::new(lease, pinned.cloned()))?)
                    }
                    Some(slot) => return Err(to_py(PoolError::NoSuchSlot { worker, slot })),
                };
                let message = Py::new(py, Message::new(msg))?;
                let batch = self.hand_out.stats().time(Stage::Transport, || {
                    self.hooks
                        .bind(py)
                        .call_method1("loads", (message, lease, table.pickle, table.buffers))
                });
                let answer = match batch {
                    Ok(batch) if self.worker_states => match batch.extract() {
                        Ok((batch, state)) => Answer::Batch(batch, Some(state)),
                        Err(err) => Answer::Failed(err),
                    },
                    Ok(batch) => Answer::Batch(batch.unbind(), None),
                    Err(err) => Answer::Failed(err),
                };
                self.scheduler.on_result(task, answer);
            }
            kind::ERROR => {
                let wrapper = self
                    .hooks
                    .bind(py)
                    .call_method1("load_error", (PyBytes::new(py, &msg[HEADER..]),));
                let answer = match wrapper {
                    Ok(wrapper) => Answer::Error(wrapper.unbind()),
                    Err(err) => Answer::Failed(err),
                };
                self.scheduler.on_result(task, answer);
            }
            kind::ENDED => {
                // With `worker_states`: the dataset's state once its stream ended.
                if let Some(state) = self.worker_state(py, &msg)? {
                    self.hand_out.handouts(py).set_end_state(worker, state);
                }
                self.scheduler.on_worker_ended(worker, task);
                if matches!(self.keys, Some(TaskKeySource::Feed(_))) {
                    self.end_tokens += 1; // NOTE [Key feed]: this one is the PoolIter's
                }
            }
            kind::RESUMED => {
                // A persistent worker restarted its iterable dataset; with `worker_states` it
                // says the dataset's state at the start of the epoch.
                self.resumed += 1;
                if let Some(state) = self.worker_state(py, &msg)? {
                    self.hand_out.handouts(py).set_start_state(worker, state);
                }
            }
            other => {
                return Err(to_py(PoolError::UnexpectedKind {
                    kind: other,
                    from: Some(worker),
                }))
            }
        }
        Ok(())
    }

    /// The pickled dataset state a RESUMED or ENDED message carries, if any.
    pub(super) fn worker_state(&self, py: Python<'_>, msg: &[u8]) -> PyResult<Option<Py<PyAny>>> {
        if msg.len() <= HEADER {
            return Ok(None);
        }
        let body = PyBytes::new(py, &msg[HEADER..]);
        Ok(Some(
            self.hooks
                .bind(py)
                .call_method1("load_state", (body,))?
                .unbind(),
        ))
    }
}
