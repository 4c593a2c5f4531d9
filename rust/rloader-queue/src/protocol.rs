//! The ring and doorbell protocols over plain atomics, whatever memory they live in:
//! shared memory in a normal build ([`crate::Ring`], [`crate::Doorbell`]), the heap under
//! loom (the model checks at the bottom of this file).

use std::time::Instant;

use crate::sync::{expired, fence, AtomicU32, AtomicU64, Ordering, Parker, Wake};
use crate::QueueError;

// NOTE [Ring protocol]
// ~~~~~~~~~~~~~~~~~~~~
// A ring is a header (`RingHeader`, three cache lines) followed by `cap` data bytes, at an
// offset inside a shared-memory region. Nothing in it is a pointer: only positions and sizes.
//
// Positions. `tail` (bytes ever written) and `head` (bytes ever consumed) are u64 counters
// that only grow (2^64 bytes never wrap); byte position `p` lives at data offset `p % cap`.
// Invariant: head <= tail <= head + cap.
//   * Only the producer writes `tail`; only the consumer writes `head`.
//   * Bytes [head, tail) belong to the consumer: the producer published them with a Release
//     store of `tail`, the consumer reads them after an Acquire load of `tail`.
//   * Bytes [tail, head + cap) belong to the producer: the consumer gave them back with a
//     Release store of `head` after copying them out; the producer writes them after an
//     Acquire load of `head`.
// Each side keeps its own position in process memory (`ProducerState`/`ConsumerState`) and
// only publishes it; the peer's position is read from shared memory and checked against the
// invariant, so a peer's garbage is a `QueueError::Corrupt`, never an out-of-bounds copy
// (every copy is also bounded by `% cap`).
//
// Framing. The byte stream is a sequence of frames: an 8-byte little-endian header
// (`FRAME_TAG << 48 | len`) then `len` payload bytes, split across the wrap-around as it
// falls. A message whose frame fits in `cap` is published with one `tail` store once the
// producer has room for all of it, so the consumer sees it whole or not at all, and a send
// that times out has written nothing. A larger message is streamed: the producer publishes
// what fits, waits for room, publishes more; the consumer copies out what is there, gives
// the room back (`head`), waits for more. `recv` keeps a half-received message in
// `ConsumerState` across a timeout, so a recv timeout never desynchronises the stream; a
// send timeout in the middle of a streamed message closes the ring (the reader holds half
// a frame that nothing will finish).
//
// Sleeping without losing a wake-up. Each direction has a futex word and a waiter flag:
//   * the consumer sleeps on `data_seq` (announced in `data_waiters`) for `tail` to move,
//   * the producer sleeps on `space_seq` (announced in `space_waiters`) for `head` to move.
// The sleeper:  seq = load(seq); store(waiters, 1); fence(SeqCst); re-check the position
//               (and `closed`); if still not ready: FUTEX_WAIT(seq word, seq); store(waiters, 0).
// The waker:    store(position, Release); fence(SeqCst); if load(waiters) != 0 {
//               fetch_add(seq word, 1); FUTEX_WAKE }.
// The two SeqCst fences order "announce, then re-check" against "publish, then look for a
// sleeper" (Dekker): either the sleeper's re-check sees the new position, or the waker sees
// the flag and bumps the futex word, and FUTEX_WAIT compares the word with the `seq` loaded
// *before* the announce, atomically with going to sleep, so a bump that lands before the
// sleep makes the wait return at once and one after it finds the sleeper queued. The fast
// path (the peer is not asleep) is a fence and a load: no system call. Before announcing,
// a sleeper polls the position for a few dozen `pause`s (`spin_until`): a peer mid-send
// usually publishes within that, and a futex round trip costs more.
// `close` sets `closed`, then bumps both futex words and wakes everyone; sleepers check
// `closed` after announcing, so it cannot be missed either. The `Doorbell` uses the same
// hand-shake with its counter as the futex word and a count of sleepers (many producers
// ring it, the one consumer sleeps on it).
//
// `loom_tests` below model-checks these hand-shakes with loom's atomics and a loom model
// of the futex (src/sync.rs): data race freedom of the byte ranges, the invariant, and no
// lost wake-up (a lost one shows as a deadlock).

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"rlqring\0");
pub(crate) const VERSION: u32 = 1;
/// The high 16 bits of every frame header: a cheap check that the reader is in step.
const FRAME_TAG: u64 = 0x5251;
pub(crate) const FRAME_HEADER: u64 = 8;
/// The longest payload a frame header can describe (48 bits).
pub(crate) const MAX_MESSAGE_LEN: u64 = (1 << 48) - 1;
/// Polls before a futex sleep (none under loom, where every poll is a new interleaving).
const SPIN_LIMIT: u32 = if cfg!(loom) { 0 } else { 64 };
/// The smallest data area a ring may have: one frame header plus some payload.
pub(crate) const MIN_CAPACITY: u64 = 16;
/// Past this, the reader's position read when a side starts is garbage: no ring carries
/// 8 EiB. Below it (and the writer's at most `cap` ahead) the positions' sums (a position plus
/// a frame, plus the capacity) cannot overflow.
const MAX_START_POSITION: u64 = 1 << 63;

