//! One direction of one worker's channel: a ring of messages in shared memory.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::protocol::{
    ConsumerState, DataBuf, ProducerState, RingCore, RingHeader, FRAME_HEADER, HEADER_LEN,
    MIN_CAPACITY,
};
use crate::{Doorbell, QueueError, ShmRegion};

/// A single-producer single-consumer ring of variable-length messages in (part of) a
/// shared-memory region. Messages of any length: one larger than the ring is streamed
/// through it in chunks and reassembled by `recv`. The protocol is NOTE [Ring protocol] in
/// protocol.rs.
///
/// One process sends and one receives, but the handle is `Sync`: sends (and receives) from
/// several threads of one process are serialised by an in-process lock per side.
///
/// With [`Ring::with_doorbell`], every send also rings that doorbell (and so does `close`),
/// so a consumer of many rings can sleep on one doorbell.
pub struct Ring {
    region: Arc<ShmRegion>,
    offset: usize,
    hdr: NonNull<RingHeader>,
    data: DataBuf,
    doorbell: Option<Doorbell>,
    producer: Mutex<ProducerState>,
    consumer: Mutex<ConsumerState>,
}

// SAFETY: the header is atomics and the data bytes are handed between sides by the
// protocol; the mapping lives as long as the Arc<ShmRegion>; the private states are behind
// mutexes.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ring {
    /// Offsets of rings in a region must be multiples of this (a cache line).
    pub const ALIGN: usize = 64;

    /// Region bytes a ring with `capacity` data bytes takes: header + data.
    pub const fn required_len(capacity: usize) -> usize {
        HEADER_LEN + capacity
    }

    fn place(region: Arc<ShmRegion>, offset: usize, len: usize) -> Result<Ring, QueueError> {
        if offset % Self::ALIGN != 0 {
            return Err(QueueError::Misaligned {
                offset,
                align: Self::ALIGN,
            });
        }
        let min = Self::required_len(MIN_CAPACITY as usize);
        if len < min {
            return Err(QueueError::TooSmall {
                what: "a ring",
                need: min,
                got: len,
            });
        }
        let end = offset.saturating_add(len);
        if end > region.len() {
            return Err(QueueError::TooSmall {
                what: "the region holding the ring",
                need: end,
                got: region.len(),
            });
        }
        // SAFETY: offset + len is inside the mapping (checked above) and the mapping is
        // page-aligned, so the header is 64-byte aligned; the Arc keeps it mapped.
        let (hdr, data) = unsafe {
            let base = region.as_ptr().add(offset);
            (
                NonNull::new_unchecked(base.cast::<RingHeader>()),
                DataBuf::new(base.add(HEADER_LEN), len - HEADER_LEN),
            )
        };
        Ok(Ring {
            region,
            offset,
            hdr,
            data,
            doorbell: None,
            producer: Mutex::new(ProducerState::default()),
            consumer: Mutex::new(ConsumerState::default()),
        })
    }

    /// The creator: writes a fresh header for a ring in `region[offset..offset + len]`
    /// (`len - required_len(0)` data bytes). `offset` must be a multiple of [`Ring::ALIGN`].
    pub fn init(region: Arc<ShmRegion>, offset: usize, len: usize) -> Result<Ring, QueueError> {
        let ring = Ring::place(region, offset, len)?;
        ring.header().initialize((len - HEADER_LEN) as u64);
        Ok(ring)
    }

    /// A peer: uses the ring the creator placed at the same offset and length, checking its
    /// header (magic, version, capacity) so a wrong region or offset fails here, clearly.
    pub fn attach(region: Arc<ShmRegion>, offset: usize, len: usize) -> Result<Ring, QueueError> {
        let ring = Ring::place(region, offset, len)?;
        ring.header().validate((len - HEADER_LEN) as u64)?;
        Ok(ring)
    }

    /// Rings `doorbell` after every send that makes bytes visible, and on close.
    pub fn with_doorbell(mut self, doorbell: Doorbell) -> Ring {
        self.doorbell = Some(doorbell);
        self
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: points into the mapping `self.region` keeps alive; all fields are atomics.
        unsafe { self.hdr.as_ref() }
    }

    fn core(&self) -> RingCore<'_> {
        RingCore {
            hdr: self.header(),
            data: &self.data,
            bell: self.doorbell.as_ref().map(Doorbell::word),
        }
    }

    /// Sends one message, the concatenation of `parts` (a header and a payload need no
    /// copy into one buffer first). Blocks without spinning while the ring is full, up to
    /// `timeout` (`None`: forever).
    ///
    /// A message that fits in the ring is written only once there is room for all of it,
    /// so `Timeout` means nothing was sent and the call may be retried. A message larger
    /// than the ring is streamed: if the timeout (or a close) hits after part of it was
    /// handed over, the ring is closed (the reader holds half a message nothing will
    /// finish) and the error is returned; `is_closed()` then tells the two apart.
    pub fn send(&self, parts: &[&[u8]], timeout: Option<Duration>) -> Result<(), QueueError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.core().send(&mut lock(&self.producer), parts, deadline)
    }

    /// `send` for a producer that must not wait long nor lose a message larger than the
    /// ring: it hands over what it can within `timeout` and returns Ok(false) when time runs
    /// out in the middle of a streamed message, which then stays half sent (the reader waits
    /// for the rest) and the ring open; calling it again with the same `parts` goes on from
    /// where it stopped, and Ok(true) means the whole message is handed over. Until then no
    /// other message may be sent on the ring (`send` fails with `Corrupt`). A message that
    /// fits in the ring is all or nothing, as with `send`: `Timeout` means nothing was sent.
    pub fn send_partial(
        &self,
        parts: &[&[u8]],
        timeout: Option<Duration>,
    ) -> Result<bool, QueueError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.core()
            .send_partial(&mut lock(&self.producer), parts, deadline)
    }

    /// Receives the next whole message into `out` (cleared first); blocks without spinning
    /// up to `timeout` (`None`: forever). After a close, returns what was sent before it,
    /// then `Closed`. A timeout in the middle of a streamed message loses nothing: the part
    /// received is kept and the next `recv` goes on from there.
    pub fn recv(&self, out: &mut Vec<u8>, timeout: Option<Duration>) -> Result<(), QueueError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.core().recv(&mut lock(&self.consumer), out, deadline)
    }

    /// `recv` that never waits: Ok(false) when no whole message is ready. For a streamed
    /// message it takes what has arrived and returns false until the last part is in (the
    /// sender rings the doorbell for each part, so a doorbell waiter comes back for it).
    pub fn try_recv(&self, out: &mut Vec<u8>) -> Result<bool, QueueError> {
        let mut st = lock(&self.consumer);
        if !st.mid_message() && !self.core().has_data() && !self.is_closed() {
            out.clear();
            return Ok(false);
        }
        match self.core().recv(&mut st, out, Some(Instant::now())) {
            Ok(()) => Ok(true),
            Err(QueueError::Timeout) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// True when bytes are waiting to be received (a message, or more of one).
    pub fn has_message(&self) -> bool {
        self.core().has_data()
    }

    /// Either side: wakes everyone waiting on this ring (and rings the doorbell). Later
    /// sends fail with `Closed`; receives drain what was sent, then fail with `Closed`.
    pub fn close(&self) {
        self.core().close()
    }

    pub fn is_closed(&self) -> bool {
        self.core().is_closed()
    }

    /// Ring bytes a message of `len` bytes takes: the message and its length.
    pub const fn frame_len(len: usize) -> usize {
        FRAME_HEADER as usize + len
    }

    /// Data bytes; a message with `frame_len(len) <= capacity()` is never streamed.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    pub fn region(&self) -> &Arc<ShmRegion> {
        &self.region
    }

    pub fn offset(&self) -> usize {
        self.offset
    }
}
