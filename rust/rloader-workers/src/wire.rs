//! The pool's messages, as bytes: what the main process and its workers send each other
//! through their rings.
//!
//! NOTE [Pool protocol]: every message starts with a 16-byte header (kind: u32, worker: u32,
//! task: u64, little-endian). Main → worker: `TASK_INDICES` (u64 indices), `TASK_OBJECT` (a
//! pickled key or batch of keys; an empty payload for iterable datasets), `RESUME` (a new epoch
//! of persistent workers on an iterable dataset). Worker → main: `DATA` (a pickled batch, see
//! [`BatchMessage`]), `ERROR` (a pickled torch ExceptionWrapper), `ENDED` (the worker's
//! iterable dataset is exhausted; the answer to that task), `RESUMED`; the body of the last two
//! is the dataset's pickled state then, or nothing (NOTE [Resume]). A closed task ring tells
//! a worker to leave once it has answered what is queued. The order of tasks and answers, and
//! who gets the next task, is [`crate::Scheduler`]'s business.
//!
//! Everything here decodes what another process wrote: a decoder never panics and never
//! returns a range outside the message (or, for bytes in a batch slot, outside the slot's
//! span), whatever the bytes; a malformed message is a [`PoolError`].

use crate::slots::SLOT_SPAN;
use crate::PoolError;

/// Bytes of the header every message starts with.
pub const HEADER: usize = 16;

/// Message kinds (the header's first word).
pub mod kind {
    pub const TASK_INDICES: u32 = 1;
    pub const TASK_OBJECT: u32 = 2;
    pub const RESUME: u32 = 3;
    pub const DATA: u32 = 11;
    pub const ERROR: u32 = 12;
    pub const ENDED: u32 = 13;
    pub const RESUMED: u32 = 14;
}

/// A message's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u32,
    /// The worker that sent the message, or that the task is for.
    pub worker: usize,
    pub task: u64,
}

/// The header of a message of `kind` about `task`, from or to `worker`.
pub fn header(kind: u32, worker: usize, task: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[4..8].copy_from_slice(&(worker as u32).to_le_bytes());
    h[8..16].copy_from_slice(&task.to_le_bytes());
    h
}

/// The header of `msg`; its body is `&msg[HEADER..]`.
pub fn parse_header(msg: &[u8]) -> Result<Header, PoolError> {
    let Some(h) = msg.first_chunk::<HEADER>() else {
        return Err(PoolError::ShortHeader);
    };
    let word = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    Ok(Header {
        kind: word(0),
        worker: word(4) as usize,
        task: u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")),
    })
}

/// A batch of indices as a `TASK_INDICES` body: little-endian u64s.
pub fn index_bytes(ix: &[u64]) -> Vec<u8> {
    ix.iter().flat_map(|i| i.to_le_bytes()).collect()
}

/// The indices of a `TASK_INDICES` body (a trailing partial word is ignored).
pub fn indices(body: &[u8]) -> Vec<u64> {
    body.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Marks "none" in a DATA table: no slot, or a buffer that is not in the slot.
pub const NOWHERE: u64 = u64::MAX;

/// Bytes of a DATA table before its entries: n_buffers, pickle_len, slot.
const TABLE_HEAD: usize = 24;
/// Bytes of one buffer's entry in a DATA table: its length and its offset in the slot.
const TABLE_ENTRY: usize = 16;

/// A DATA message, ready to send without copying the batch's bytes.
///
/// Layout after the header: n_buffers u64, pickle_len u64, slot u64 (or [`NOWHERE`]), then per
/// buffer its len u64 and its offset in the slot u64 (NOWHERE: inline), then the pickle, then
/// the inline buffers back to back. Buffers in the slot were written there by the worker
/// (NOTE [Slots] in slots.rs); the message only says where.
pub struct BatchMessage<'a> {
    /// The header and the table.
    head: Vec<u8>,
    pickle: &'a [u8],
    inline: Vec<&'a [u8]>,
}