/// Written once by the creator before any peer attaches; `closed` by either side.
#[repr(C, align(64))]
pub(crate) struct MetaLine {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    pub(crate) header_len: AtomicU32,
    pub(crate) capacity: AtomicU64,
    pub(crate) closed: AtomicU32,
}

/// Written by the producer (the close path aside).
#[repr(C, align(64))]
pub(crate) struct ProducerLine {
    pub(crate) tail: AtomicU64,
    pub(crate) data_seq: AtomicU32,
    pub(crate) space_waiters: AtomicU32,
}

/// Written by the consumer (the close path aside).
#[repr(C, align(64))]
pub(crate) struct ConsumerLine {
    pub(crate) head: AtomicU64,
    pub(crate) space_seq: AtomicU32,
    pub(crate) data_waiters: AtomicU32,
}

/// The start of every ring; see NOTE [Ring protocol]. All fields are atomics, so sharing
/// it with another process (or a misbehaving one) is never a data race in Rust's model.
#[repr(C)]
pub(crate) struct RingHeader {
    pub(crate) meta: MetaLine,
    pub(crate) prod: ProducerLine,
    pub(crate) cons: ConsumerLine,
    pub(crate) parker: Parker,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RingHeader>() == 192);

pub(crate) const HEADER_LEN: usize = std::mem::size_of::<RingHeader>();

impl RingHeader {
    /// Writes a fresh header for `capacity` data bytes; `magic` last.
    pub(crate) fn initialize(&self, capacity: u64) {
        let o = Ordering::Relaxed;
        self.meta.version.store(VERSION, o);
        self.meta.header_len.store(HEADER_LEN as u32, o);
        self.meta.capacity.store(capacity, o);
        self.meta.closed.store(0, o);
        self.prod.tail.store(0, o);
        self.prod.data_seq.store(0, o);
        self.prod.space_waiters.store(0, o);
        self.cons.head.store(0, o);
        self.cons.space_seq.store(0, o);
        self.cons.data_waiters.store(0, o);
        self.meta.magic.store(MAGIC, Ordering::Release);
    }

    /// Checks what `initialize` wrote, for a peer attaching with its own idea of the size.
    pub(crate) fn validate(&self, capacity: u64) -> Result<(), QueueError> {
        let magic = self.meta.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(QueueError::BadHeader(format!(
                "no ring header at this offset (magic {magic:#018x}, expected {MAGIC:#018x}): \
                 wrong shared-memory name or offset, or the creator has not called Ring::init"
            )));
        }
        let version = self.meta.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(QueueError::BadHeader(format!(
                "ring format version {version}, this build speaks {VERSION}: the two processes \
                 run different rloader builds"
            )));
        }
        let header_len = self.meta.header_len.load(Ordering::Relaxed);
        if header_len as usize != HEADER_LEN {
            return Err(QueueError::BadHeader(format!(
                "header of {header_len} bytes, this build expects {HEADER_LEN}"
            )));
        }
        let found = self.meta.capacity.load(Ordering::Relaxed);
        if found != capacity {
            return Err(QueueError::BadHeader(format!(
                "the ring holds {found} data bytes but was attached with room for {capacity}: \
                 pass attach the same length as init"
            )));
        }
        Ok(())
    }
}

