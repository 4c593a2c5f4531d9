//! Fuzzing what the pool decodes from another process, and the layout and slots it trusts.
//!
//! - `wire`: DATA messages (NOTE [Pool protocol] in wire.rs) as the main process receives them:
//!   valid ones, which must decode to what was encoded, and mutations of them (bit flips,
//!   truncations, bytes inserted or cut, table words set to extremes, offsets past the slot),
//!   and random bytes. `decode_batch_table` must never panic, must agree with a reference
//!   decoder written with u128 arithmetic (so it cannot overflow), and every range it returns
//!   lies inside the message or the slot. `parse_header` and `indices` run on each input too.
//! - `layout`: `Layout::try_new` over worker counts and prefetch factors up to the extremes:
//!   an error exactly where the region would pass isize::MAX bytes, and otherwise no two
//!   pieces overlap and all fit.
//! - `lease`: `SlotLease::new` with hostile offsets and lengths (a lease is made from what a
//!   message names): refused unless it lies inside the region.
//! - `slots`: random sequences of a worker's and the main process's operations on the slots,
//!   checked against a model of their state machine (NOTE [Slots] in slots.rs).
//!
//! `cargo test` runs a short fixed-seed round; the long one is `make fuzz`:
//! `RLOADER_FUZZ_INPUTS=10000000 cargo test --release -p rloader-workers --test fuzz -- --ignored
//! --nocapture` (`RLOADER_FUZZ_SEED` picks the seed; the run prints the one it used).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rloader_queue::{Ring, ShmRegion};
use rloader_workers::layout::{INDEX_RING, RESULT_RING, SLOTS_ALIGN};
use rloader_workers::slots::{
    self, Arena, SlotLease, ViewCount, ALIGN, FREE, HELD, LEASED, SLOT_META_BYTES, SLOT_SPAN,
};
use rloader_workers::wire::{self, kind, BatchMessage, BatchTable, HEADER, NOWHERE};
use rloader_workers::{times, Layout, PoolError};

#[path = "../../test-support/fuzz_rng.rs"]
mod fuzz_rng;
use fuzz_rng::Rng;

/// What a run saw: inputs per target, and errors by kind.
#[derive(Default)]
struct Counts {
    inputs: BTreeMap<&'static str, u64>,
    errors: BTreeMap<String, u64>,
    round_trips: u64,
    /// Time per target, and the slowest single input (a slot sequence counts as one).
    time: BTreeMap<&'static str, Duration>,
    slowest: Duration,
}

impl Counts {
    fn input(&mut self, target: &'static str) {
        *self.inputs.entry(target).or_default() += 1;
    }

    fn error(&mut self, target: &str, e: &PoolError) {
        let name = format!("{e:?}");
        let name = name.split([' ', '{', '(']).next().unwrap_or_default();
        *self.errors.entry(format!("{target}: {name}")).or_default() += 1;
    }

    fn report(&self, seed: u64, elapsed: Duration) -> String {
        let total: u64 = self.inputs.values().sum();
        let errors: u64 = self.errors.values().sum();
        let mut out = format!(
            "RLOADER_FUZZ_SEED={seed}: {total} inputs in {:.1} s, {errors} errors returned (by \
             any of the decoders), {} valid messages round-tripped, slowest input {} us\n",
            elapsed.as_secs_f64(),
            self.round_trips,
            self.slowest.as_micros()
        );
        for (target, n) in &self.inputs {
            let secs = self.time.get(target).copied().unwrap_or_default();
            out += &format!("  inputs {target}: {n} in {:.1} s\n", secs.as_secs_f64());
        }
        for (what, n) in &self.errors {
            out += &format!("  errors {what}: {n}\n");
        }
        out
    }
}

// ---- wire ----

/// A DATA message's contents: the pickle, each buffer with its place in the slot (or None:
/// inline), and the slot.
struct Batch {
    pickle: Vec<u8>,
    buffers: Vec<(Vec<u8>, Option<usize>)>,
    slot: Option<usize>,
}

