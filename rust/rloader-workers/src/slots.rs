//! Batches in reused shared memory: "slots", and who owns their bytes when.
//!
//! NOTE [Slots]: each worker owns `slots_per_worker` slots in its pool's region (see `Layout` in
//! layout.rs). A slot is `SLOT_SPAN` bytes of address space, mapped once by every process; the
//! region is sparse, and only what a slot has used so far is reserved (the worker commits as
//! the slot grows, and running out of memory is an error that says what to change, never a
//! SIGBUS). A worker collates a batch's tensors straight into a free slot (the default collate
//! asks the binding crate's `slot_empty` for its output), and copies there any other tensor
//! bytes of the batch that fit; its DATA message (NOTE [Pool protocol] in wire.rs) then names
//! the slot and the offsets instead of carrying the bytes. The main process builds the batch's
//! tensors over its own mapping of the slot, through one [`SlotLease`] per batch (the binding
//! crate's `Lease`), which each tensor keeps alive (torch.frombuffer holds the buffer's owner).
//!
//! A slot's state word, in the region, says who owns its bytes:
//! - FREE: the worker's. It picks a FREE slot that no tensor of its own still views (a
//!   [`ViewCount`] per slot, for a worker that keeps a collated batch).
//! - HELD: the main process's. The worker stores HELD before it sends the message naming the
//!   slot (the ring's release/acquire carries both the bytes and the store).
//! - LEASED: the main process's, which received the message: its lease stores LEASED, and
//!   FREE with Release when the last tensor over it is gone. The worker loads the state with
//!   Acquire, so its next writes come after the main process's last reads.
//!
//! Beside the state, each slot keeps in the region the high-water mark of the bytes its workers
//! have used for batches (in pages; a hint that only the slot's own worker stores, so Relaxed).
//! A worker of a later pool, whose fresh mapping has no page tables for the slot, populates the
//! part below the mark as it commits it: written pages map cheaply in bulk, while pages never
//! written would be zeroed one fault at a time either way (`ShmRegion::populate`).
//!
//! When a region serves a new pool (the old workers are gone), HELD slots, whose messages were
//! never received, become FREE; LEASED ones stay with the user's batches ([`reset_unleased`]).
//!
//! A worker that finds no FREE slot (the user is holding batches: `list(loader)`) sends the bytes
//! inline through its ring, and the main process copies them out: correct, one copy slower.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use rloader_queue::{QueueError, ShmRegion};

use crate::PoolError;

/// Address space per slot. A batch whose tensors need more travels inline.
pub const SLOT_SPAN: usize = 1 << 30;
/// Slots commit memory in steps of this much.
const COMMIT_STEP: usize = 2 << 20;
/// Every allocation in a slot starts at a multiple of this.
pub const ALIGN: usize = 64;

pub const FREE: u32 = 0;
/// Sent to the main process (which may not have received it yet).
pub const HELD: u32 = 1;
/// Held by a lease of the main process.
pub const LEASED: u32 = 2;

/// Bytes of slot metadata in the region, per slot: the state word, then the slot's high-water
/// mark (NOTE [Slots]).
pub const SLOT_META_BYTES: usize = 8;
/// The high-water mark counts pages of this size.
const HIGH_WATER_PAGE: usize = 4096;

/// Slots per worker: enough for the tasks in flight to one worker (`prefetch_factor`), the
/// batch the user is holding and the one before it (alive while `next()` runs), and one spare.
/// None past `usize::MAX`.
pub fn slots_per_worker(prefetch_factor: usize) -> Option<usize> {
    prefetch_factor.max(1).checked_add(3)
}

/// The state word of one slot.
///
/// # Safety
/// `at` is the offset of a 4-aligned u32 inside `region`, used only atomically.
unsafe fn state_word(region: &ShmRegion, at: usize) -> &AtomicU32 {
    debug_assert!(at + 4 <= region.len() && at & 3 == 0);
    // SAFETY: per the caller's promise.
    unsafe { &*(region.as_ptr().add(at) as *const AtomicU32) }
}

/// For a region about to serve a new pool, whose previous workers are gone: the slot at
/// `state_at` is free unless a lease holds it (one its old worker sent but the main process
/// never received is free again).
///
/// # Panics
/// If `state_at` is not a state word's place inside the region (a u32-aligned offset from
/// `Layout::slot`).
pub fn reset_unleased(region: &ShmRegion, state_at: usize) {
    assert!(
        state_at % 4 == 0
            && state_at
                .checked_add(4)
                .is_some_and(|end| end <= region.len()),
        "a state word's offset"
    );
    // SAFETY: an aligned u32 inside the region (checked above), used only atomically.
    let state = unsafe { state_word(region, state_at) };
    if state.load(Ordering::Acquire) != LEASED {
        state.store(FREE, Ordering::Release);
    }
}