/// The data bytes of a ring: a raw view of shared memory.
#[cfg(not(loom))]
pub(crate) struct DataBuf {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: DataBuf is a view of a shared mapping that the owner (Ring) keeps alive; which
// bytes each side may touch is NOTE [Ring protocol]'s business, enforced by RingCore.
#[cfg(not(loom))]
unsafe impl Send for DataBuf {}
#[cfg(not(loom))]
unsafe impl Sync for DataBuf {}

#[cfg(not(loom))]
impl DataBuf {
    /// # Safety
    /// `ptr..ptr + cap` must stay mapped while the DataBuf is used.
    pub(crate) unsafe fn new(ptr: *mut u8, cap: usize) -> DataBuf {
        DataBuf { ptr, cap }
    }

    pub(crate) fn len(&self) -> usize {
        self.cap
    }

    fn cap(&self) -> u64 {
        self.cap as u64
    }

    /// Copies `src` to stream position `pos`, wrapping around. `src.len() <= cap`.
    fn copy_in(&self, pos: u64, src: &[u8]) {
        debug_assert!(src.len() <= self.cap);
        let start = (pos % self.cap as u64) as usize;
        let first = src.len().min(self.cap - start);
        // SAFETY: start + first <= cap and src.len() - first <= start <= cap: both ranges are
        // inside the mapping, and the protocol gives these bytes to the producer.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(start), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.ptr, src.len() - first);
        }
    }

    /// Copies `n <= cap` bytes from stream position `pos` to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes.
    unsafe fn copy_out(&self, pos: u64, dst: *mut u8, n: usize) {
        debug_assert!(n <= self.cap);
        let start = (pos % self.cap as u64) as usize;
        let first = n.min(self.cap - start);
        std::ptr::copy_nonoverlapping(self.ptr.add(start), dst, first);
        std::ptr::copy_nonoverlapping(self.ptr, dst.add(first), n - first);
    }
}

/// Under loom, every data byte is a tracked cell, so loom reports a read of a byte that the
/// protocol has not yet handed over.
#[cfg(loom)]
pub(crate) struct DataBuf {
    cells: Vec<loom::cell::UnsafeCell<u8>>,
}

#[cfg(loom)]
impl DataBuf {
    pub(crate) fn new(cap: usize) -> DataBuf {
        DataBuf {
            cells: (0..cap).map(|_| loom::cell::UnsafeCell::new(0)).collect(),
        }
    }

    fn cap(&self) -> u64 {
        self.cells.len() as u64
    }

    fn copy_in(&self, pos: u64, src: &[u8]) {
        for (i, &b) in src.iter().enumerate() {
            let at = ((pos + i as u64) % self.cap()) as usize;
            // SAFETY: loom checks the access.
            self.cells[at].with_mut(|p| unsafe { *p = b });
        }
    }

    unsafe fn copy_out(&self, pos: u64, dst: *mut u8, n: usize) {
        for i in 0..n {
            let at = ((pos + i as u64) % self.cap()) as usize;
            let b = self.cells[at].with(|p| *p);
            *dst.add(i) = b;
        }
    }
}

/// The producer's private view: its own position and the last `head` it saw.
#[derive(Debug, Default)]
pub(crate) struct ProducerState {
    started: bool,
    tail: u64,
    cached_head: u64,
    /// Payload bytes handed over of a streamed message `send_partial` left half sent.
    streamed: Option<u64>,
}

