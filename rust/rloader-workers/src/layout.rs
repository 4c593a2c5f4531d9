//! Where each piece of a pool lies in its shared-memory region.
//!
//! One region per pool (an anonymous memfd, `rloader_queue::ShmRegion`) holds, in order: the
//! doorbell every worker rings after each answer, the slots' metadata (state word and
//! high-water mark, NOTE [Slots] in slots.rs), each worker's fetch and collate times
//! (times.rs), per worker its task ring (main → worker) and
//! its answer ring (worker → main), then per worker its batch slots. Rings are reserved when
//! the region is made (`committed` bytes); slots only as they are used. The main process and
//! each worker compute the same `Layout` from `(num_workers, prefetch_factor)`, so only the
//! region's descriptor travels.

use std::sync::Arc;

use rloader_queue::{Ring, ShmRegion};

use crate::slots::{self, Arena, SLOT_META_BYTES, SLOT_SPAN};
use crate::times;

/// Ring capacities. A message larger than its ring streams through it in parts (the main
/// process reassembles it), so these bound memory, not batch size. Tensor bytes travel in
/// slots (NOTE [Slots] in slots.rs), and through the answer ring only when no slot is free.
pub const INDEX_RING: usize = 256 << 10;
pub const RESULT_RING: usize = 2 << 20;

/// The doorbell sits at offset 0; the slots' metadata after it.
pub const DOORBELL_AT: usize = 0;
const STATES_AT: usize = 64;
const _: () = assert!(DOORBELL_AT + rloader_queue::Doorbell::LEN <= STATES_AT);
/// Slots start at a multiple of this (huge-page friendly).
pub const SLOTS_ALIGN: usize = 2 << 20;

/// Where each piece lives in a pool's region (see the module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The region's length.
    pub len: usize,
    /// The bytes reserved when the region is made: everything before the slots.
    pub committed: usize,
    /// Per worker, (offset, length) of its task ring and of its answer ring.
    rings: Vec<[(usize, usize); 2]>,
    slots_per_worker: usize,
    states_at: usize,
    /// Per worker, its fetch and collate times (`times.rs`), a cache line each.
    times_at: usize,
    slots_at: usize,
}

fn align(x: usize) -> usize {
    x.div_ceil(Ring::ALIGN) * Ring::ALIGN
}

impl Layout {
    /// The layout of a pool of `num_workers` (at least one) with `prefetch_factor` tasks in
    /// flight per worker.
    pub fn new(num_workers: usize, prefetch_factor: usize) -> Layout {
        let slots_per_worker = slots::slots_per_worker(prefetch_factor);
        let states_at = STATES_AT;
        let times_at = align(states_at + SLOT_META_BYTES * num_workers * slots_per_worker);
        let mut at = align(times_at + times::BYTES * num_workers);
        let mut rings = Vec::with_capacity(num_workers);
        for _ in 0..num_workers {
            let spans = [INDEX_RING, RESULT_RING].map(|capacity| {
                let span = (at, Ring::required_len(capacity));
                at = align(at + span.1);
                span
            });
            rings.push(spans);
        }
        let committed = at;
        let slots_at = at.div_ceil(SLOTS_ALIGN) * SLOTS_ALIGN;
        Layout {
            len: slots_at + num_workers * slots_per_worker * SLOT_SPAN,
            committed,
            rings,
            slots_per_worker,
            states_at,
            times_at,
            slots_at,
        }
    }

    /// The offset of worker `w`'s fetch and collate times (`times.rs`).
    pub fn times(&self, w: usize) -> usize {
        self.times_at + w * times::BYTES
    }

    pub fn num_workers(&self) -> usize {
        self.rings.len()
    }

    pub fn slots_per_worker(&self) -> usize {
        self.slots_per_worker
    }

    /// (offset, length) of worker `w`'s task ring.
    pub fn task_ring(&self, w: usize) -> (usize, usize) {
        self.rings[w][0]
    }

    /// (offset, length) of worker `w`'s answer ring.
    pub fn answer_ring(&self, w: usize) -> (usize, usize) {
        self.rings[w][1]
    }

    /// (offset, length) of every ring, each worker's task ring then its answer ring.
    pub fn all_rings(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.rings.iter().flatten().copied()
    }