/// The tensors a worker still holds over one of its slots: while any lives, the worker does
/// not pick the slot for a new batch. Made by [`Arena::view`]; dropping it counts one less.
#[derive(Debug)]
pub struct ViewCount(Arc<AtomicUsize>);

impl Drop for ViewCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A worker's slots (worker side): which one the batch being made goes to, and how much of
/// it is used.
pub struct Arena {
    region: Arc<ShmRegion>,
    /// Offset of this worker's first state word, and of its first slot.
    states_at: usize,
    slots_at: usize,
    /// Bytes of each slot reserved so far.
    committed: Vec<usize>,
    /// Views alive per slot: tensors this worker still holds over it.
    live: Vec<Arc<AtomicUsize>>,
    /// The slot the batch being made goes to, and how much of it is used.
    current: Option<usize>,
    used: usize,
    /// Set when memory ran out: no more slots grow, and batches travel inline.
    no_space: bool,
    warning: Option<String>,
    /// Test hook: reservations past this many bytes (this worker's slots together) fail as on
    /// a machine out of memory, from `RLOADER_TEST_SLOT_RESERVE_LIMIT`, which every worker
    /// reads from the environment it inherits (tests/test_slots.py).
    reserve_limit: Option<usize>,
}

/// The environment variable of `Arena::reserve_limit`: the out-of-memory path can be tested
/// without exhausting the machine's memory.
const RESERVE_LIMIT_VAR: &str = "RLOADER_TEST_SLOT_RESERVE_LIMIT";

