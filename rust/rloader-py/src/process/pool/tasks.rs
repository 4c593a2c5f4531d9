//! Drawing tasks and sending them: the sampler's keys (or a `KeyFeed`'s) become numbered
//! tasks, each assigned to its worker by the scheduler, queued in that worker's `unsent` and
//! written into its task ring as room allows (NOTE [Unsent]).

use std::collections::VecDeque;
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use rloader_queue::{QueueError, Ring};
use rloader_workers::wire::{self, kind, HEADER};
use rloader_workers::PoolError;

use super::{PoolIter, SEND_TIMEOUT};
use crate::errors::to_py;
use crate::process::key_feed::{DrawnKeys, TaskKeySource};
use crate::sampling::KeyBatch;
use crate::wait;

impl PoolIter {
    /// Draws the tasks owed (the Scheduler keeps torch's account), or takes those a KeyFeed
    /// holds, and sends what can be sent without waiting on a busy worker.
    pub(super) fn send_tasks(&mut self, py: Python<'_>) -> PyResult<()> {
        self.draw_tasks(py)?;
        self.flush_unsent(py, true)
    }

    /// Draws the tasks owed (or takes the fed ones) and assigns each to its worker's `unsent`
    /// queue.
    pub(super) fn draw_tasks(&mut self, py: Python<'_>) -> PyResult<()> {
        let fed = matches!(self.keys, Some(TaskKeySource::Feed(_)));
        // Fed keys were drawn on the main thread, which keeps the account (NOTE [Key feed]).
        while if fed {
            self.scheduler.can_assign() || self.tokens_waiting()
        } else {
            self.scheduler.draws_owed() > 0
        } {
            if !fed {
                self.scheduler.spend_draw(); // even if the draw fails, as torch's _try_put_index
            }
            let payload: Option<(u32, Vec<u8>)> = match &self.keys {
                None => Some((kind::TASK_OBJECT, Vec::new())),
                Some(TaskKeySource::Feed(queue)) => match queue.take() {
                    None if self.end_tokens > 0 => {
                        self.end_tokens -= 1;
                        Some((kind::TASK_OBJECT, Vec::new()))
                    }
                    None => break, // the main thread has not drawn the next keys yet
                    Some(DrawnKeys::Next) => Some((kind::TASK_OBJECT, Vec::new())),
                    Some(DrawnKeys::End) => None,
                    Some(DrawnKeys::Indices(ix)) => {
                        Some((kind::TASK_INDICES, wire::index_bytes(&ix)))
                    }
                    Some(DrawnKeys::Object(bytes)) => Some((kind::TASK_OBJECT, bytes)),
                },
                Some(TaskKeySource::Sampler(keys)) => match keys.next(py, &mut self.index_buf)? {
                    None => None,
                    Some(KeyBatch::Indices(ix)) => {
                        let bytes = wire::index_bytes(&ix);
                        self.index_buf = ix;
                        Some((kind::TASK_INDICES, bytes))
                    }
                    Some(KeyBatch::Object(obj)) => {
                        let data = self.hooks.bind(py).call_method1("dump_keys", (obj,))?;
                        Some((
                            kind::TASK_OBJECT,
                            data.cast::<PyBytes>()?.as_bytes().to_vec(),
                        ))
                    }
                },
            };
            let Some((k, bytes)) = payload else {
                self.scheduler.mark_exhausted();
                break;
            };
            // No worker may take it (iterable datasets out of order): dropped, as torch drops it.
            // (Map-style keys always find a worker: see Scheduler::assign.)
            if let Some((worker, task)) = self.scheduler.assign() {
                self.unsent[worker].push_back((wire::header(k, worker, task), bytes));
            }
        }
        Ok(())
    }

    /// A token feed holds tokens (or the PoolIter owes one) that no worker may take now: torch
    /// drops such a task when it would put it; so do we, as it would be placed.
    pub(super) fn tokens_waiting(&self) -> bool {
        match &self.keys {
            Some(TaskKeySource::Feed(queue)) if queue.tokens => {
                self.end_tokens > 0 || queue.has_drawn()
            }
            _ => false,
        }
    }