/// The consumer's private view, plus a message half received when a recv timed out.
#[derive(Debug, Default)]
pub(crate) struct ConsumerState {
    started: bool,
    head: u64,
    published_head: u64,
    cached_tail: u64,
    /// Payload bytes still to come of the message being received.
    remaining: Option<u64>,
    /// Its bytes so far, parked here between a timed-out recv and the next one.
    stash: Vec<u8>,
}

impl ConsumerState {
    pub(crate) fn mid_message(&self) -> bool {
        self.remaining.is_some()
    }
}

/// One ring's protocol, borrowed from wherever the header and data live.
pub(crate) struct RingCore<'a> {
    pub(crate) hdr: &'a RingHeader,
    pub(crate) data: &'a DataBuf,
    pub(crate) bell: Option<&'a DoorbellWord>,
}

fn corrupt(why: String) -> QueueError {
    QueueError::Corrupt(why)
}

impl RingCore<'_> {
    fn cap(&self) -> u64 {
        self.data.cap()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.hdr.meta.closed.load(Ordering::Acquire) != 0
    }

    /// True when bytes are waiting: a message, or the rest of one.
    pub(crate) fn has_data(&self) -> bool {
        self.hdr.prod.tail.load(Ordering::Acquire) != self.hdr.cons.head.load(Ordering::Acquire)
    }

    /// Either side: no more sends; wakes every sleeper (and the doorbell's).
    pub(crate) fn close(&self) {
        self.hdr.meta.closed.store(1, Ordering::SeqCst);
        self.hdr.prod.data_seq.fetch_add(1, Ordering::AcqRel);
        self.hdr.cons.space_seq.fetch_add(1, Ordering::AcqRel);
        self.hdr.parker.wake(&self.hdr.prod.data_seq, i32::MAX);
        self.hdr.parker.wake(&self.hdr.cons.space_seq, i32::MAX);
        if let Some(bell) = self.bell {
            bell.ring();
        }
    }

    /// Before sleeping, watch for a short while (about a microsecond): a peer that is busy
    /// right now usually publishes within that, and a futex sleep and wake cost more.
    fn spin_until(&self, ready: impl Fn() -> bool) -> bool {
        for _ in 0..SPIN_LIMIT {
            std::hint::spin_loop();
            if ready() {
                return true;
            }
        }
        false
    }

    // ---- producer side ----

    fn start_producer(&self, st: &mut ProducerState) -> Result<(), QueueError> {
        if !st.started {
            let tail = self.hdr.prod.tail.load(Ordering::Acquire);
            let head = self.hdr.cons.head.load(Ordering::Acquire);
            if head > tail || tail - head > self.cap() || head > MAX_START_POSITION {
                return Err(corrupt(format!(
                    "head {head}, tail {tail}, capacity {}",
                    self.cap()
                )));
            }
            *st = ProducerState {
                started: true,
                tail,
                cached_head: head,
                streamed: None,
            };
        }
        Ok(())
    }

    fn free(&self, st: &ProducerState) -> u64 {
        self.cap() - (st.tail - st.cached_head)
    }

    fn refresh_head(&self, st: &mut ProducerState) -> Result<(), QueueError> {
        let head = self.hdr.cons.head.load(Ordering::Acquire);
        if head < st.cached_head || head > st.tail {
            return Err(corrupt(format!(
                "the reader's position {head} is outside [{}, {}]",
                st.cached_head, st.tail
            )));
        }
        st.cached_head = head;
        Ok(())
    }

    /// Waits until `need <= cap` bytes are free.
    fn wait_space(
        &self,
        st: &mut ProducerState,
        need: u64,
        deadline: Option<Instant>,
    ) -> Result<(), QueueError> {
        debug_assert!(need <= self.cap());
        loop {
            if self.free(st) >= need {
                return Ok(());
            }
            self.refresh_head(st)?;
            if self.free(st) >= need {
                return Ok(());
            }
            if self.is_closed() {
                return Err(QueueError::Closed);
            }
            if expired(deadline) {
                return Err(QueueError::Timeout);
            }
            if self.spin_until(|| {
                let head = self.hdr.cons.head.load(Ordering::Relaxed);
                st.tail.wrapping_sub(head) <= self.cap() - need || self.is_closed()
            }) {
                continue;
            }
            let seq = self.hdr.cons.space_seq.load(Ordering::Acquire);
            self.hdr.prod.space_waiters.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            self.refresh_head(st)?;
            if self.free(st) < need && !self.is_closed() {
                let _: Wake = self
                    .hdr
                    .parker
                    .wait(&self.hdr.cons.space_seq, seq, deadline);
            }
            self.hdr.prod.space_waiters.store(0, Ordering::Relaxed);
        }
    }

    /// Makes [.., pos) visible to the consumer and wakes it if it sleeps.
    fn publish_tail(&self, st: &mut ProducerState, pos: u64) {
        st.tail = pos;
        self.hdr.prod.tail.store(pos, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.hdr.cons.data_waiters.load(Ordering::Relaxed) != 0 {
            self.hdr.prod.data_seq.fetch_add(1, Ordering::Release);
            self.hdr.parker.wake(&self.hdr.prod.data_seq, 1);
        }
        if let Some(bell) = self.bell {
            bell.ring();
        }
    }

    /// How much room a streaming producer waits for before writing more: large enough that
    /// the two sides do not ping-pong a few bytes at a time.
    fn stream_chunk(&self, remaining: u64) -> u64 {
        remaining.min((self.cap() / 8).max(1))
    }

    pub(crate) fn send(
        &self,
        st: &mut ProducerState,
        parts: &[&[u8]],
        deadline: Option<Instant>,
    ) -> Result<(), QueueError> {
        self.send_from(st, parts, deadline, false).map(|_| ())
    }

    /// `send`, except that a streamed message that runs out of time is left half sent, its
    /// progress kept in `st`, instead of closing the ring: Ok(false), and the next call with
    /// the same `parts` goes on from there. Ok(true) once the message is handed over whole.
    pub(crate) fn send_partial(
        &self,
        st: &mut ProducerState,
        parts: &[&[u8]],
        deadline: Option<Instant>,
    ) -> Result<bool, QueueError> {
        self.send_from(st, parts, deadline, true)
    }

    fn send_from(
        &self,
        st: &mut ProducerState,
        parts: &[&[u8]],
        deadline: Option<Instant>,
        resumable: bool,
    ) -> Result<bool, QueueError> {
        self.start_producer(st)?;
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if total > MAX_MESSAGE_LEN {
            return Err(QueueError::TooLarge {
                len: total,
                max: MAX_MESSAGE_LEN,
            });
        }
        if self.is_closed() {
            st.streamed = None;
            return Err(QueueError::Closed);
        }
        let (mut pos, done) = match st.streamed {
            Some(done) if resumable && done <= total => (st.tail, done),
            Some(_) => {
                return Err(corrupt(
                    "a new message was sent while a streamed one was half sent".to_string(),
                ))
            }
            None => {
                let frame = FRAME_HEADER + total;
                let first_need = if frame <= self.cap() {
                    frame
                } else {
                    FRAME_HEADER + self.stream_chunk(total)
                };
                // A timeout here has written nothing.
                self.wait_space(st, first_need, deadline)?;
                let pos = st.tail;
                self.data
                    .copy_in(pos, &((FRAME_TAG << 48) | total).to_le_bytes());
                (pos + FRAME_HEADER, 0)
            }
        };
        let mut remaining = total - done;
        let mut skip = done;
        for part in parts {
            let mut rest: &[u8] = part;
            if skip >= rest.len() as u64 {
                skip -= rest.len() as u64;
                continue;
            }
            rest = &rest[skip as usize..];
            skip = 0;
            while !rest.is_empty() {
                let free = self.cap() - (pos - st.cached_head);
                if free == 0 {
                    // Only a streamed message gets here: hand over what is written, wait.
                    self.publish_tail(st, pos);
                    if let Err(e) = self.wait_space(st, self.stream_chunk(remaining), deadline) {
                        if resumable && matches!(e, QueueError::Timeout) {
                            st.streamed = Some(total - remaining);
                            return Ok(false);
                        }
                        // The reader holds part of a frame that nothing will finish.
                        st.streamed = None;
                        self.close();
                        return Err(e);
                    }
                    continue;
                }
                let n = free.min(rest.len() as u64) as usize;
                self.data.copy_in(pos, &rest[..n]);
                pos += n as u64;
                remaining -= n as u64;
                rest = &rest[n..];
            }
        }
        self.publish_tail(st, pos);
        st.streamed = None;
        Ok(true)
    }

    // ---- consumer side ----

    fn start_consumer(&self, st: &mut ConsumerState) -> Result<(), QueueError> {
        if !st.started {
            let head = self.hdr.cons.head.load(Ordering::Acquire);
            let tail = self.hdr.prod.tail.load(Ordering::Acquire);
            if head > tail || tail - head > self.cap() || head > MAX_START_POSITION {
                return Err(corrupt(format!(
                    "head {head}, tail {tail}, capacity {}",
                    self.cap()
                )));
            }
            st.started = true;
            st.head = head;
            st.published_head = head;
            st.cached_tail = tail;
        }
        Ok(())
    }

    fn refresh_tail(&self, st: &mut ConsumerState) -> Result<(), QueueError> {
        let tail = self.hdr.prod.tail.load(Ordering::Acquire);
        if tail < st.cached_tail || tail - st.head > self.cap() {
            return Err(corrupt(format!(
                "the writer's position {tail} is outside [{}, {}]",
                st.cached_tail,
                st.head.saturating_add(self.cap())
            )));
        }
        st.cached_tail = tail;
        Ok(())
    }

    /// Gives consumed bytes back to the producer and wakes it if it sleeps.
    fn publish_head(&self, st: &mut ConsumerState) {
        if st.head == st.published_head {
            return;
        }
        st.published_head = st.head;
        self.hdr.cons.head.store(st.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.hdr.prod.space_waiters.load(Ordering::Relaxed) != 0 {
            self.hdr.cons.space_seq.fetch_add(1, Ordering::Release);
            self.hdr.parker.wake(&self.hdr.cons.space_seq, 1);
        }
    }

    /// Waits until `need` bytes are readable. Closed only once fewer than `need` remain.
    fn wait_data(
        &self,
        st: &mut ConsumerState,
        need: u64,
        deadline: Option<Instant>,
    ) -> Result<(), QueueError> {
        loop {
            if st.cached_tail - st.head >= need {
                return Ok(());
            }
            self.refresh_tail(st)?;
            if st.cached_tail - st.head >= need {
                return Ok(());
            }
            if self.is_closed() {
                // `closed` was set after the producer's last publish: look once more.
                self.refresh_tail(st)?;
                if st.cached_tail - st.head >= need {
                    return Ok(());
                }
                return Err(QueueError::Closed);
            }
            if expired(deadline) {
                return Err(QueueError::Timeout);
            }
            if self.spin_until(|| {
                let tail = self.hdr.prod.tail.load(Ordering::Relaxed);
                tail.wrapping_sub(st.head) >= need || self.is_closed()
            }) {
                continue;
            }
            let seq = self.hdr.prod.data_seq.load(Ordering::Acquire);
            self.hdr.cons.data_waiters.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            self.refresh_tail(st)?;
            if st.cached_tail - st.head < need && !self.is_closed() {
                let _: Wake = self.hdr.parker.wait(&self.hdr.prod.data_seq, seq, deadline);
            }
            self.hdr.cons.data_waiters.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn recv(
        &self,
        st: &mut ConsumerState,
        out: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<(), QueueError> {
        self.start_consumer(st)?;
        out.clear();
        if st.remaining.is_some() {
            std::mem::swap(out, &mut st.stash);
        }
        match self.recv_frame(st, out, deadline) {
            Ok(()) => Ok(()),
            Err(QueueError::Timeout) => {
                if st.remaining.is_some() {
                    std::mem::swap(out, &mut st.stash);
                }
                out.clear();
                Err(QueueError::Timeout)
            }
            Err(e) => {
                // Closed or corrupt halfway through: the message is lost.
                st.remaining = None;
                st.stash = Vec::new();
                out.clear();
                Err(e)
            }
        }
    }

    fn recv_frame(
        &self,
        st: &mut ConsumerState,
        out: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<(), QueueError> {
        loop {
            let remaining = match st.remaining {
                Some(r) => r,
                None => {
                    self.wait_data(st, FRAME_HEADER, deadline)?;
                    let mut raw = [0u8; FRAME_HEADER as usize];
                    // SAFETY: `raw` has room for FRAME_HEADER bytes.
                    unsafe {
                        self.data
                            .copy_out(st.head, raw.as_mut_ptr(), FRAME_HEADER as usize)
                    };
                    let word = u64::from_le_bytes(raw);
                    if word >> 48 != FRAME_TAG {
                        return Err(corrupt(format!(
                            "frame header {word:#018x} at stream position {} lacks the frame tag",
                            st.head
                        )));
                    }
                    let len = word & MAX_MESSAGE_LEN;
                    st.head += FRAME_HEADER;
                    st.remaining = Some(len);
                    // Bounded by `cap`: a garbage length must not reserve terabytes up front.
                    out.reserve(len.min(self.cap()) as usize);
                    len
                }
            };
            if remaining == 0 {
                st.remaining = None;
                self.publish_head(st);
                return Ok(());
            }
            let avail = st.cached_tail - st.head;
            if avail == 0 {
                // Give the room back before sleeping: a streaming producer waits for it.
                self.publish_head(st);
                self.wait_data(st, 1, deadline)?;
                continue;
            }
            let n = avail.min(remaining) as usize;
            out.reserve(n);
            // SAFETY: `reserve(n)` made room for `n` bytes after `len`, which copy_out fills
            // before `set_len` exposes them.
            unsafe {
                self.data
                    .copy_out(st.head, out.as_mut_ptr().add(out.len()), n);
                out.set_len(out.len() + n);
            }
            st.head += n as u64;
            st.remaining = Some(remaining - n as u64);
        }
    }
}

/// A counter that many producers ring and one consumer sleeps on; see NOTE [Ring protocol].
#[repr(C)]
pub(crate) struct DoorbellWord {
    pub(crate) value: AtomicU32,
    pub(crate) sleepers: AtomicU32,
    pub(crate) parker: Parker,
}

impl DoorbellWord {
    pub(crate) fn initialize(&self) {
        self.value.store(0, Ordering::Relaxed);
        self.sleepers.store(0, Ordering::Release);
    }

    pub(crate) fn ring(&self) {
        self.value.fetch_add(1, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.parker.wake(&self.value, i32::MAX);
        }
    }

    pub(crate) fn current(&self) -> u32 {
        self.value.load(Ordering::Acquire)
    }

    /// True once the value differs from `seen`; false at `deadline`.
    pub(crate) fn wait(&self, seen: u32, deadline: Option<Instant>) -> bool {
        loop {
            if self.value.load(Ordering::Acquire) != seen {
                return true;
            }
            if expired(deadline) {
                return false;
            }
            self.sleepers.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if self.value.load(Ordering::Acquire) == seen {
                let _: Wake = self.parker.wait(&self.value, seen, deadline);
            }
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Run with: RUSTFLAGS="--cfg loom" cargo test -p rloader-queue --release loom
    use super::*;
    use loom::sync::Arc;

    struct Model {
        hdr: RingHeader,
        data: DataBuf,
        bell: DoorbellWord,
    }

    impl Model {
        fn new(cap: usize) -> Arc<Model> {
            let z32 = || AtomicU32::new(0);
            let z64 = || AtomicU64::new(0);
            let hdr = RingHeader {
                meta: MetaLine {
                    magic: z64(),
                    version: z32(),
                    header_len: z32(),
                    capacity: z64(),
                    closed: z32(),
                },
                prod: ProducerLine {
                    tail: z64(),
                    data_seq: z32(),
                    space_waiters: z32(),
                },
                cons: ConsumerLine {
                    head: z64(),
                    space_seq: z32(),
                    data_waiters: z32(),
                },
                parker: Parker::new(),
            };
            hdr.initialize(cap as u64);
            Arc::new(Model {
                hdr,
                data: DataBuf::new(cap),
                bell: DoorbellWord {
                    value: z32(),
                    sleepers: z32(),
                    parker: Parker::new(),
                },
            })
        }

        fn core(&self) -> RingCore<'_> {
            RingCore {
                hdr: &self.hdr,
                data: &self.data,
                bell: None,
            }
        }
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(f);
    }

    /// Two messages that cannot both fit (the producer must sleep for room), then one
    /// larger than the ring (streamed): content, order, and no lost wake-up either way.
    #[test]
    fn loom_spsc_wrap_and_stream() {
        model(|| {
            let m = Model::new(16);
            let producer = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    let mut st = ProducerState::default();
                    let core = m.core();
                    core.send(&mut st, &[&[1, 2, 3]], None).unwrap();
                    core.send(&mut st, &[&[4], &[5, 6]], None).unwrap();
                    core.send(&mut st, &[&[7; 20]], None).unwrap();
                })
            };
            let mut st = ConsumerState::default();
            let mut out = Vec::new();
            let core = m.core();
            core.recv(&mut st, &mut out, None).unwrap();
            assert_eq!(out, [1, 2, 3]);
            core.recv(&mut st, &mut out, None).unwrap();
            assert_eq!(out, [4, 5, 6]);
            core.recv(&mut st, &mut out, None).unwrap();
            assert_eq!(out, [7; 20]);
            producer.join().unwrap();
        });
    }

    /// A close from the producer after a send: the consumer drains, then sees Closed; a
    /// consumer asleep when the close lands is woken.
    #[test]
    fn loom_close_wakes_and_drains() {
        model(|| {
            let m = Model::new(16);
            let producer = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    let mut st = ProducerState::default();
                    m.core().send(&mut st, &[&[9, 9]], None).unwrap();
                    m.core().close();
                })
            };
            let mut st = ConsumerState::default();
            let mut out = Vec::new();
            m.core().recv(&mut st, &mut out, None).unwrap();
            assert_eq!(out, [9, 9]);
            assert!(matches!(
                m.core().recv(&mut st, &mut out, None),
                Err(QueueError::Closed)
            ));
            producer.join().unwrap();
        });
    }

    /// A consumer closing while the producer sleeps for room wakes it with Closed.
    #[test]
    fn loom_close_wakes_blocked_producer() {
        model(|| {
            let m = Model::new(16);
            let producer = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    let mut st = ProducerState::default();
                    // The ring holds 16: the first fills it (unless the close came first),
                    // the second waits for room that never comes.
                    let r = m.core().send(&mut st, &[&[1; 8]], None);
                    let r = r.and_then(|()| m.core().send(&mut st, &[&[2; 8]], None));
                    assert!(matches!(r, Err(QueueError::Closed)));
                })
            };
            m.core().close();
            producer.join().unwrap();
        });
    }

    /// Two ringers, one sleeper who needs to see both rings: no lost wake-up.
    #[test]
    fn loom_doorbell_two_ringers() {
        model(|| {
            let m = Model::new(16);
            let ringers: Vec<_> = (0..2)
                .map(|_| {
                    let m = m.clone();
                    loom::thread::spawn(move || m.bell.ring())
                })
                .collect();
            let mut seen = 0;
            while seen != 2 {
                assert!(m.bell.wait(seen, None));
                seen = m.bell.current();
            }
            for r in ringers {
                r.join().unwrap();
            }
        });
    }
}