    /// The offsets of worker `w`'s slot `s` and of its state word.
    pub fn slot(&self, w: usize, s: usize) -> (usize, usize) {
        let i = w * self.slots_per_worker + s;
        (
            self.slots_at + i * SLOT_SPAN,
            self.states_at + SLOT_META_BYTES * i,
        )
    }

    /// Worker `w`'s slots, for the worker itself.
    pub fn arena(&self, region: Arc<ShmRegion>, w: usize) -> Arena {
        let (slots_at, states_at) = self.slot(w, 0);
        Arena::new(region, states_at, slots_at, self.slots_per_worker)
    }

    /// A region for this layout, its rings reserved (`what` names it in error messages).
    pub fn create_region(&self, what: &str) -> Result<ShmRegion, rloader_queue::QueueError> {
        ShmRegion::create_anonymous(what, self.len, self.committed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rloader_queue::Doorbell;

    /// Every piece of the layout as (what, start, end).
    fn pieces(l: &Layout) -> Vec<(String, usize, usize)> {
        let mut out = vec![("doorbell".to_string(), DOORBELL_AT, Doorbell::LEN)];
        for w in 0..l.num_workers() {
            for s in 0..l.slots_per_worker() {
                let (slot, state) = l.slot(w, s);
                out.push((format!("meta {w}/{s}"), state, state + SLOT_META_BYTES));
                if s == 0 {
                    let t = l.times(w);
                    out.push((format!("times {w}"), t, t + times::BYTES));
                }
                out.push((format!("slot {w}/{s}"), slot, slot + SLOT_SPAN));
            }
            let (t, tl) = l.task_ring(w);
            let (a, al) = l.answer_ring(w);
            out.push((format!("tasks {w}"), t, t + tl));
            out.push((format!("answers {w}"), a, a + al));
        }
        out
    }

    fn check(l: &Layout) {
        let mut p = pieces(l);
        p.sort_by_key(|&(_, start, _)| start);
        for pair in p.windows(2) {
            assert!(
                pair[0].2 <= pair[1].1,
                "{:?} overlaps {:?}",
                pair[0],
                pair[1]
            );
        }
        assert!(p.iter().all(|&(_, _, end)| end <= l.len), "fits in len");
        for w in 0..l.num_workers() {
            for (at, len) in [l.task_ring(w), l.answer_ring(w)] {
                assert_eq!(at % Ring::ALIGN, 0, "ring aligned");
                assert!(at + len <= l.committed, "rings are reserved up front");
            }
            for s in 0..l.slots_per_worker() {
                let (slot, state) = l.slot(w, s);
                assert_eq!(slot % SLOTS_ALIGN, 0, "slot aligned");
                assert!(slot >= l.committed, "slots are reserved as used");
                assert_eq!(state % 4, 0, "state words are u32-aligned");
                assert!(state + SLOT_META_BYTES <= l.task_ring(0).0);
            }
        }
        assert_eq!(l.all_rings().count(), 2 * l.num_workers());
    }

    #[test]
    fn one_worker_default_prefetch() {
        let l = Layout::new(1, 2);
        check(&l);
        assert_eq!(l.slots_per_worker(), 5);
        // One worker's rings take more than 2 MiB: the slots start at 4 MiB, and end the region.
        assert_eq!(l.slot(0, 0).0, 2 * SLOTS_ALIGN);
        assert_eq!(l.len, l.slot(0, 4).0 + SLOT_SPAN);
    }

    proptest! {
        #[test]
        fn pieces_never_overlap_and_fit(workers in 1usize..64, prefetch in 0usize..32) {
            check(&Layout::new(workers, prefetch));
        }
    }

    #[test]
    fn a_region_of_the_layout_holds_its_rings_and_doorbell() {
        let l = Layout::new(3, 2);
        let region = Arc::new(l.create_region("rloader layout test").unwrap());
        assert_eq!(region.len(), l.len);
        let bell = Doorbell::init(region.clone(), DOORBELL_AT);
        for w in 0..l.num_workers() {
            for (at, len) in [l.task_ring(w), l.answer_ring(w)] {
                Ring::init(region.clone(), at, len).unwrap();
                Ring::attach(region.clone(), at, len).unwrap();
            }
        }
        let peer = Doorbell::attach(region.clone(), DOORBELL_AT);
        bell.ring();
        assert_eq!(peer.current(), 1);
    }
}