    pub(super) fn nothing_unsent(&self) -> bool {
        self.unsent.iter().all(VecDeque::is_empty)
    }

    /// NOTE [Unsent]: tasks wait in their worker's `unsent` queue until its task ring has room
    /// for them, and the main thread never waits for that room: it goes back to taking in
    /// answers (a worker may itself be waiting for the main thread to take in a large answer)
    /// and tries again after each one and each wait slice. A healthy worker that spends long on
    /// one batch (or a spawned worker slow to start) is therefore never "stuck", a dead one is
    /// noticed by the usual liveness checks, and no assigned task is lost to a failed send. A
    /// task that fits in the ring goes all or nothing; one larger than the whole ring streams
    /// through it, as much at a time as there is room for (`Ring::send_partial` keeps its
    /// place), so a busy worker finds the first part when it is done while the rest waits
    /// here; to a worker that is reading it (owing nothing else), it goes on slice by slice,
    /// with the worker's liveness and Ctrl-C checked between slices (not before the workers are
    /// started: `_prefill` never waits). Once the sampler is
    /// exhausted and every task is in its ring, non-persistent workers are told to stop.
    pub(super) fn flush_unsent(&mut self, py: Python<'_>, workers_started: bool) -> PyResult<()> {
        for w in 0..self.unsent.len() {
            // Each task leaves `unsent` only once it is wholly in the ring.
            while let Some((head, body)) = self.unsent[w].front() {
                let ring = &self.to_workers[w];
                // A worker owing nothing but what waits here is reading its ring (or starting):
                // a streamed task goes on to it slice by slice, its liveness checked between.
                let streamed = Ring::frame_len(HEADER + body.len()) > ring.capacity();
                let reading = workers_started
                    && streamed
                    && self.scheduler.unanswered(w) == self.unsent[w].len()
                    && w < self.started_workers(py);
                // Otherwise one try, without waiting.
                let deadline = (!reading).then(Instant::now);
                let sent = wait::slice(py, deadline, |len| {
                    ring.send_partial(&[head, body], Some(len))
                })?;
                match sent {
                    Ok(true) => {
                        self.unsent[w].pop_front();
                    }
                    Ok(false) if reading => {
                        self.check_workers(py)?;
                    }
                    Ok(false) | Err(QueueError::Timeout) => break, // no more room for now
                    Err(e) => return Err(to_py(e)),
                }
            }
        }
        if self.nothing_unsent()
            && self.scheduler.is_exhausted()
            && !self.persistent
            && !self.told_to_stop
        {
            // Closing a task ring never waits (a STOP message might, behind large tasks): the
            // worker takes what is queued, then finds the ring closed and leaves.
            for ring in &self.to_workers {
                ring.close();
            }
            self.told_to_stop = true;
        }
        Ok(())
    }

    /// Sends a control message to `worker`, waiting up to `SEND_TIMEOUT` for room.
    pub(super) fn send(
        &self,
        py: Python<'_>,
        worker: usize,
        head: &[u8],
        body: &[u8],
    ) -> PyResult<()> {
        let ring = &self.to_workers[worker];
        let deadline = Instant::now().checked_add(SEND_TIMEOUT);
        let sent = wait::until(
            py,
            deadline,
            |len| wait::send_slice(ring, &[head, body], len),
            || Ok(None),
        )?;
        match sent {
            Some(sent) => sent.map_err(to_py),
            None => Err(to_py(PoolError::Stuck {
                worker,
                waited: SEND_TIMEOUT,
            })),
        }
    }

    /// Whether the main thread has drawn keys that could be sent now.
    pub(super) fn can_send_fed_keys(&self) -> bool {
        match &self.keys {
            Some(TaskKeySource::Feed(queue)) => {
                self.nothing_unsent()
                    && !self.scheduler.is_exhausted()
                    && self.scheduler.can_assign()
                    && queue.has_drawn()
            }
            _ => false,
        }
    }
}