impl<'a> BatchMessage<'a> {
    /// The answer to `task` from `worker`: `pickle` and the out-of-band `buffers` it refers to,
    /// `buffers[i]` lying at offset `places[i]` of slot `slot`, or travelling inline when None.
    ///
    /// # Panics
    /// If `places` and `buffers` differ in length, a buffer is placed in a slot when `slot`
    /// is None, or the slot or a place is `usize::MAX` (which reads as [`NOWHERE`]: the message
    /// would not decode to what was meant).
    pub fn new(
        worker: usize,
        task: u64,
        slot: Option<usize>,
        pickle: &'a [u8],
        buffers: &[&'a [u8]],
        places: &[Option<usize>],
    ) -> Self {
        assert_eq!(buffers.len(), places.len(), "one place per buffer");
        assert!(
            slot.is_some() || places.iter().all(Option::is_none),
            "buffers in a slot need the slot's number"
        );
        let nowhere = Some(NOWHERE as usize);
        assert!(
            slot != nowhere && !places.contains(&nowhere),
            "usize::MAX is no slot number nor offset"
        );
        let word = |x: Option<usize>| x.map_or(NOWHERE, |x| x as u64).to_le_bytes();
        let mut head = Vec::with_capacity(HEADER + TABLE_HEAD + TABLE_ENTRY * buffers.len());
        head.extend_from_slice(&header(kind::DATA, worker, task));
        head.extend_from_slice(&(buffers.len() as u64).to_le_bytes());
        head.extend_from_slice(&(pickle.len() as u64).to_le_bytes());
        head.extend_from_slice(&word(slot));
        for (b, place) in buffers.iter().zip(places) {
            head.extend_from_slice(&(b.len() as u64).to_le_bytes());
            head.extend_from_slice(&word(*place));
        }
        let inline = buffers
            .iter()
            .zip(places)
            .filter(|(_, place)| place.is_none())
            .map(|(b, _)| *b)
            .collect();
        BatchMessage {
            head,
            pickle,
            inline,
        }
    }

    /// The message's parts, to send as one message (`Ring::send` concatenates them).
    pub fn parts(&self) -> Vec<&[u8]> {
        let mut parts = Vec::with_capacity(2 + self.inline.len());
        parts.push(self.head.as_slice());
        parts.push(self.pickle);
        parts.extend_from_slice(&self.inline);
        parts
    }
}

/// A DATA message's table, decoded: where the pickle and each buffer lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchTable {
    /// The pickle's range in the message.
    pub pickle: (usize, usize),
    /// The slot the buffers in a slot lie in (not checked against the worker's slots).
    pub slot: Option<usize>,
    /// Per buffer: (in the slot?, start, end), in the slot or in the message.
    pub buffers: Vec<(bool, usize, usize)>,
    /// The bytes of the slot the buffers use.
    pub in_slot: usize,
}

