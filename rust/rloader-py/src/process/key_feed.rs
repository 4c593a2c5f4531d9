//! `KeyFeed`: batches of keys drawn on one thread for a `PoolIter` polled on another.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::{PyTraverseError, PyVisit};

use rloader_queue::Doorbell;
use rloader_workers::layout::DOORBELL_AT;

use super::region::PoolRegion;
use crate::sampling::{KeyBatch, SamplerKeys};

/// Where a pool's tasks get their keys.
pub enum TaskKeySource {
    /// Drawn from the sampler by whichever thread sends tasks.
    Sampler(SamplerKeys),
    /// Drawn by another thread beforehand, into a [`KeyFeed`] (NOTE [Key feed]).
    Feed(Arc<KeyQueue>),
}

impl TaskKeySource {
    pub fn new(keys: &Bound<'_, PyAny>, auto_collation: bool) -> PyResult<TaskKeySource> {
        Ok(match keys.cast::<KeyFeed>() {
            Ok(feed) => TaskKeySource::Feed(feed.borrow().queue.clone()),
            Err(_) => TaskKeySource::Sampler(SamplerKeys::new(keys, auto_collation)?),
        })
    }
}

/// One batch of keys a [`KeyFeed`] has drawn, ready to send, or the sampler's end.
pub enum DrawnKeys {
    /// "The next batch", for an iterable dataset's workers.
    Next,
    Indices(Vec<u64>),
    /// Keys that are not integers, pickled on the drawing thread.
    Object(Vec<u8>),
    End,
}

/// NOTE [Key feed]: when batches are pinned, a thread of its own (`rloader_pin_memory`) polls
/// the PoolIter for them, and so sends the tasks; but torch advances the sampler on the main
/// thread, which matters to samplers that draw from torch's global RNG while the training loop
/// does too. So the main thread draws each batch of keys into a KeyFeed, and the PoolIter, on
/// the pin thread, takes them from there. The main thread keeps torch's account
/// (`PinnedBatches` in _pinning/pin_thread.py): it draws `prefetch_factor * num_workers`
/// batches of keys in `iter()`, then one for each item it takes that answers a task (a batch or
/// a worker's error), and when it finds nothing in flight it ends the feed, as torch ends the
/// epoch there
/// (after a sampler error, say). So the pin thread never waits for keys that will not come:
/// while the main thread has keys in flight, either they are queued here or their tasks are
/// outstanding; once it has none, the feed has ended. An iterable dataset has no sampler, but
/// the same account: its feed holds "next batch" tokens, so its workers run as far ahead as
/// torch's (one more token, for the worker whose dataset ended, is the PoolIter's own, as torch
/// puts one more index on receiving the end). Keys are pickled as they are drawn, so
/// that a key that cannot be pickled fails the draw, on the main thread, and never becomes a
/// task nobody answers.
///
/// The queue ([`KeyQueue`]) is behind a mutex held only to push or pop, never across a Python
/// call, and holds no Python object: the pin thread, whose frame keeps its PoolIter alive,
/// reaches nothing of the user's through it (the KeyFeed, which holds the sampler, belongs to
/// the main thread's `PinnedBatches`, and the garbage collector sees through it). Each draw
/// rings the main process's doorbell, on which a pin thread waiting for answers sleeps, so
/// that it sends the new task at once. The PoolIter that takes keys from a feed has no
/// `timeout`: the main thread times its own wait for the pin thread, as torch does.
#[pyclass(module = "rloader._rloader")]
pub struct KeyFeed {
    /// The sampler's iterator; None for a feed of tokens, or once cleared by the garbage
    /// collector.
    keys: Option<SamplerKeys>,
    /// Pickles keys that are not integers.
    dump_keys: Option<Py<PyAny>>,
    queue: Arc<KeyQueue>,
    doorbell: Doorbell,
}

/// The keys a [`KeyFeed`] has drawn and a PoolIter has not taken yet.
#[derive(Default)]
pub struct KeyQueue {
    drawn: Mutex<VecDeque<DrawnKeys>>,
    ended: AtomicBool,
    /// Tokens for an iterable dataset, not keys.
    pub tokens: bool,
}

#[pymethods]
impl KeyFeed {
    #[new]
    fn new(
        region: &Bound<'_, PoolRegion>,
        keys: Option<&Bound<'_, PyAny>>,
        auto_collation: bool,
        dump_keys: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(KeyFeed {
            keys: keys
                .map(|k| SamplerKeys::new(k, auto_collation))
                .transpose()?,
            dump_keys: Some(dump_keys),
            queue: Arc::new(KeyQueue {
                tokens: keys.is_none(),
                ..Default::default()
            }),
            doorbell: Doorbell::attach(region.get().shm.clone(), DOORBELL_AT),
        })
    }

    /// Draws up to `n` batches of keys from the sampler, on the calling thread, and returns how
    /// many it drew; at the sampler's end, the feed ends (and draws nothing more).
    fn draw(&mut self, py: Python<'_>, n: usize) -> PyResult<usize> {
        let mut buf = Vec::new();
        let mut drawn = 0;
        let result = (|| {
            while drawn < n && !self.queue.ended.load(Relaxed) {
                let Some(keys) = &self.keys else {
                    if self.queue.tokens {
                        self.queue.push(DrawnKeys::Next);
                        drawn += 1;
                        continue;
                    }
                    self.end();
                    break;
                };
                match keys.next(py, &mut buf)? {
                    None => self.end(),
                    Some(KeyBatch::Indices(ix)) => self.queue.push(DrawnKeys::Indices(ix)),
                    Some(KeyBatch::Object(obj)) => {
                        let Some(dump_keys) = &self.dump_keys else {
                            self.end();
                            break;
                        };
                        let data = dump_keys.bind(py).call1((obj,))?;
                        let bytes = data.cast::<PyBytes>()?.as_bytes().to_vec();
                        self.queue.push(DrawnKeys::Object(bytes));
                    }
                }
                drawn += usize::from(!self.queue.ended.load(Relaxed));
            }
            Ok(drawn)
        })();
        self.doorbell.ring(); // the keys drawn before an error are sent all the same
        result
    }

    /// Ends the feed, if it has not ended: the PoolIter sends no task after the keys queued.
    fn end(&self) {
        if !self.queue.ended.swap(true, Relaxed) {
            self.queue.push(DrawnKeys::End);
            self.doorbell.ring();
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(keys) = &self.keys {
            keys.traverse(&visit)?;
        }
        visit.call(&self.dump_keys)
    }

    fn __clear__(&mut self) {
        self.keys = None;
        self.dump_keys = None;
        self.end(); // a cleared sampler draws nothing more (tokens included)
    }
}

impl KeyQueue {
    fn push(&self, item: DrawnKeys) {
        self.lock().push_back(item);
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<DrawnKeys>> {
        self.drawn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next drawn batch of keys; None if the main thread has not drawn it yet.
    pub fn take(&self) -> Option<DrawnKeys> {
        self.lock().pop_front()
    }

    pub fn has_drawn(&self) -> bool {
        !self.lock().is_empty()
    }
}