impl Arena {
    /// The `slots` slots whose state words start at `states_at` and whose spans start at
    /// `slots_at` (from `Layout::arena`).
    ///
    /// # Panics
    /// If those do not lie inside the region, aligned (state words to 4, slots to 64).
    pub fn new(region: Arc<ShmRegion>, states_at: usize, slots_at: usize, slots: usize) -> Self {
        let fits = |at: usize, each: usize| {
            each.checked_mul(slots)
                .and_then(|n| at.checked_add(n))
                .is_some_and(|end| end <= region.len())
        };
        assert!(
            states_at % 4 == 0
                && fits(states_at, SLOT_META_BYTES)
                && slots_at % ALIGN == 0
                && fits(slots_at, SLOT_SPAN),
            "slots outside the region"
        );
        Arena {
            region,
            states_at,
            slots_at,
            committed: vec![0; slots],
            live: (0..slots).map(|_| Arc::new(AtomicUsize::new(0))).collect(),
            current: None,
            used: 0,
            no_space: false,
            warning: None,
            reserve_limit: std::env::var(RESERVE_LIMIT_VAR)
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    /// # Panics
    /// If the worker has no slot `slot`.
    fn state(&self, slot: usize) -> &AtomicU32 {
        assert!(slot < self.committed.len(), "no slot {slot}");
        // SAFETY: `new` checked that `slots` SLOT_META_BYTES-byte entries at `states_at` lie
        // inside the region, 4-aligned, and `slot` is one of them.
        unsafe { state_word(&self.region, self.states_at + SLOT_META_BYTES * slot) }
    }

    fn high_water(&self, slot: usize) -> &AtomicU32 {
        assert!(slot < self.committed.len(), "no slot {slot}");
        // SAFETY: as for `state`: the word after each state word is the slot's high-water mark.
        unsafe { state_word(&self.region, self.states_at + SLOT_META_BYTES * slot + 4) }
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        assert!(slot < self.committed.len(), "no slot {slot}");
        // SAFETY: `new` checked that `slots` spans of SLOT_SPAN bytes at `slots_at` lie inside
        // the region, and `slot` is one of them.
        unsafe { self.region.as_ptr().add(self.slots_at + slot * SLOT_SPAN) }
    }

    /// Starts a batch: picks a free slot, if there is one.
    pub fn begin(&mut self) {
        self.used = 0;
        self.current = (0..self.committed.len()).find(|&s| {
            self.state(s).load(Ordering::Acquire) == FREE
                && self.live[s].load(Ordering::Acquire) == 0
        });
    }

    /// Whether the batch being made has a slot (`begin` found a free one).
    pub fn has_slot(&self) -> bool {
        self.current.is_some()
    }

    /// `n` bytes in the current slot (64-aligned): its offset in the slot and address, or None
    /// when there is no slot or no room. When memory is short, batches travel inline from then
    /// on (through the rings, reserved when the loader started), and `take_warning` says so.
    pub fn alloc(&mut self, n: usize) -> Option<(usize, *mut u8)> {
        let slot = self.current?;
        let start = self.used.div_ceil(ALIGN) * ALIGN;
        let end = start.checked_add(n)?;
        if n == 0 || end > SLOT_SPAN {
            return None;
        }
        let have = self.committed[slot];
        if end > have {
            if self.no_space {
                return None;
            }
            let want = end
                .div_ceil(COMMIT_STEP)
                .saturating_mul(COMMIT_STEP)
                .min(SLOT_SPAN);
            let at = self.slots_at + slot * SLOT_SPAN + have;
            let reserved = self.committed.iter().sum::<usize>() + (want - have);
            let commit = match self.reserve_limit {
                Some(limit) if reserved > limit => Err(QueueError::NoMemory {
                    what: format!("a batch slot ({RESERVE_LIMIT_VAR}={limit})"),
                    requested: want - have,
                }),
                _ => self.region.commit(at, want - have),
            };
            if let Err(e) = commit {
                self.no_space = true;
                self.warning = Some(format!(
                    "DataLoader worker: {e}. Batches now travel through the worker's queue \
                     instead, one copy slower."
                ));
                return None;
            }
            let written = (self.high_water(slot).load(Ordering::Relaxed) as usize)
                .saturating_mul(HIGH_WATER_PAGE);
            if written > have {
                self.region.populate(at, written.min(want) - have);
            }
            self.committed[slot] = want;
        }
        self.used = end;
        // SAFETY: `end <= SLOT_SPAN`, so the range is inside this slot.
        Some((start, unsafe { self.slot_ptr(slot).add(start) }))
    }

    /// The warning of a failed reservation, once.
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// Where `len` bytes at `ptr` lie in the current slot, if they were allocated there.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let slot = self.current?;
        let base = self.slot_ptr(slot) as usize;
        let at = (ptr as usize).checked_sub(base)?;
        (at.checked_add(len)? <= self.used).then_some(at)
    }

    /// Ends the batch. With `sent_in_slot`, the message about to be sent names the current slot:
    /// it becomes the main process's (HELD) and its number is returned.
    pub fn finish(&mut self, sent_in_slot: bool) -> Option<usize> {
        let slot = self.current.take()?;
        // One writer (this worker), so a load and a store, not a locked read-modify-write.
        let pages = u32::try_from(self.used.div_ceil(HIGH_WATER_PAGE)).unwrap_or(u32::MAX);
        let high_water = self.high_water(slot);
        if pages > high_water.load(Ordering::Relaxed) {
            high_water.store(pages, Ordering::Relaxed);
        }
        if !sent_in_slot {
            return None;
        }
        // Relaxed: the ring's send publishes it with the message (NOTE [Slots]).
        self.state(slot).store(HELD, Ordering::Relaxed);
        Some(slot)
    }

    /// Takes back a slot `finish` handed to the main process when the message naming it could
    /// not be sent: the main process never learns of it, so the worker still owns its bytes.
    ///
    /// # Panics
    /// If the worker has no slot `slot`.
    pub fn unhold(&mut self, slot: usize) {
        self.state(slot).store(FREE, Ordering::Relaxed);
    }

    /// Counts one more view (a tensor this worker keeps) over the current slot, until the
    /// returned count is dropped.
    ///
    /// # Panics
    /// Without a current slot (call it only on what `alloc` returned).
    pub fn view(&self) -> ViewCount {
        let slot = self.current.expect("views are made of the current slot");
        self.live[slot].fetch_add(1, Ordering::AcqRel);
        ViewCount(self.live[slot].clone())
    }

    /// The region the slots lie in.
    pub fn region(&self) -> &Arc<ShmRegion> {
        &self.region
    }
}

/// The main process's hold on one worker slot: the bytes of one batch's tensors. The slot goes
/// back to its worker (FREE) when the lease is dropped (NOTE [Slots]), by the process that took
/// it: a process forked while the lease lived has a copy of it (and of the batch over it), and
/// that copy's drop leaves the slot alone, or the worker would write the next batch into memory
/// the main process's batch still shows.
#[derive(Debug)]
pub struct SlotLease {
    region: Arc<ShmRegion>,
    state_at: usize,
    addr: usize,
    len: usize,
    owner: u32,
}

impl SlotLease {
    /// The lease on `len` bytes of the slot at `slot_at`, whose state word is at `state_at`
    /// (offsets from `Layout::slot`, for a slot a received DATA message named).
    pub fn new(
        region: Arc<ShmRegion>,
        state_at: usize,
        slot_at: usize,
        len: usize,
    ) -> Result<Self, PoolError> {
        let fits = |at: usize, n: usize| at.checked_add(n).is_some_and(|end| end <= region.len());
        if len > SLOT_SPAN || !fits(slot_at, SLOT_SPAN) || !fits(state_at, 4) || state_at % 4 != 0 {
            return Err(PoolError::SlotOutsideRegion);
        }
        // SAFETY: checked to lie inside the region just above.
        let addr = unsafe { region.as_ptr().add(slot_at) } as usize;
        // SAFETY: `state_at` is an aligned u32 inside the region (checked above), a state word.
        unsafe { state_word(&region, state_at) }.store(LEASED, Ordering::Relaxed);
        Ok(SlotLease {
            region,
            state_at,
            addr,
            len,
            owner: std::process::id(),
        })
    }