/// Decodes the table of the DATA message `msg` (header included). Every range it returns lies
/// inside `msg`, or for a buffer in the slot inside `0..SLOT_SPAN`, with start <= end.
pub fn decode_batch_table(msg: &[u8]) -> Result<BatchTable, PoolError> {
    let word = |at: usize| -> Result<u64, PoolError> {
        at.checked_add(8)
            .and_then(|end| msg.get(at..end))
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or(PoolError::TruncatedBatch)
    };
    let n = usize::try_from(word(HEADER)?).map_err(|_| PoolError::TruncatedBatch)?;
    let pickle_len = word(HEADER + 8)? as usize;
    let slot = word(HEADER + 16)?;
    let entries = HEADER + TABLE_HEAD;
    let mut at = n
        .checked_mul(TABLE_ENTRY)
        .and_then(|b| b.checked_add(entries))
        .ok_or(PoolError::TruncatedBatch)?;
    let pickle = (at, at.saturating_add(pickle_len));
    at = pickle.1;
    // No more entries than the message has room for: a garbage count allocates nothing big.
    let mut buffers = Vec::with_capacity(n.min(msg.len().saturating_sub(entries) / TABLE_ENTRY));
    let mut in_slot = 0;
    for i in 0..n {
        // Every entry before the end of `msg` is read before any past it: a table promising
        // more entries than the message holds fails here, after at most msg.len() / 16 rounds.
        let len = word(entries + TABLE_ENTRY * i)? as usize;
        let offset = word(entries + TABLE_ENTRY * i + 8)?;
        if offset == NOWHERE {
            buffers.push((false, at, at.saturating_add(len)));
            at = at.saturating_add(len);
        } else {
            let a = usize::try_from(offset).unwrap_or(usize::MAX);
            let b = a.saturating_add(len);
            if slot == NOWHERE || b > SLOT_SPAN {
                return Err(PoolError::OutsideSlot);
            }
            in_slot = in_slot.max(b);
            buffers.push((true, a, b));
        }
    }
    // The pickle and the inline buffers lie back to back from the end of the table; `at` is
    // where the last of them ends (saturated: past any message).
    if at > msg.len() {
        return Err(PoolError::TruncatedBatch);
    }
    Ok(BatchTable {
        pickle,
        slot: (slot != NOWHERE).then(|| usize::try_from(slot).unwrap_or(usize::MAX)),
        buffers,
        in_slot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn concat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn header_round_trips() {
        let h = header(kind::DATA, 7, 1 << 40);
        assert_eq!(
            parse_header(&h).unwrap(),
            Header {
                kind: kind::DATA,
                worker: 7,
                task: 1 << 40
            }
        );
        let mut msg = h.to_vec();
        msg.extend_from_slice(b"body");
        assert_eq!(parse_header(&msg).unwrap().task, 1 << 40);
        assert!(matches!(
            parse_header(&h[..HEADER - 1]),
            Err(PoolError::ShortHeader)
        ));
        assert!(matches!(parse_header(&[]), Err(PoolError::ShortHeader)));
    }

    #[test]
    fn indices_round_trip() {
        let ix = [0, 1, u64::MAX, 1 << 33];
        assert_eq!(indices(&index_bytes(&ix)), ix);
        assert_eq!(indices(&[]), Vec::<u64>::new());
        let mut odd = index_bytes(&[5]);
        odd.push(9);
        assert_eq!(indices(&odd), [5]);
    }

    #[test]
    fn a_batch_with_no_buffers() {
        let m = BatchMessage::new(0, 3, None, b"pickle", &[], &[]);
        let msg = concat(&m.parts());
        assert_eq!(parse_header(&msg).unwrap().kind, kind::DATA);
        let t = decode_batch_table(&msg).unwrap();
        assert_eq!(&msg[t.pickle.0..t.pickle.1], b"pickle");
        assert_eq!(t.slot, None);
        assert!(t.buffers.is_empty());
        assert_eq!(t.in_slot, 0);
    }

    #[test]
    fn buffers_inline_and_in_the_slot() {
        let (a, b, c) = (&[1u8; 10][..], &[2u8; 100][..], &[3u8; 7][..]);
        let places = [None, Some(128), None];
        let m = BatchMessage::new(2, 9, Some(4), b"xyz", &[a, b, c], &places);
        let msg = concat(&m.parts());
        let t = decode_batch_table(&msg).unwrap();
        assert_eq!(t.slot, Some(4));
        assert_eq!(&msg[t.pickle.0..t.pickle.1], b"xyz");
        assert_eq!(t.buffers[1], (true, 128, 228));
        assert_eq!(t.in_slot, 228);
        let (_, s, e) = t.buffers[0];
        assert_eq!(&msg[s..e], a);
        let (_, s, e) = t.buffers[2];
        assert_eq!(&msg[s..e], c);
        assert_eq!(e, msg.len(), "nothing after the last inline buffer");
    }

    #[test]
    fn bytes_in_a_slot_without_a_slot_are_refused() {
        let mut msg = concat(&BatchMessage::new(0, 0, Some(1), b"", &[b"ab"], &[Some(0)]).parts());
        msg[HEADER + 16..HEADER + 24].copy_from_slice(&NOWHERE.to_le_bytes());
        assert!(matches!(
            decode_batch_table(&msg),
            Err(PoolError::OutsideSlot)
        ));
    }

    #[test]
    #[should_panic(expected = "usize::MAX is no slot number nor offset")]
    fn a_slot_numbered_like_nowhere_is_refused_when_encoding() {
        // Before: encoded as NOWHERE, the message decoded as a batch with no slot (and
        // OutsideSlot for its buffers): encode-then-decode did not give back what was encoded.
        BatchMessage::new(0, 0, Some(usize::MAX), b"", &[b"ab"], &[Some(0)]);
    }

    #[test]
    #[should_panic(expected = "usize::MAX is no slot number nor offset")]
    fn an_offset_like_nowhere_is_refused_when_encoding() {
        // Before: it decoded as an inline buffer, which the message did not carry (a
        // TruncatedBatch for a valid batch).
        BatchMessage::new(0, 0, Some(1), b"", &[b"ab"], &[Some(usize::MAX)]);
    }

    #[test]
    fn bytes_past_the_slots_span_are_refused() {
        let len = 64usize;
        for offset in [SLOT_SPAN - len + 1, SLOT_SPAN, usize::MAX - 3] {
            let mut msg =
                concat(&BatchMessage::new(0, 0, Some(0), b"", &[&[0u8; 64]], &[Some(0)]).parts());
            let at = HEADER + TABLE_HEAD + 8;
            msg[at..at + 8].copy_from_slice(&(offset as u64).to_le_bytes());
            assert!(
                matches!(decode_batch_table(&msg), Err(PoolError::OutsideSlot)),
                "{offset}"
            );
        }
    }

    #[test]
    fn a_huge_buffer_count_is_truncation_not_a_hang_or_an_allocation() {
        let mut msg = concat(&BatchMessage::new(0, 0, None, b"p", &[], &[]).parts());
        msg[HEADER..HEADER + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode_batch_table(&msg),
            Err(PoolError::TruncatedBatch)
        ));
        msg[HEADER..HEADER + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(
            decode_batch_table(&msg),
            Err(PoolError::TruncatedBatch)
        ));
    }

    /// Pickle bytes, buffers (each in the slot at an offset, or inline), and a slot number.
    type Batch = (Vec<u8>, Vec<(Vec<u8>, Option<usize>)>, usize);

    fn batch() -> impl Strategy<Value = Batch> {
        (
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 0..48),
                    proptest::option::of(0..SLOT_SPAN - 64),
                ),
                0..8,
            ),
            0usize..16,
        )
    }

    /// Checks the promise of `decode_batch_table` on any input.
    fn check_in_bounds(msg: &[u8], t: &BatchTable) {
        assert!(t.pickle.0 <= t.pickle.1 && t.pickle.1 <= msg.len());
        for &(in_slot, a, b) in &t.buffers {
            assert!(a <= b);
            if in_slot {
                assert!(b <= SLOT_SPAN && b <= t.in_slot);
                assert!(t.slot.is_some());
            } else {
                assert!(b <= msg.len());
            }
        }
        assert!(t.in_slot <= SLOT_SPAN);
    }

    proptest! {
        #[test]
        fn batches_round_trip((pickle, buffers, slot) in batch()) {
            let bytes: Vec<&[u8]> = buffers.iter().map(|(b, _)| b.as_slice()).collect();
            let places: Vec<Option<usize>> = buffers.iter().map(|(_, p)| *p).collect();
            let slot = places.iter().any(Option::is_some).then_some(slot);
            let msg = concat(&BatchMessage::new(1, 2, slot, &pickle, &bytes, &places).parts());
            let t = decode_batch_table(&msg).unwrap();
            check_in_bounds(&msg, &t);
            prop_assert_eq!(&msg[t.pickle.0..t.pickle.1], pickle.as_slice());
            prop_assert_eq!(t.slot, slot);
            prop_assert_eq!(t.buffers.len(), buffers.len());
            for (&(in_slot, a, b), (bytes, place)) in t.buffers.iter().zip(&buffers) {
                prop_assert_eq!(in_slot, place.is_some());
                match place {
                    Some(at) => prop_assert_eq!((a, b), (*at, at + bytes.len())),
                    None => prop_assert_eq!(&msg[a..b], bytes.as_slice()),
                }
            }
        }

        #[test]
        fn every_truncation_of_a_batch_is_refused((pickle, buffers, slot) in batch(), cut in any::<prop::sample::Index>()) {
            let bytes: Vec<&[u8]> = buffers.iter().map(|(b, _)| b.as_slice()).collect();
            let places: Vec<Option<usize>> = buffers.iter().map(|(_, p)| *p).collect();
            let slot = places.iter().any(Option::is_some).then_some(slot);
            let msg = concat(&BatchMessage::new(1, 2, slot, &pickle, &bytes, &places).parts());
            let cut = cut.index(msg.len());
            prop_assert!(decode_batch_table(&msg[..cut]).is_err(), "cut at {}", cut);
        }

        #[test]
        fn garbage_never_panics_nor_points_outside(msg in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(t) = decode_batch_table(&msg) {
                check_in_bounds(&msg, &t);
            }
            let _ = parse_header(&msg);
        }

        #[test]
        fn garbage_tables_never_panic_nor_point_outside(
            n in prop_oneof![0u64..12, any::<u64>()],
            pickle_len in prop_oneof![0u64..64, any::<u64>()],
            slot in prop_oneof![Just(NOWHERE), 0u64..8, any::<u64>()],
            entries in proptest::collection::vec(
                (prop_oneof![0u64..64, any::<u64>()],
                 prop_oneof![Just(NOWHERE), 0u64..4096, (SLOT_SPAN as u64 - 64)..(SLOT_SPAN as u64 + 64), any::<u64>()]),
                0..12),
            tail in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            // Well-formed enough to get past the first words, with hostile numbers.
            let mut msg = header(kind::DATA, 0, 0).to_vec();
            for w in [n, pickle_len, slot] {
                msg.extend_from_slice(&w.to_le_bytes());
            }
            for (len, offset) in entries {
                msg.extend_from_slice(&len.to_le_bytes());
                msg.extend_from_slice(&offset.to_le_bytes());
            }
            msg.extend_from_slice(&tail);
            if let Ok(t) = decode_batch_table(&msg) {
                check_in_bounds(&msg, &t);
            }
        }
    }
}
