//! Index streams drawn ahead on a thread of their own.
//!
//! NOTE [Prefetched indices]: an index stream whose draws cost as much as making Python ints of
//! them (the alias table's draws, memory-bound) is run on a thread of its own, a few chunks
//! ahead of its consumer, so that on a machine with two cores the draws overlap the ints. The
//! thread sends whole chunks through a channel holding at most `AHEAD` of them, in the
//! stream's order, so the indices are exactly the stream's. It starts at the first fill (the
//! seed is drawn before), stops when the stream ends or its consumer is dropped (its next send
//! fails), and is joined on drop, so no thread outlives the stream. If it cannot be started,
//! the stream is filled on the calling thread.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// A stream that fills chunks of indices: `fill` appends up to `max`, fewer only at its end.
pub trait ChunkSource: Send {
    fn fill(&mut self, out: &mut Vec<u64>, max: usize);
}

impl ChunkSource for crate::weighted::WeightedIndices {
    fn fill(&mut self, out: &mut Vec<u64>, max: usize) {
        self.next_chunk(out, max);
    }
}

/// Indices per chunk the thread sends.
const CHUNK: usize = 8192;
/// Chunks the thread may have ready ahead of its consumer.
const AHEAD: usize = 2;

/// `source`, drawn ahead on a thread of its own (see the module).
pub struct Prefetched<S: ChunkSource + 'static> {
    /// The stream while no thread runs it.
    source: Option<S>,
    chunks: Option<Mutex<Receiver<Vec<u64>>>>,
    thread: Option<JoinHandle<()>>,
    /// Whether the thread was tried for.
    started: bool,
    /// The chunk being handed out, and how far.
    current: Vec<u64>,
    at: usize,
}

impl<S: ChunkSource + 'static> Prefetched<S> {
    pub fn new(source: S) -> Self {
        Prefetched {
            source: Some(source),
            chunks: None,
            thread: None,
            started: false,
            current: Vec::new(),
            at: 0,
        }
    }

    /// Starts the thread; if it cannot be started, the stream stays here, filled in place.
    fn start(&mut self) {
        let Some(source) = self.source.take() else {
            return;
        };
        let slot = Arc::new(Mutex::new(Some(source)));
        let theirs = Arc::clone(&slot);
        let (tx, rx) = sync_channel::<Vec<u64>>(AHEAD);
        let body = move || {
            let taken = theirs.lock().unwrap_or_else(PoisonError::into_inner).take();
            let Some(mut source) = taken else { return };
            loop {
                let mut chunk = Vec::with_capacity(CHUNK);
                source.fill(&mut chunk, CHUNK);
                if chunk.is_empty() || tx.send(chunk).is_err() {
                    return;
                }
            }
        };
        match std::thread::Builder::new()
            .name("rloader-indices".into())
            .spawn(body)
        {
            Ok(handle) => {
                self.thread = Some(handle);
                self.chunks = Some(Mutex::new(rx));
            }
            // The closure (and its handle on the slot) is gone: the stream is ours again.
            Err(_) => self.source = slot.lock().unwrap_or_else(PoisonError::into_inner).take(),
        }
    }

    /// Appends up to `max` indices to `out`, fewer only at the end; waits for the thread when
    /// it has no chunk ready.
    pub fn fill(&mut self, out: &mut Vec<u64>, max: usize) {
        if !self.started {
            self.started = true; // once: if the thread is refused, the stream stays here
            self.start();
        }
        if let Some(source) = &mut self.source {
            return source.fill(out, max); // no thread: filled here
        }
        let mut added = 0;
        while added < max {
            if self.at == self.current.len() {
                let next = self.chunks.as_ref().and_then(|rx| {
                    rx.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .recv()
                        .ok()
                });
                match next {
                    Some(chunk) => {
                        self.current = chunk;
                        self.at = 0;
                    }
                    None => return, // the stream's end
                }
            }
            let take = (max - added).min(self.current.len() - self.at);
            out.extend_from_slice(&self.current[self.at..self.at + take]);
            self.at += take;
            added += take;
        }
    }
}

impl<S: ChunkSource + 'static> Drop for Prefetched<S> {
    fn drop(&mut self) {
        self.chunks = None; // the thread's next send fails, and it returns
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weighted::{AliasTable, WeightedIndices};

    fn stream(n: u64) -> WeightedIndices {
        let weights: Vec<f64> = (1..=1000).map(|i| i as f64).collect();
        WeightedIndices::new(Arc::new(AliasTable::new(&weights).unwrap()), n, 7)
    }

    fn drain(mut fill: impl FnMut(&mut Vec<u64>, usize), max: usize) -> Vec<u64> {
        let mut all = Vec::new();
        loop {
            let before = all.len();
            fill(&mut all, max);
            if all.len() == before {
                return all;
            }
        }
    }

    #[test]
    fn the_same_indices_as_the_stream_in_any_chunking() {
        let mut plain = stream(100_003);
        let direct = drain(|out, max| plain.fill(out, max), 100_003);
        assert_eq!(direct.len(), 100_003);
        for max in [1, 999, 8192, 100_000] {
            let mut ahead = Prefetched::new(stream(100_003));
            assert_eq!(drain(|out, m| ahead.fill(out, m), max), direct, "max={max}");
        }
    }

    fn indices_threads() -> usize {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "rloader-indices")
            .count()
    }

    #[test]
    fn dropping_it_half_read_stops_its_thread() {
        let mut ahead = Prefetched::new(stream(10_000_000));
        let mut out = Vec::new();
        ahead.fill(&mut out, 10);
        assert_eq!(out.len(), 10);
        assert!(ahead.thread.is_some());
        drop(ahead); // joins: the thread is gone once this returns
                     // Other tests may run their own; none of this one's is left (it was joined).
        assert!(indices_threads() <= 1);
    }
}
