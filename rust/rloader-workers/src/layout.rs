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
use crate::PoolError;

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

/// `x` rounded up to a multiple of `to`; None past `usize::MAX`.
fn align_up(x: usize, to: usize) -> Option<usize> {
    x.div_ceil(to).checked_mul(to)
}

impl Layout {
    /// The layout of a pool of `num_workers` (at least one) with `prefetch_factor` tasks in
    /// flight per worker.
    ///
    /// # Panics
    /// Where [`Layout::try_new`] fails.
    pub fn new(num_workers: usize, prefetch_factor: usize) -> Layout {
        Layout::try_new(num_workers, prefetch_factor).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The layout of a pool of `num_workers` with `prefetch_factor` tasks in flight per worker,
    /// or why there is none: no worker, or a region past `isize::MAX` bytes (which no process
    /// can map, and whose offsets would overflow). Every offset of the layout is then computed
    /// without overflow: each piece ends at or before `len`.
    pub fn try_new(num_workers: usize, prefetch_factor: usize) -> Result<Layout, PoolError> {
        if num_workers == 0 {
            return Err(PoolError::NoWorkers);
        }
        let too_large = || PoolError::TooManySlots {
            num_workers,
            prefetch_factor,
        };
        let slots_per_worker = slots::slots_per_worker(prefetch_factor).ok_or_else(too_large)?;
        let states_at = STATES_AT;
        // Each worker's rings, each ring ALIGN-aligned.
        let ring_spans = [INDEX_RING, RESULT_RING].map(Ring::required_len);
        let per_worker = align_up(ring_spans[0], Ring::ALIGN)
            .zip(align_up(ring_spans[1], Ring::ALIGN))
            .and_then(|(a, b)| a.checked_add(b));
        let slots = num_workers.checked_mul(slots_per_worker);
        let (times_at, rings_at, committed, slots_at, len) = slots
            .and_then(|slots| {
                let times_at = align_up(
                    states_at.checked_add(SLOT_META_BYTES.checked_mul(slots)?)?,
                    Ring::ALIGN,
                )?;
                let rings_at = align_up(
                    times_at.checked_add(times::BYTES.checked_mul(num_workers)?)?,
                    Ring::ALIGN,
                )?;
                let committed = rings_at.checked_add(per_worker?.checked_mul(num_workers)?)?;
                let slots_at = align_up(committed, SLOTS_ALIGN)?;
                let len = slots_at.checked_add(slots.checked_mul(SLOT_SPAN)?)?;
                Some((times_at, rings_at, committed, slots_at, len))
            })
            .filter(|&(.., len)| len <= isize::MAX as usize)
            .ok_or_else(too_large)?;
        let mut at = rings_at;
        let rings = (0..num_workers)
            .map(|_| {
                ring_spans.map(|span| {
                    let piece = (at, span);
                    at += span.div_ceil(Ring::ALIGN) * Ring::ALIGN;
                    piece
                })
            })
            .collect();
        debug_assert_eq!(at, committed);
        Ok(Layout {
            len,
            committed,
            rings,
            slots_per_worker,
            states_at,
            times_at,
            slots_at,
        })
    }

    /// The offset of worker `w`'s fetch and collate times (`times.rs`).
    ///
    /// # Panics
    /// If the pool has no worker `w`.
    pub fn times(&self, w: usize) -> usize {
        assert!(w < self.num_workers(), "no worker {w}");
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
    ///
    /// # Panics
    /// If the pool has no worker `w` or its workers no slot `s` (past the layout's pieces, the
    /// offsets could overflow).
    pub fn slot(&self, w: usize, s: usize) -> (usize, usize) {
        assert!(
            w < self.num_workers() && s < self.slots_per_worker,
            "no slot {s} of worker {w}"
        );
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

    #[test]
    fn layouts_past_the_address_space_are_refused() {
        // Before: the slots' span overflowed (a panic in a debug build; in a release build, a
        // region length wrapped to a few MiB while slot offsets pointed past it).
        for (workers, prefetch) in [
            (1 << 20, 1 << 14),
            (1 << 34, 0),
            (usize::MAX, 2),
            (1, usize::MAX),
            (2, usize::MAX - 3),
            (1 << 40, 1 << 40),
        ] {
            assert!(
                matches!(
                    Layout::try_new(workers, prefetch),
                    Err(PoolError::TooManySlots { .. })
                ),
                "{workers} {prefetch}"
            );
        }
        assert!(matches!(Layout::try_new(0, 2), Err(PoolError::NoWorkers)));
        // Huge but addressable: 2^32 slots of 1 GiB (and 32 GiB of their metadata before them).
        let l = Layout::try_new(1, (1 << 32) - 3).unwrap();
        assert_eq!(l.slots_per_worker(), 1 << 32);
        assert!(l.len <= isize::MAX as usize);
        assert_eq!(l.slot(0, l.slots_per_worker() - 1).0 + SLOT_SPAN, l.len);
        // isize::MAX bytes hold fewer than 2^33 slots of 1 GiB.
        assert!(Layout::try_new(1, (1 << 33) - 3).is_err());
    }

    #[test]
    #[should_panic(expected = "num_workers=1 with prefetch_factor=18446744073709551615")]
    fn new_panics_where_try_new_fails() {
        Layout::new(1, usize::MAX);
    }

    #[test]
    #[should_panic(expected = "no slot 0 of worker 18446744073709551615")]
    fn a_slot_of_no_worker_panics_instead_of_overflowing() {
        // Before: `w * slots_per_worker` overflowed (a panic in a debug build, a wrapped offset
        // in a release build).
        Layout::new(2, 2).slot(usize::MAX, 0);
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