    /// The address of the leased bytes in this process (mapped while the lease lives).
    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if std::process::id() != self.owner {
            return; // a forked child's copy (see SlotLease)
        }
        // SAFETY: `state_at` is a slot's state word (checked in `new`).
        unsafe { state_word(&self.region, self.state_at) }.store(FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layout;

    const WORKERS: usize = 2;
    const PREFETCH: usize = 1;

    /// A pool's region and layout, as the main process makes them.
    fn region() -> (Layout, Arc<ShmRegion>) {
        let l = Layout::new(WORKERS, PREFETCH);
        let r = Arc::new(l.create_region("rloader slots test").unwrap());
        (l, r)
    }

    fn state(r: &ShmRegion, at: usize) -> u32 {
        // SAFETY: a state word's offset from the layout.
        unsafe { state_word(r, at) }.load(Ordering::Acquire)
    }

    /// The slot the arena's current batch uses (from where `alloc` put bytes).
    fn current(a: &mut Arena, l: &Layout, w: usize) -> usize {
        let (_, ptr) = a.alloc(1).unwrap();
        let base = a.region().as_ptr() as usize;
        (0..l.slots_per_worker())
            .find(|&s| {
                let at = base + l.slot(w, s).0;
                (at..at + SLOT_SPAN).contains(&(ptr as usize))
            })
            .unwrap()
    }

    #[test]
    fn a_batch_goes_to_a_free_slot_and_is_held_once_sent() {
        let (l, r) = region();
        let mut a = l.arena(r.clone(), 1);
        a.begin();
        assert!(a.has_slot());
        let (at, ptr) = a.alloc(100).unwrap();
        assert_eq!(at, 0);
        let (at2, ptr2) = a.alloc(10).unwrap();
        assert_eq!(at2, 128, "64-aligned after the first");
        // SAFETY: 10 bytes alloc gave this batch.
        unsafe { std::ptr::write_bytes(ptr2, 7, 10) };
        assert_eq!(a.offset_of(ptr, 100), Some(0));
        assert_eq!(a.offset_of(ptr2, 10), Some(128));
        assert_eq!(a.offset_of(ptr2, 11), None, "past what was allocated");
        assert_eq!(a.offset_of(std::ptr::null(), 1), None);
        let local = [0u8; 4];
        assert_eq!(a.offset_of(local.as_ptr(), 4), None);
        let slot = a.finish(true).unwrap();
        assert_eq!(slot, 0);
        assert_eq!(state(&r, l.slot(1, slot).1), HELD);
        assert!(!a.has_slot());
        // Worker 0's slots are not worker 1's.
        assert_eq!(state(&r, l.slot(0, 0).1), FREE);
    }

    #[test]
    fn a_held_slot_is_skipped_until_its_lease_is_dropped() {
        let (l, r) = region();
        let mut a = l.arena(r.clone(), 0);
        a.begin();
        a.alloc(64).unwrap();
        let first = a.finish(true).unwrap();
        a.begin();
        let second = current(&mut a, &l, 0);
        assert_ne!(first, second, "a HELD slot is the main process's");
        a.finish(false);
        // The main process receives the message: its lease holds the slot.
        let (slot_at, state_at) = l.slot(0, first);
        let lease = SlotLease::new(r.clone(), state_at, slot_at, 64).unwrap();
        assert_eq!(state(&r, state_at), LEASED);
        assert_eq!(lease.len(), 64);
        assert_eq!(lease.addr(), r.as_ptr() as usize + slot_at);
        a.begin();
        assert_ne!(current(&mut a, &l, 0), first);
        a.finish(false);
        drop(lease);
        assert_eq!(state(&r, state_at), FREE);
        a.begin();
        assert_eq!(current(&mut a, &l, 0), first, "free again");
    }

    #[test]
    fn no_free_slot_means_inline() {
        let (l, r) = region();
        let mut a = l.arena(r.clone(), 0);
        for _ in 0..l.slots_per_worker() {
            a.begin();
            a.alloc(8).unwrap();
            a.finish(true).unwrap();
        }
        a.begin();
        assert!(!a.has_slot());
        assert!(a.alloc(8).is_none());
        assert_eq!(a.finish(true), None);
    }

    #[test]
    fn unhold_gives_an_unsent_slot_back() {
        let (l, r) = region();
        let mut a = l.arena(r.clone(), 0);
        a.begin();
        a.alloc(8).unwrap();
        let slot = a.finish(true).unwrap();
        a.unhold(slot);
        assert_eq!(state(&r, l.slot(0, slot).1), FREE);
        a.begin();
        assert_eq!(current(&mut a, &l, 0), slot);
    }

    #[test]
    fn a_viewed_slot_is_not_reused() {
        let (l, r) = region();
        let mut a = l.arena(r, 0);
        a.begin();
        let first = current(&mut a, &l, 0);
        let view = a.view();
        a.finish(false); // kept by the worker, not sent
        a.begin();
        assert_ne!(current(&mut a, &l, 0), first);
        a.finish(false);
        drop(view);
        a.begin();
        assert_eq!(current(&mut a, &l, 0), first);
    }

    #[test]
    fn allocations_stay_inside_the_slot() {
        let (l, r) = region();
        let mut a = l.arena(r, 0);
        assert!(a.alloc(8).is_none(), "no batch begun");
        a.begin();
        assert!(a.alloc(0).is_none());
        assert!(a.alloc(SLOT_SPAN + 1).is_none());
        assert!(a.alloc(usize::MAX).is_none());
        let (at, _) = a.alloc(SLOT_SPAN - 64).unwrap();
        assert_eq!(at, 0);
        assert!(a.alloc(65).is_none(), "past the span");
        let (at, _) = a.alloc(64).unwrap();
        assert_eq!(at, SLOT_SPAN - 64);
    }

    #[test]
    fn running_out_of_memory_sends_batches_inline_and_warns_once() {
        let (l, r) = region();
        let mut a = l.arena(r, 0);
        a.reserve_limit = Some(COMMIT_STEP);
        a.begin();
        a.alloc(COMMIT_STEP).unwrap();
        assert!(a.take_warning().is_none());
        assert!(a.alloc(1).is_none(), "past the limit");
        let warning = a.take_warning().unwrap();
        assert!(
            warning.starts_with("DataLoader worker: could not reserve 2097152 bytes"),
            "{warning}"
        );
        assert!(
            warning.contains("RLOADER_TEST_SLOT_RESERVE_LIMIT"),
            "{warning}"
        );
        assert!(a.take_warning().is_none(), "once");
        a.finish(false);
        a.begin();
        assert!(a.alloc(1).is_some(), "what is committed is still used");
        assert!(a.alloc(COMMIT_STEP).is_none(), "nothing more is committed");
        assert!(a.take_warning().is_none());
    }

    #[test]
    fn the_high_water_mark_outlives_the_worker() {
        let (l, r) = region();
        let mut a = l.arena(r.clone(), 0);
        a.begin();
        a.alloc(3 * HIGH_WATER_PAGE + 1).unwrap();
        a.finish(false);
        drop(a);
        let b = l.arena(r, 0);
        assert_eq!(b.high_water(0).load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_forked_copy_of_a_lease_leaves_the_slot_leased() {
        let (l, r) = region();
        let (slot_at, state_at) = l.slot(1, 0);
        let lease = SlotLease::new(r.clone(), state_at, slot_at, 64).unwrap();
        // What a process forked from this one holds: the same lease, taken by another pid.
        let mut copy = SlotLease::new(r.clone(), state_at, slot_at, 64).unwrap();
        copy.owner = lease.owner.wrapping_add(1);
        drop(copy);
        assert_eq!(
            state(&r, state_at),
            LEASED,
            "the taker's batch still shows the slot"
        );
        drop(lease);
        assert_eq!(state(&r, state_at), FREE);
    }

    #[test]
    fn a_new_pool_frees_held_slots_but_not_leased_ones() {
        let (l, r) = region();
        let mut a = l.arena(r.clone(), 0);
        let mut sent = Vec::new();
        for _ in 0..2 {
            a.begin();
            a.alloc(8).unwrap();
            sent.push(a.finish(true).unwrap());
        }
        let (slot_at, state_at) = l.slot(0, sent[1]);
        let lease = SlotLease::new(r.clone(), state_at, slot_at, 8).unwrap();
        drop(a); // the old worker is gone
        for s in 0..l.slots_per_worker() {
            reset_unleased(&r, l.slot(0, s).1);
        }
        assert_eq!(state(&r, l.slot(0, sent[0]).1), FREE, "never received");
        assert_eq!(state(&r, state_at), LEASED, "still the user's");
        drop(lease);
        assert_eq!(state(&r, state_at), FREE);
    }

    #[test]
    fn a_lease_outside_the_region_is_refused() {
        let (l, r) = region();
        let (slot_at, state_at) = l.slot(WORKERS - 1, l.slots_per_worker() - 1);
        assert!(SlotLease::new(r.clone(), state_at, slot_at, SLOT_SPAN).is_ok());
        for (state_at, slot_at, len) in [
            (state_at, slot_at, SLOT_SPAN + 1),
            (state_at, slot_at + 64, 1),
            (r.len() - 2, slot_at, 1),
            (state_at + 1, slot_at, 1),
            (usize::MAX - 1, slot_at, 1),
            (state_at, usize::MAX - 8, 1),
        ] {
            assert!(
                matches!(
                    SlotLease::new(r.clone(), state_at, slot_at, len),
                    Err(PoolError::SlotOutsideRegion)
                ),
                "{state_at} {slot_at} {len}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "no slot 5")]
    fn unhold_of_a_slot_the_worker_lacks_panics() {
        // Before: it stored FREE through a pointer past the worker's state words (the next
        // worker's, or past the region).
        let (l, r) = region();
        let mut a = l.arena(r, WORKERS - 1);
        a.unhold(l.slots_per_worker() + 1);
    }

    #[test]
    #[should_panic(expected = "slots outside the region")]
    fn an_arena_whose_span_overflows_is_refused() {
        // Before, in a release build: `slots_at + SLOT_SPAN * slots` wrapped below the region's
        // length and the check passed, for slots far outside the mapping.
        let (_, r) = region();
        Arena::new(r, 64, usize::MAX / ALIGN * ALIGN, 1);
    }

    #[test]
    #[should_panic(expected = "a state word's offset")]
    fn reset_unleased_past_the_address_space_panics() {
        // Before, in a release build: `state_at + 4` wrapped to 0 and the check passed.
        let (_, r) = region();
        reset_unleased(&r, usize::MAX - 3);
    }

    /// The hand-off across processes: a forked "worker" writes a batch into its slot and marks
    /// it HELD; the parent, as the main process, leases it, reads the bytes, and frees it.
    #[test]
    fn a_forked_worker_hands_a_slot_over() {
        let (l, r) = region();
        // SAFETY: the child only uses the arena (shared memory and atomics) and leaves with
        // _exit, running no destructor or atexit handler of the parent's state.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut a = l.arena(r.clone(), 1);
            a.begin();
            let ok = match a.alloc(4096) {
                Some((_, ptr)) => {
                    // SAFETY: 4096 bytes alloc gave this batch.
                    unsafe { std::ptr::write_bytes(ptr, 0xAB, 4096) };
                    a.finish(true) == Some(0)
                }
                None => false,
            };
            // SAFETY: ends the child without touching the parent's state.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let (slot_at, state_at) = l.slot(1, 0);
        assert_eq!(state(&r, state_at), HELD);
        let lease = SlotLease::new(r.clone(), state_at, slot_at, 4096).unwrap();
        // SAFETY: the leased bytes, mapped while the lease lives.
        let bytes = unsafe { std::slice::from_raw_parts(lease.addr() as *const u8, lease.len()) };
        assert!(bytes.iter().all(|&b| b == 0xAB));
        drop(lease);
        assert_eq!(state(&r, state_at), FREE);
    }
}