fn random_batch(rng: &mut Rng) -> Batch {
    let pickle_len = if rng.one_in(8) {
        rng.below(600)
    } else {
        rng.below(48)
    };
    let pickle = rng.bytes(pickle_len);
    let slotted = rng.one_in(2);
    let buffers = (0..rng.below(7))
        .map(|_| {
            let len = rng.pick(&[0, 1, 7, 8, 63, 64, 65]).max(rng.below(40));
            let place = (slotted && !rng.one_in(3)).then(|| match rng.below(4) {
                0 => rng.below(64) * ALIGN,
                1 => SLOT_SPAN - len,
                2 => rng.below(SLOT_SPAN - len + 1),
                _ => 0,
            });
            (rng.bytes(len), place)
        })
        .collect::<Vec<_>>();
    let slot = buffers
        .iter()
        .any(|(_, p)| p.is_some())
        .then(|| match rng.below(3) {
            0 => rng.below(8),
            1 => rng.below(1 << 32),
            // Any slot number but NOWHERE, which means "no slot".
            _ => rng.next().min(NOWHERE - 1) as usize,
        });
    Batch {
        pickle,
        buffers,
        slot,
    }
}

fn encode(b: &Batch) -> Vec<u8> {
    let bytes: Vec<&[u8]> = b.buffers.iter().map(|(x, _)| x.as_slice()).collect();
    let places: Vec<Option<usize>> = b.buffers.iter().map(|(_, p)| *p).collect();
    BatchMessage::new(3, 1 << 40, b.slot, &b.pickle, &bytes, &places)
        .parts()
        .concat()
}

/// The table as the protocol defines it, decoded with u128 arithmetic: no overflow can make it
/// accept what it should refuse. Same first error as the real decoder's, entry by entry.
fn reference_decode(msg: &[u8]) -> Option<BatchTable> {
    let word = |at: u128| -> Option<u128> {
        let at = usize::try_from(at).ok()?;
        let b = msg.get(at..at.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().unwrap()) as u128)
    };
    let (n, pickle_len, slot) = (word(16)?, word(24)?, word(32)?);
    let entries = 40u128;
    let mut at = entries + 16 * n;
    if at > usize::MAX as u128 {
        return None;
    }
    let pickle = (at, at + pickle_len);
    at += pickle_len;
    let (mut buffers, mut in_slot) = (Vec::new(), 0u128);
    let mut i = 0u128;
    while i < n {
        let (len, offset) = (word(entries + 16 * i)?, word(entries + 16 * i + 8)?);
        if offset == NOWHERE as u128 {
            buffers.push((false, at, at + len));
            at += len;
        } else {
            let end = offset + len;
            if slot == NOWHERE as u128 || end > SLOT_SPAN as u128 {
                return None;
            }
            in_slot = in_slot.max(end);
            buffers.push((true, offset, end));
        }
        i += 1;
    }
    if at > msg.len() as u128 {
        return None;
    }
    // Everything is now below msg.len() or SLOT_SPAN: the casts are exact.
    let u = |x: u128| x as usize;
    Some(BatchTable {
        pickle: (u(pickle.0), u(pickle.1)),
        slot: (slot != NOWHERE as u128).then(|| usize::try_from(slot).unwrap_or(usize::MAX)),
        buffers: buffers
            .into_iter()
            .map(|(s, a, b)| (s, u(a), u(b)))
            .collect(),
        in_slot: u(in_slot),
    })
}

