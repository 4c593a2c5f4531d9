//! Slots that are already pinned: what the main process registers with the accelerator's
//! driver, and when a released slot may go back to its worker.
//!
//! NOTE [Pinned slots]: with `pin_memory=True` on CUDA, the main process registers each slot's
//! used bytes with the driver (`cudaHostRegister`) the first time a batch arrives in it, so the
//! batch's tensors over the slot (NOTE [Slots]) are page-locked where the worker wrote them:
//! nothing is copied into pinned memory, on any thread. Two rules make that safe.
//!
//! - **Release after the device read.** A batch moved with `non_blocking=True` is read by the
//!   device some time after `.to()` returns. When the last tensor over a slot is gone, the
//!   binding crate records events on the current stream of every device in use (those that
//!   queued the copies, or wait for the streams that did) and parks the slot's [`SlotLease`]
//!   here with them ([`Parked`]): the slot stays
//!   LEASED, so its worker cannot write into it, until the event has completed
//!   ([`reclaim`], run on each release and each poll of the pool). A worker that
//!   finds no FREE slot meanwhile sends its batch inline (correct, one copy slower). The
//!   stream is the current one of the thread that lets go of the batch, so that must be the
//!   user's: the pin thread keeps no reference to a batch it has handed over (NOTE [Pin
//!   thread]). A copy on a side stream that no current stream waits for is not covered (torch
//!   records its event on the copying stream, which it sees and this does not): the README
//!   says so. Where a fence cannot be made or asked, its slot is never freed (its worker
//!   sends inline from then on) rather than freed early.
//! - **Unregister before unmapping.** A registration outlives nothing it covers: the binding
//!   crate's holder of the registrations keeps the region mapped (an `Arc<ShmRegion>`) and
//!   unregisters every range ([`Registrations::drain`]) before letting go of it, after waiting
//!   for the parked events. A range is only ever grown while its slot is leased to the main
//!   process and no parked release of it is pending, so no device read is in flight from it.
//!
//! Only the main process registers; workers map the region afresh, unaware of it.

use std::collections::HashMap;

use crate::slots::{SlotLease, SLOT_SPAN};

/// Registrations grow in steps of this much (a registration costs ~0.1 ms per MB: growing by
/// a step at a time keeps batches of varying size from re-registering each time).
const STEP: usize = 2 << 20;

/// The length to register for a batch of `needed` bytes: a quarter more, in whole steps, at
/// most the slot's span.
pub fn registered_len(needed: usize) -> usize {
    let want = needed.saturating_add(needed / 4).max(1);
    want.div_ceil(STEP).saturating_mul(STEP).min(SLOT_SPAN)
}

/// What to do so that a slot's first `needed` bytes are registered.
#[derive(Debug, PartialEq, Eq)]
pub enum Registration {
    /// They are already.
    Covered,
    /// Register `len` bytes from the slot's start, after unregistering its old range if
    /// `replace` (ranges may not overlap).
    Register { replace: bool, len: usize },
}

/// The registered range of each slot (by the slot's offset in the region).
#[derive(Debug, Default)]
pub struct Registrations {
    lens: HashMap<usize, usize>,
}

impl Registrations {
    /// What makes the first `needed` bytes of the slot at `slot_at` registered.
    pub fn plan(&self, slot_at: usize, needed: usize) -> Registration {
        match self.lens.get(&slot_at) {
            Some(&len) if len >= needed => Registration::Covered,
            old => Registration::Register {
                replace: old.is_some(),
                len: registered_len(needed),
            },
        }
    }

    /// The slot at `slot_at` now has `len` bytes registered.
    pub fn registered(&mut self, slot_at: usize, len: usize) {
        self.lens.insert(slot_at, len);
    }

    /// The slot at `slot_at` has nothing registered (its old range was unregistered).
    pub fn unregistered(&mut self, slot_at: usize) {
        self.lens.remove(&slot_at);
    }

    /// Every registered slot's offset, forgetting them all (to unregister each).
    pub fn drain(&mut self) -> Vec<usize> {
        let mut all: Vec<usize> = self.lens.drain().map(|(at, _)| at).collect();
        all.sort_unstable();
        all
    }

    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
}

/// A released slot waiting for the device to finish reading it, with its fence (events, in
/// the binding crate). Dropping the lease frees the slot.
pub type Parked<F> = (SlotLease, F);

/// Splits `parked` into those whose fence `done` says is complete (their slots are freed as
/// they are dropped here) and the rest, which are returned. Fences complete in any order (they
/// may be on different streams), so every one is asked.
pub fn reclaim<F>(parked: Vec<Parked<F>>, mut done: impl FnMut(&F) -> bool) -> Vec<Parked<F>> {
    parked
        .into_iter()
        .filter(|(_, fence)| !done(fence))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::slots::{FREE, LEASED};
    use crate::Layout;

    #[test]
    fn registered_lengths_have_headroom_in_whole_steps_within_the_span() {
        assert_eq!(registered_len(0), STEP);
        assert_eq!(registered_len(1), STEP);
        assert_eq!(registered_len(STEP), 2 * STEP); // 1.25 steps, rounded up
        let batch = 256 * 3 * 224 * 224; // 38.5 MB
        let len = registered_len(batch);
        assert!(len >= batch + batch / 4 && len < batch + batch / 4 + STEP && len % STEP == 0);
        assert_eq!(registered_len(SLOT_SPAN), SLOT_SPAN);
        assert_eq!(registered_len(usize::MAX), SLOT_SPAN);
    }

    #[test]
    fn a_slot_is_registered_once_and_replaced_only_when_a_batch_outgrows_it() {
        let mut r = Registrations::default();
        let first = r.plan(0, 1000);
        assert_eq!(
            first,
            Registration::Register {
                replace: false,
                len: STEP
            }
        );
        r.registered(0, STEP);
        assert_eq!(r.plan(0, STEP), Registration::Covered);
        assert_eq!(r.plan(0, 10), Registration::Covered);
        assert_eq!(
            r.plan(0, STEP + 1),
            Registration::Register {
                replace: true,
                len: registered_len(STEP + 1)
            }
        );
        // Another slot is its own affair.
        assert_eq!(
            r.plan(SLOT_SPAN, 10),
            Registration::Register {
                replace: false,
                len: STEP
            }
        );
        r.registered(SLOT_SPAN, STEP);
        r.unregistered(0);
        assert_eq!(
            r.plan(0, 10),
            Registration::Register {
                replace: false,
                len: STEP
            }
        );
        assert_eq!(r.drain(), vec![SLOT_SPAN]);
        assert!(r.is_empty());
    }

    /// A fake fence: done once its flag is set.
    struct Flag(Arc<AtomicU32>);

    #[test]
    fn a_parked_slot_stays_leased_until_its_fence_is_done_in_any_order() {
        let layout = Layout::new(1, 2);
        let shm = Arc::new(layout.create_region("rloader pinned test").unwrap());
        let state = |s: usize| {
            let at = layout.slot(0, s).1;
            // SAFETY: a state word's offset from the layout, read atomically.
            unsafe { &*(shm.as_ptr().add(at) as *const AtomicU32) }.load(Ordering::Acquire)
        };
        let mut parked = Vec::new();
        let flags: Vec<Arc<AtomicU32>> = (0..3).map(|_| Arc::new(AtomicU32::new(0))).collect();
        for (s, flag) in flags.iter().enumerate() {
            let (slot_at, state_at) = layout.slot(0, s);
            let lease = SlotLease::new(shm.clone(), state_at, slot_at, 100).unwrap();
            parked.push((lease, Flag(flag.clone())));
        }
        let done = |f: &Flag| f.0.load(Ordering::Relaxed) == 1;
        parked = reclaim(parked, done);
        assert_eq!(parked.len(), 3);
        assert!((0..3).all(|s| state(s) == LEASED));
        flags[1].store(1, Ordering::Relaxed); // the second completes first
        parked = reclaim(parked, done);
        assert_eq!((state(0), state(1), state(2)), (LEASED, FREE, LEASED));
        flags[0].store(1, Ordering::Relaxed);
        flags[2].store(1, Ordering::Relaxed);
        parked = reclaim(parked, done);
        assert!(parked.is_empty());
        assert!((0..3).all(|s| state(s) == FREE));
    }
}