/// Every decoder of the protocol on `msg`: no panic, the reference's answer, ranges inside.
fn decode_all(msg: &[u8], counts: &mut Counts) -> Option<BatchTable> {
    counts.input("wire");
    match wire::parse_header(msg) {
        Ok(h) => {
            assert!(msg.len() >= HEADER);
            assert_eq!(wire::header(h.kind, h.worker, h.task)[..], msg[..HEADER]);
            let ix = wire::indices(&msg[HEADER..]);
            assert_eq!(ix.len(), (msg.len() - HEADER) / 8);
            assert_eq!(
                wire::index_bytes(&ix)[..],
                msg[HEADER..HEADER + 8 * ix.len()]
            );
        }
        Err(e) => {
            assert!(msg.len() < HEADER && matches!(e, PoolError::ShortHeader));
            counts.error("wire header", &e);
        }
    }
    let got = wire::decode_batch_table(msg);
    let want = reference_decode(msg);
    match (&got, &want) {
        (Ok(t), Some(r)) => {
            assert_eq!(t, r, "{msg:?}");
            assert!(t.pickle.0 <= t.pickle.1 && t.pickle.1 <= msg.len());
            for &(in_slot, a, b) in &t.buffers {
                assert!(a <= b);
                assert!(if in_slot {
                    b <= t.in_slot && t.slot.is_some()
                } else {
                    b <= msg.len()
                });
            }
            assert!(t.in_slot <= SLOT_SPAN);
        }
        (Err(e), None) => {
            assert!(
                matches!(e, PoolError::TruncatedBatch | PoolError::OutsideSlot),
                "{e:?}"
            );
            counts.error("wire table", e);
        }
        _ => panic!("decoder {got:?}, reference {want:?}, message {msg:?}"),
    }
    got.ok()
}

/// A value a hostile or broken writer might put in a table word.
fn extreme(rng: &mut Rng, msg_len: usize) -> u64 {
    let near = |x: u64, rng: &mut Rng| x.wrapping_add(rng.below(9) as u64).wrapping_sub(4);
    match rng.below(10) {
        0 => rng.pick(&[0, 1, 7, 8, 15, 16, 17]),
        1 => near(msg_len as u64, rng),
        2 => near(SLOT_SPAN as u64, rng),
        3 => near(u64::MAX, rng),
        4 => near(i64::MAX as u64, rng),
        5 => near(1 << 48, rng),
        6 => near(u32::MAX as u64, rng),
        7 => (1u64 << rng.below(64)).wrapping_sub(rng.below(2) as u64),
        8 => NOWHERE,
        _ => rng.next(),
    }
}

/// `msg` changed the ways a broken or hostile writer would change it.
fn mutate(rng: &mut Rng, msg: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        match rng.below(9) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    if !msg.is_empty() {
                        let i = rng.below(msg.len());
                        msg[i] ^= 1 << rng.below(8);
                    }
                }
            }
            1 => msg.truncate(rng.below(msg.len() + 1)),
            2 | 3 => {
                // A table word (count, pickle length, slot, or an entry's length or offset).
                let words = msg.len().saturating_sub(HEADER) / 8;
                if words > 0 {
                    let at = HEADER + 8 * rng.below(words.min(3 + 2 * 8));
                    let v = extreme(rng, msg.len());
                    msg[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            4 => {
                // An offset in the slot moved past the slot's end.
                let words = msg.len().saturating_sub(HEADER + 24) / 16;
                if words > 0 {
                    let at = HEADER + 24 + 16 * rng.below(words) + 8;
                    let v = (SLOT_SPAN as u64).saturating_sub(rng.below(64) as u64);
                    msg[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            5 => {
                let at = rng.below(msg.len() + 1);
                let n = 1 + rng.below(24);
                let extra = rng.bytes(n);
                msg.splice(at..at, extra);
            }
            6 => {
                let at = rng.below(msg.len() + 1);
                let end = (at + 1 + rng.below(24)).min(msg.len());
                msg.drain(at..end);
            }
            7 => {
                if !msg.is_empty() {
                    let i = rng.below(msg.len());
                    msg[i] = rng.next() as u8;
                }
            }
            _ => {
                let n = msg.len().saturating_sub(HEADER + 24) / 16;
                if msg.len() >= HEADER + 8 {
                    let v = (n as u64).wrapping_add(rng.below(5) as u64).wrapping_sub(2);
                    msg[HEADER..HEADER + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// One input for the message decoders; a third of them valid and checked to round-trip.
fn wire_input(rng: &mut Rng, counts: &mut Counts) {
    match rng.below(6) {
        0 | 1 => {
            let b = random_batch(rng);
            let msg = encode(&b);
            let t = decode_all(&msg, counts).expect("a valid message decodes");
            assert_eq!(wire::parse_header(&msg).unwrap().kind, kind::DATA);
            assert_eq!(&msg[t.pickle.0..t.pickle.1], b.pickle.as_slice());
            assert_eq!(t.slot, b.slot);
            assert_eq!(t.buffers.len(), b.buffers.len());
            for (&(in_slot, a, e), (bytes, place)) in t.buffers.iter().zip(&b.buffers) {
                assert_eq!(in_slot, place.is_some());
                match place {
                    Some(at) => assert_eq!((a, e), (*at, at + bytes.len())),
                    None => assert_eq!(&msg[a..e], bytes.as_slice()),
                }
            }
            counts.round_trips += 1;
        }
        2..=4 => {
            let mut msg = encode(&random_batch(rng));
            mutate(rng, &mut msg);
            decode_all(&msg, counts);
        }
        _ => {
            let len = match rng.below(3) {
                0 => rng.below(48),
                1 => rng.below(256),
                _ => rng.below(2048),
            };
            let mut msg = rng.bytes(len);
            if rng.one_in(2) && msg.len() >= HEADER + 24 {
                // Past the first words with small numbers, garbage after.
                let n = rng.below(8) as u64;
                msg[HEADER..HEADER + 8].copy_from_slice(&n.to_le_bytes());
                let p = rng.below(64) as u64;
                msg[HEADER + 8..HEADER + 16].copy_from_slice(&p.to_le_bytes());
            }
            decode_all(&msg, counts);
        }
    }
}

// ---- layout ----

fn align_up(x: u128, to: u128) -> u128 {
    x.div_ceil(to) * to
}

/// The region's length by the layout's rules in u128 (u128::MAX past that): past isize::MAX,
/// no layout.
fn reference_len(workers: usize, prefetch: usize) -> u128 {
    let (w, a) = (workers as u128, Ring::ALIGN as u128);
    let per_worker = align_up(Ring::required_len(INDEX_RING) as u128, a)
        + align_up(Ring::required_len(RESULT_RING) as u128, a);
    // Below 2^64 slots every sum below fits in u128.
    let slots = w
        .checked_mul(prefetch.max(1) as u128 + 3)
        .filter(|&n| n < 1 << 64);
    slots.map_or(u128::MAX, |slots| {
        let times_at = align_up(64 + SLOT_META_BYTES as u128 * slots, a);
        let rings_at = align_up(times_at + times::BYTES as u128 * w, a);
        let slots_at = align_up(rings_at + w * per_worker, SLOTS_ALIGN as u128);
        slots_at + slots * SLOT_SPAN as u128
    })
}

fn layout_input(rng: &mut Rng, counts: &mut Counts) {
    let big = |rng: &mut Rng| {
        let x = 1usize << rng.below(64);
        x.wrapping_add(rng.below(9)).wrapping_sub(4)
    };
    let workers = match rng.below(4) {
        0 | 1 => 1 + rng.below(64),
        2 => 1 + rng.below(1 << 12),
        _ => big(rng),
    };
    let prefetch = match rng.below(4) {
        0 | 1 => rng.below(32),
        2 => big(rng),
        _ => usize::MAX - rng.below(8),
    };
    let fits = workers > 0 && reference_len(workers, prefetch) <= isize::MAX as u128;
    if fits && workers > 1 << 16 {
        // Valid, but a layout of that many workers is a large allocation: its arithmetic is
        // checked by the smaller ones and by reference_len's edge (unit tests of layout.rs).
        return;
    }
    counts.input("layout");
    match Layout::try_new(workers, prefetch) {
        Ok(l) => {
            assert!(fits, "{workers} {prefetch}");
            assert_eq!(l.len as u128, reference_len(workers, prefetch));
            check_layout(&l);
        }
        Err(e) => {
            assert!(!fits, "{workers} {prefetch}: {e}");
            assert!(matches!(
                e,
                PoolError::TooManySlots { .. } | PoolError::NoWorkers
            ));
            counts.error("layout", &e);
        }
    }
}

/// No two pieces of `l` overlap, all lie inside it, rings before slots, slots aligned.
fn check_layout(l: &Layout) {
    let (nw, spw) = (l.num_workers(), l.slots_per_worker());
    let mut pieces = vec![(0, rloader_queue::Doorbell::LEN)];
    // All of them for small layouts; the first and last of each kind for large ones.
    let few = |n: usize| -> Vec<usize> {
        if n <= 64 {
            (0..n).collect()
        } else {
            vec![0, 1, n / 2, n - 2, n - 1]
        }
    };
    for w in few(nw) {
        let t = l.times(w);
        pieces.push((t, t + times::BYTES));
        for (at, len) in [l.task_ring(w), l.answer_ring(w)] {
            assert_eq!(at % Ring::ALIGN, 0);
            assert!(at + len <= l.committed);
            pieces.push((at, at + len));
        }
        for s in few(spw) {
            let (slot, state) = l.slot(w, s);
            assert_eq!(slot % SLOTS_ALIGN, 0);
            assert!(slot >= l.committed);
            assert_eq!(state % 4, 0);
            pieces.push((state, state + SLOT_META_BYTES));
            pieces.push((slot, slot + SLOT_SPAN));
        }
    }
    assert_eq!(l.slot(nw - 1, spw - 1).0 + SLOT_SPAN, l.len);
    pieces.sort_unstable();
    for pair in pieces.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "{pair:?} overlap");
    }
    assert!(pieces.iter().all(|&(_, end)| end <= l.len));
}

// ---- slot leases ----

/// A region as large as a two-slot layout's, for leases at hostile offsets.
struct LeaseRegion {
    region: Arc<ShmRegion>,
}

impl LeaseRegion {
    fn new() -> Self {
        let len = 2 * SLOT_SPAN + (64 << 10);
        let region = ShmRegion::create_anonymous("rloader fuzz leases", len, 64 << 10).unwrap();
        LeaseRegion {
            region: Arc::new(region),
        }
    }

    fn input(&self, rng: &mut Rng, counts: &mut Counts) {
        counts.input("lease");
        let len_r = self.region.len();
        let near = |x: usize, rng: &mut Rng| x.wrapping_add(rng.below(17)).wrapping_sub(8);
        let state_at = match rng.below(4) {
            0 => rng.below(64 << 10),
            1 => near(len_r, rng),
            2 => near(usize::MAX, rng),
            _ => rng.next() as usize,
        };
        let slot_at = match rng.below(4) {
            0 => rng.below(len_r),
            1 => near(len_r - SLOT_SPAN, rng),
            2 => near(usize::MAX - SLOT_SPAN, rng),
            _ => rng.next() as usize,
        };
        let len = match rng.below(3) {
            0 => rng.below(SLOT_SPAN + 1),
            1 => near(SLOT_SPAN, rng),
            _ => rng.next() as usize,
        };
        let fits = |at: usize, n: usize| at as u128 + n as u128 <= len_r as u128;
        let ok =
            len <= SLOT_SPAN && fits(slot_at, SLOT_SPAN) && fits(state_at, 4) && state_at % 4 == 0;
        match SlotLease::new(self.region.clone(), state_at, slot_at, len) {
            Ok(lease) => {
                assert!(ok, "{state_at} {slot_at} {len}");
                assert_eq!(lease.addr(), self.region.as_ptr() as usize + slot_at);
                assert_eq!(word(&self.region, state_at), LEASED);
                drop(lease);
                assert_eq!(word(&self.region, state_at), FREE);
            }
            Err(e) => {
                assert!(!ok, "{state_at} {slot_at} {len}: {e}");
                assert!(matches!(e, PoolError::SlotOutsideRegion));
                counts.error("lease", &e);
            }
        }
    }
}

/// The u32 at `at` in `region`.
fn word(region: &ShmRegion, at: usize) -> u32 {
    assert!(at % 4 == 0 && at + 4 <= region.len());
    // SAFETY: an aligned u32 inside the region; nothing else uses it now.
    unsafe { std::ptr::read_volatile(region.as_ptr().add(at) as *const u32) }
}

// ---- slots against a model ----

#[derive(Debug, Clone)]
enum Op {
    Begin,
    Alloc(usize),
    Finish {
        sent: bool,
    },
    /// The message naming the `i`th held slot could not be sent.
    Unhold(usize),
    View,
    DropView(usize),
    /// The main process received the message naming the `i`th held slot.
    Lease(usize),
    DropLease(usize),
    /// The worker is replaced (a new pool on the same region).
    NewWorker,
}

fn op(rng: &mut Rng) -> Op {
    match rng.below(16) {
        0..=2 => Op::Begin,
        3..=6 => Op::Alloc(alloc_size(rng.next())),
        7 | 8 => Op::Finish {
            sent: !rng.one_in(4),
        },
        9 => Op::Unhold(rng.below(8)),
        10 => Op::View,
        11 => Op::DropView(rng.below(8)),
        12 | 13 => Op::Lease(rng.below(8)),
        14 => Op::DropLease(rng.below(8)),
        _ => Op::NewWorker,
    }
}

/// Mostly small, sometimes a few MiB (a new commit step), sometimes impossible.
fn alloc_size(x: u64) -> usize {
    let pick = (x % 16) as usize;
    let r = (x >> 8) as usize;
    match pick {
        0 => 0,
        1 => SLOT_SPAN + 1 + r % 8,
        2 => usize::MAX - r % 64,
        3 | 4 => (3 << 20) + r % (1 << 20),
        _ => 1 + r % (64 << 10),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Held,
    Leased,
}

/// What the slots of one worker should look like.
struct Model {
    states: Vec<State>,
    /// The worker's views per slot.
    views: Vec<usize>,
    current: Option<usize>,
    used: usize,
    /// Bytes of each slot used so far by any batch (the high-water mark, in pages).
    high_water: Vec<u32>,
}

/// The real thing beside the model.
struct Slots {
    layout: Layout,
    region: Arc<ShmRegion>,
    worker: usize,
    arena: Arena,
    views: Vec<(usize, ViewCount)>,
    leases: Vec<(usize, SlotLease)>,
    model: Model,
}

impl Slots {
    fn new(prefetch: usize) -> Self {
        let layout = Layout::new(2, prefetch);
        let region = Arc::new(layout.create_region("rloader fuzz slots").unwrap());
        Slots::on(layout, region)
    }

    /// Slots of worker 1 of `layout` in `region`, whose slot words are all zero (FREE, no
    /// high-water mark).
    fn on(layout: Layout, region: Arc<ShmRegion>) -> Self {
        let worker = 1;
        let arena = layout.arena(region.clone(), worker);
        let n = layout.slots_per_worker();
        Slots {
            layout,
            region,
            worker,
            arena,
            views: Vec::new(),
            leases: Vec::new(),
            model: Model {
                states: vec![State::Free; n],
                views: vec![0; n],
                current: None,
                used: 0,
                high_water: vec![0; n],
            },
        }
    }

    fn held(&self, i: usize) -> Option<usize> {
        let held: Vec<usize> = (0..self.model.states.len())
            .filter(|&s| self.model.states[s] == State::Held)
            .collect();
        (!held.is_empty()).then(|| held[i % held.len()])
    }

    fn apply(&mut self, op: &Op) {
        let m = &mut self.model;
        match *op {
            Op::Begin => {
                self.arena.begin();
                m.used = 0;
                m.current =
                    (0..m.states.len()).find(|&s| m.states[s] == State::Free && m.views[s] == 0);
                assert_eq!(self.arena.has_slot(), m.current.is_some());
            }
            Op::Alloc(n) => {
                let got = self.arena.alloc(n);
                let want = m.current.and_then(|slot| {
                    let start = m.used.div_ceil(ALIGN) * ALIGN;
                    let end = start.checked_add(n)?;
                    (n > 0 && end <= SLOT_SPAN).then_some((slot, start, end))
                });
                match (got, want) {
                    (None, None) => {}
                    (Some((at, ptr)), Some((slot, start, end))) => {
                        assert_eq!(at, start);
                        let base = self.region.as_ptr() as usize;
                        assert_eq!(
                            ptr as usize,
                            base + self.layout.slot(self.worker, slot).0 + at
                        );
                        assert_eq!(self.arena.offset_of(ptr, n), Some(at));
                        assert_eq!(self.arena.offset_of(ptr, n + 1), None);
                        // Committed and writable, first and last byte.
                        // SAFETY: the n bytes alloc gave this batch.
                        unsafe {
                            ptr.write(0xA5);
                            ptr.add(n - 1).write(0x5A);
                        }
                        m.used = end;
                    }
                    (got, want) => panic!("alloc({n}): {got:?}, model {want:?}"),
                }
                assert!(self.arena.take_warning().is_none());
            }
            Op::Finish { sent } => {
                let got = self.arena.finish(sent);
                let want = m.current.take().and_then(|slot| {
                    let pages = m.used.div_ceil(4096) as u32;
                    m.high_water[slot] = m.high_water[slot].max(pages);
                    sent.then(|| {
                        m.states[slot] = State::Held;
                        slot
                    })
                });
                assert_eq!(got, want);
                assert!(!self.arena.has_slot());
            }
            Op::Unhold(i) => {
                if let Some(slot) = self.held(i) {
                    self.arena.unhold(slot);
                    self.model.states[slot] = State::Free;
                }
            }
            Op::View => {
                if let Some(slot) = m.current {
                    self.views.push((slot, self.arena.view()));
                    m.views[slot] += 1;
                }
            }
            Op::DropView(i) => {
                if !self.views.is_empty() {
                    let (slot, view) = self.views.swap_remove(i % self.views.len());
                    drop(view);
                    m.views[slot] -= 1;
                }
            }
            Op::Lease(i) => {
                if let Some(slot) = self.held(i) {
                    let (slot_at, state_at) = self.layout.slot(self.worker, slot);
                    let len = (i * 4096).min(SLOT_SPAN);
                    let lease = SlotLease::new(self.region.clone(), state_at, slot_at, len)
                        .expect("a slot of the layout");
                    self.leases.push((slot, lease));
                    self.model.states[slot] = State::Leased;
                }
            }
            Op::DropLease(i) => {
                if !self.leases.is_empty() {
                    let (slot, lease) = self.leases.swap_remove(i % self.leases.len());
                    drop(lease);
                    m.states[slot] = State::Free;
                }
            }
            Op::NewWorker => {
                // The old worker is gone with its views; the new pool frees what was never
                // received (NOTE [Slots]).
                self.views.clear();
                for s in 0..self.layout.slots_per_worker() {
                    slots::reset_unleased(&self.region, self.layout.slot(self.worker, s).1);
                }
                self.arena = self.layout.arena(self.region.clone(), self.worker);
                for s in 0..m.states.len() {
                    if m.states[s] == State::Held {
                        m.states[s] = State::Free;
                    }
                    m.views[s] = 0;
                }
                m.current = None;
            }
        }
        self.check();
    }

    /// The region's words say what the model says; the other worker's are untouched.
    fn check(&self) {
        for s in 0..self.layout.slots_per_worker() {
            let state_at = self.layout.slot(self.worker, s).1;
            let want = match self.model.states[s] {
                State::Free => FREE,
                State::Held => HELD,
                State::Leased => LEASED,
            };
            assert_eq!(word(&self.region, state_at), want, "slot {s}");
            assert_eq!(
                word(&self.region, state_at + 4),
                self.model.high_water[s],
                "slot {s}"
            );
            let other = self.layout.slot(0, s).1;
            assert_eq!(
                (word(&self.region, other), word(&self.region, other + 4)),
                (FREE, 0)
            );
        }
    }
}

/// A sequence of 64 operations on the slots of one of `regions` (made once: a region costs
/// more than the operations), its slot words zeroed first.
fn slots_input(
    rng: &mut Rng,
    counts: &mut Counts,
    regions: &mut [Option<(Layout, Arc<ShmRegion>)>],
) {
    let prefetch = rng.below(regions.len());
    let (layout, region) = regions[prefetch].get_or_insert_with(|| {
        let l = Layout::new(2, prefetch);
        let r = Arc::new(l.create_region("rloader fuzz slots").unwrap());
        (l, r)
    });
    for w in 0..layout.num_workers() {
        for s in 0..layout.slots_per_worker() {
            let at = layout.slot(w, s).1;
            // SAFETY: the slot's two words, in the region; no arena or lease uses them now.
            unsafe { std::ptr::write_bytes(region.as_ptr().add(at), 0, SLOT_META_BYTES) };
        }
    }
    let mut s = Slots::on(layout.clone(), region.clone());
    for _ in 0..64 {
        counts.input("slot ops");
        s.apply(&op(rng));
    }
}

// ---- the runs ----

/// `inputs` decoder inputs from `seed`: mostly messages, some layouts, leases and slot
/// operations (each counts as one input; a slot sequence is 64 operations).
fn run(seed: u64, inputs: u64) -> Counts {
    let mut rng = Rng::new(seed);
    let mut counts = Counts::default();
    let leases = LeaseRegion::new();
    let mut regions = vec![None, None, None, None];
    let mut done = 0u64;
    while done < inputs {
        let t = Instant::now();
        let before: u64 = counts.inputs.values().sum();
        let target = match rng.below(1024) {
            0..=15 => {
                layout_input(&mut rng, &mut counts);
                "layout"
            }
            16..=47 => {
                leases.input(&mut rng, &mut counts);
                "lease"
            }
            48 => {
                slots_input(&mut rng, &mut counts, &mut regions);
                "slot ops"
            }
            _ => {
                wire_input(&mut rng, &mut counts);
                "wire"
            }
        };
        let took = t.elapsed();
        *counts.time.entry(target).or_default() += took;
        counts.slowest = counts.slowest.max(took);
        done += counts.inputs.values().sum::<u64>() - before;
    }
    counts
}

#[test]
fn a_short_fixed_seed_run() {
    let t = Instant::now();
    let counts = run(0x5eed, 200_000);
    println!("{}", counts.report(0x5eed, t.elapsed()));
    assert!(counts.round_trips > 10_000);
    assert!(counts.inputs["wire"] > 150_000);
    assert!(counts.inputs["slot ops"] > 1_000);
    assert!(counts.errors.keys().any(|k| k.contains("OutsideSlot")));
    assert!(counts.errors.keys().any(|k| k.contains("TooManySlots")));
    assert!(counts
        .errors
        .keys()
        .any(|k| k.contains("SlotOutsideRegion")));
}

/// `make fuzz`: RLOADER_FUZZ_INPUTS inputs (10 million unless set), from RLOADER_FUZZ_SEED (or
/// the clock's nanoseconds), with counts printed at the end.
#[test]
#[ignore = "long: make fuzz"]
fn a_long_run() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let inputs = env("RLOADER_FUZZ_INPUTS").unwrap_or(10_000_000);
    let seed = env("RLOADER_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("rloader-workers fuzz: {inputs} inputs, RLOADER_FUZZ_SEED={seed}");
    let t = Instant::now();
    let counts = run(seed, inputs);
    println!("{}", counts.report(seed, t.elapsed()));
}

// ---- the slots' state machine, shrunk by proptest when it fails ----

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Begin),
        4 => any::<u64>().prop_map(|x| Op::Alloc(alloc_size(x))),
        2 => any::<bool>().prop_map(|sent| Op::Finish { sent }),
        1 => (0usize..8).prop_map(Op::Unhold),
        1 => Just(Op::View),
        1 => (0usize..8).prop_map(Op::DropView),
        2 => (0usize..8).prop_map(Op::Lease),
        1 => (0usize..8).prop_map(Op::DropLease),
        1 => Just(Op::NewWorker),
    ]
}

proptest! {
    // No regression file: integration tests have no lib.rs for proptest to put it beside.
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn slots_follow_their_model(
        prefetch in 0usize..4,
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        let mut s = Slots::new(prefetch);
        for op in &ops {
            s.apply(op);
        }
    }
}
