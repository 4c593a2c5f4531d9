//! A list of byte strings (`str` as UTF-8, or `bytes`), in one of two encodings, chosen when it
//! is built from its items' lengths ([`ListPlanner`]):
//!
//! - **offsets** (`param` 0): section 0 holds `count + 1` offsets (u64 LE, the first 0), section
//!   1 the items end to end: item `i` is `blob[offsets[i]..offsets[i+1]]`. Reading an item
//!   touches two places: its offsets, then its bytes.
//! - **slots** (`param` = the slot width W, 24 ≤ W ≤ 128, a multiple of 8): section 0 holds one
//!   W-byte slot per item. An item shorter than W is inline: byte 0 is its length, its bytes
//!   follow. A longer one is in section 1: its slot's byte 0 is 0xFF, bytes 8..16 and 16..24
//!   its offset and length there (u64 LE). Reading an inline item touches one place, whose
//!   address is `i × W`: a random read costs one memory latency instead of two, and a batch
//!   read can prefetch every slot before reading any. Chosen when 90% of the items fit their
//!   slots and it takes at most 10% more memory than offsets (file paths of similar lengths
//!   take less).

use crate::layout::{self, place, u64_at, Header, Kind, Section};
use crate::SharedError;

/// The widths a slot may have.
const WIDTHS: std::ops::RangeInclusive<usize> = 24..=128;
const OUTSIDE: u8 = 0xFF;

/// Counts a list's items by length, to choose its encoding.
#[derive(Clone, Debug)]
pub struct ListPlanner {
    count: usize,
    blob: usize,
    /// How many items have each length up to the widest slot.
    short: Vec<usize>,
}

impl Default for ListPlanner {
    fn default() -> Self {
        ListPlanner {
            count: 0,
            blob: 0,
            short: vec![0; *WIDTHS.end()],
        }
    }
}

impl ListPlanner {
    pub fn new() -> ListPlanner {
        ListPlanner::default()
    }

    #[inline]
    pub fn add(&mut self, len: usize) {
        self.count += 1;
        self.blob += len;
        if let Some(n) = self.short.get_mut(len) {
            *n += 1;
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes a slotted list of width `w` takes: its slots and the items that do not fit them.
    fn slotted_size(&self, w: usize) -> Option<usize> {
        let inline: usize = (0..w).map(|l| l * self.short[l]).sum();
        self.count.checked_mul(w)?.checked_add(self.blob - inline)
    }

    /// The slot width to use, or 0 for offsets: the width that takes least memory among those
    /// that hold at least 90% of the items inline, if it takes at most 10% more than offsets.
    fn width(&self) -> usize {
        let offsets = 8 * (self.count + 1) + self.blob;
        WIDTHS
            .step_by(8)
            .filter(|&w| 10 * self.short[..w].iter().sum::<usize>() >= 9 * self.count)
            .filter_map(|w| Some((self.slotted_size(w)?, w)))
            .min()
            .filter(|&(size, _)| size <= offsets + offsets / 10)
            .map_or(0, |(_, w)| w)
    }

    /// The header (its hash still zero) and region length of the list counted.
    pub fn layout(&self, kind: Kind) -> Result<(Header, usize), SharedError> {
        self.layout_with(kind, self.width())
    }

    fn layout_with(&self, kind: Kind, width: usize) -> Result<(Header, usize), SharedError> {
        assert!(matches!(kind, Kind::StrList | Kind::BytesList));
        let too_large = || SharedError::TooLarge("the list".into());
        let lens = if width == 0 {
            let offsets = self
                .count
                .checked_add(1)
                .and_then(|n| n.checked_mul(8))
                .ok_or_else(too_large)?;
            [offsets, self.blob]
        } else {
            let slots = self.count.checked_mul(width).ok_or_else(too_large)?;
            let inline: usize = (0..width).map(|l| l * self.short[l]).sum();
            [slots, self.blob - inline]
        };
        let (sections, len) = place(&lens)?;
        Ok((
            Header {
                kind,
                param: width as u32,
                count: self.count as u64,
                hash: [0; 16],
                sections,
            },
            len,
        ))
    }
}

/// The header (hash still zero) and region length of a list of `count` items whose bytes add
/// up to `blob_len`, in the offsets encoding.
pub fn list_layout(
    kind: Kind,
    count: usize,
    blob_len: usize,
) -> Result<(Header, usize), SharedError> {
    let planner = ListPlanner {
        count,
        blob: blob_len,
        short: vec![0; *WIDTHS.end()],
    };
    planner.layout_with(kind, 0)
}

/// Fills a list's sections, item after item.
pub struct ListWriter<'a> {
    index: &'a mut [u8],
    blob: &'a mut [u8],
    width: usize,
    count: usize,
    next: usize,
    at: usize,
}

/// The error of a second pass that does not find what the first one counted: the items changed
/// while the container was being built (another thread, or a `__del__`, edited the list).
fn changed() -> SharedError {
    SharedError::Changed
}

impl<'a> ListWriter<'a> {
    /// A writer over the sections `header` (from [`ListPlanner::layout`] or [`list_layout`])
    /// places in `region`.
    pub fn new(region: &'a mut [u8], header: &Header) -> ListWriter<'a> {
        let [index, blob, ..] = header.sections;
        let (head, rest) = region.split_at_mut(blob.offset);
        let index = &mut head[index.offset..index.end()];
        let width = header.param as usize;
        if width == 0 {
            index[..8].copy_from_slice(&0u64.to_le_bytes());
        }
        ListWriter {
            index,
            blob: &mut rest[..blob.len],
            width,
            count: header.count as usize,
            next: 0,
            at: 0,
        }
    }

    fn append_to_blob(&mut self, item: &[u8]) -> Result<usize, SharedError> {
        let start = self.at;
        let end = start + item.len();
        if end > self.blob.len() {
            return Err(changed());
        }
        self.blob[start..end].copy_from_slice(item);
        self.at = end;
        Ok(start)
    }

    pub fn push(&mut self, item: &[u8]) -> Result<(), SharedError> {
        if self.next >= self.count {
            return Err(changed());
        }
        let w = self.width;
        if w == 0 {
            self.append_to_blob(item)?;
            let slot = 8 * (self.next + 1);
            self.index[slot..slot + 8].copy_from_slice(&(self.at as u64).to_le_bytes());
        } else if item.len() < w {
            let slot = &mut self.index[self.next * w..(self.next + 1) * w];
            slot[0] = item.len() as u8;
            slot[1..1 + item.len()].copy_from_slice(item);
        } else {
            let start = self.append_to_blob(item)?;
            let slot = &mut self.index[self.next * w..(self.next + 1) * w];
            slot[0] = OUTSIDE;
            slot[8..16].copy_from_slice(&(start as u64).to_le_bytes());
            slot[16..24].copy_from_slice(&(item.len() as u64).to_le_bytes());
        }
        self.next += 1;
        Ok(())
    }

    /// Item `i`, one of those pushed so far.
    pub fn item(&self, i: usize) -> &[u8] {
        assert!(i < self.next);
        view_item(self.index, self.blob, self.width, i).expect("an item this writer wrote")
    }

    /// Checks that every item counted was written.
    pub fn finish(self) -> Result<(), SharedError> {
        if self.at != self.blob.len() || self.next != self.count {
            return Err(changed());
        }
        Ok(())
    }
}

fn outside(i: usize) -> SharedError {
    SharedError::Corrupt(format!("item {i} lies outside the list's bytes"))
}

/// Item `i` (< count) of a list whose index section is `index`, blob `blob`, slot width `w`
/// (0: offsets). Every read is bounds-checked.
#[inline]
fn view_item<'a>(
    index: &'a [u8],
    blob: &'a [u8],
    w: usize,
    i: usize,
) -> Result<&'a [u8], SharedError> {
    if w == 0 {
        let start = u64_at(index, 8 * i);
        let end = u64_at(index, 8 * i + 8);
        if start > end || end > blob.len() as u64 {
            return Err(outside(i));
        }
        return Ok(&blob[start as usize..end as usize]);
    }
    let slot = &index[i * w..(i + 1) * w];
    let len = slot[0] as usize;
    if slot[0] != OUTSIDE {
        return slot.get(1..1 + len).ok_or_else(|| outside(i));
    }
    let start = u64_at(slot, 8);
    let len = u64_at(slot, 16);
    let end = start.checked_add(len).ok_or_else(|| outside(i))?;
    if end > blob.len() as u64 {
        return Err(outside(i));
    }
    Ok(&blob[start as usize..end as usize])
}

/// Reads a list in a region.
#[derive(Clone, Copy)]
pub struct ListView<'a> {
    index: &'a [u8],
    blob: &'a [u8],
    width: usize,
    len: usize,
}

impl<'a> ListView<'a> {
    /// The list in `region`, whose checked header is `header`.
    pub fn new(region: &'a [u8], header: &Header) -> Result<ListView<'a>, SharedError> {
        if !matches!(header.kind, Kind::StrList | Kind::BytesList) {
            return Err(SharedError::Corrupt(
                "the region does not hold a list".into(),
            ));
        }
        let len = layout::to_usize(header.count, "the item count")?;
        let width = header.param as usize;
        let [index, blob, ..]: [Section; 4] = header.sections;
        if width != 0 && (!WIDTHS.contains(&width) || width % 8 != 0) {
            return Err(SharedError::Corrupt(format!(
                "a list's slots are {width} bytes wide"
            )));
        }
        let need = if width == 0 {
            len.checked_add(1).and_then(|n| n.checked_mul(8))
        } else {
            len.checked_mul(width)
        };
        if need != Some(index.len) {
            return Err(SharedError::Corrupt(format!(
                "{len} items do not fit an index of {} bytes",
                index.len
            )));
        }
        Ok(ListView {
            index: layout::bytes(region, index),
            blob: layout::bytes(region, blob),
            width,
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot width (0: the offsets encoding).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Item `i` (< len).
    #[inline]
    pub fn get(&self, i: usize) -> Result<&'a [u8], SharedError> {
        view_item(self.index, self.blob, self.width, i)
    }

    /// Items `indices` (each < len) into `out`, in order. Where each item's index entry lies
    /// is known without reading memory (its slot, or its offsets), so entries are prefetched
    /// well ahead of their reads: a batch of random items costs about one memory latency per
    /// several items rather than one or two per item.
    pub fn gather(&self, indices: &[usize], out: &mut Vec<&'a [u8]>) -> Result<(), SharedError> {
        const AHEAD: usize = 16;
        out.clear();
        out.reserve(indices.len());
        let entry = |i: usize| {
            if self.width == 0 {
                8 * i
            } else {
                i * self.width
            }
        };
        for &i in indices.iter().take(AHEAD) {
            prefetch(self.index, entry(i));
        }
        for (k, &i) in indices.iter().enumerate() {
            if let Some(&later) = indices.get(k + AHEAD) {
                prefetch(self.index, entry(later));
            }
            out.push(self.get(i)?);
        }
        Ok(())
    }
}

/// Hints that `item` (a slice of a view) will be read soon.
#[inline]
pub fn prefetch_item(item: &[u8]) {
    prefetch(item, 0);
}

/// Hints the CPU to load the cache line of `data[at]` (ignored where `at` is out of range or the
/// architecture has no stable prefetch).
#[inline]
pub(crate) fn prefetch(data: &[u8], at: usize) {
    if at < data.len() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint; the address lies inside `data`.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(at).cast());
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: a prefetch is a hint; the address lies inside `data`.
        unsafe {
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) data.as_ptr().add(at),
                            options(nostack, readonly, preserves_flags));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_with(items: &[&[u8]], width: Option<usize>) -> Vec<u8> {
        let mut p = ListPlanner::new();
        items.iter().for_each(|i| p.add(i.len()));
        let (h, len) = match width {
            None => p.layout(Kind::BytesList).unwrap(),
            Some(w) => p.layout_with(Kind::BytesList, w).unwrap(),
        };
        let mut region = vec![0u8; len];
        h.write(&mut region);
        let mut w = ListWriter::new(&mut region, &h);
        for (k, i) in items.iter().enumerate() {
            w.push(i).unwrap();
            assert_eq!(w.item(k), *i);
        }
        w.finish().unwrap();
        region
    }

    fn read_all(region: &[u8]) -> Vec<Vec<u8>> {
        let h = Header::parse(region).unwrap();
        let v = ListView::new(region, &h).unwrap();
        (0..v.len()).map(|i| v.get(i).unwrap().to_vec()).collect()
    }

    fn mixed() -> Vec<Vec<u8>> {
        let mut items: Vec<Vec<u8>> =
            vec![vec![], b"a".to_vec(), "\u{e9}t\u{e9}".as_bytes().to_vec()];
        items.extend((0..200).map(|n| vec![b'x'; n]));
        items.push(vec![7; 100_000]);
        items
    }

    #[test]
    fn items_round_trip_in_both_encodings() {
        let items = mixed();
        let refs: Vec<&[u8]> = items.iter().map(|i| i.as_slice()).collect();
        for width in [Some(0), Some(24), Some(64), Some(128), None] {
            let region = build_with(&refs, width);
            assert_eq!(read_all(&region), items, "width {width:?}");
            let h = Header::parse(&region).unwrap();
            let v = ListView::new(&region, &h).unwrap();
            let mut got = vec![];
            let idx = [202, 0, 150, 150, 3, 1];
            v.gather(&idx, &mut got).unwrap();
            let want: Vec<&[u8]> = idx.iter().map(|&i| refs[i]).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn paths_of_similar_lengths_get_slots_and_captions_offsets() {
        let paths: Vec<String> = (0..10_000)
            .map(|i| format!("/data/train/n{:08}/img_{i:09}.JPEG", i % 1000))
            .collect();
        let mut p = ListPlanner::new();
        paths.iter().for_each(|s| p.add(s.len()));
        let (h, len) = p.layout(Kind::StrList).unwrap();
        assert_eq!(h.param as usize, (paths[0].len() + 1).next_multiple_of(8));
        let offsets = list_layout(
            Kind::StrList,
            paths.len(),
            paths.iter().map(|s| s.len()).sum(),
        )
        .unwrap()
        .1;
        assert!(len <= offsets + offsets / 10, "{len} vs {offsets}");
        // Lengths spread from 10 to 1000 bytes: slots would waste memory.
        let mut p = ListPlanner::new();
        (0..10_000).for_each(|i| p.add(10 + (i * 7919) % 990));
        assert_eq!(p.layout(Kind::StrList).unwrap().0.param, 0);
        assert_eq!(ListPlanner::new().layout(Kind::StrList).unwrap().0.count, 0);
    }

    #[test]
    fn an_empty_list_has_one_offset() {
        let region = build_with(&[], Some(0));
        let h = Header::parse(&region).unwrap();
        assert_eq!(h.sections[0].len, 8);
        assert!(ListView::new(&region, &h).unwrap().is_empty());
    }

    #[test]
    fn a_writer_refuses_items_that_were_not_counted() {
        for width in [0, 32] {
            let mut p = ListPlanner::new();
            p.add(2);
            p.add(40);
            let (h, len) = p.layout_with(Kind::StrList, width).unwrap();
            let mut region = vec![0u8; len];
            let mut w = ListWriter::new(&mut region, &h);
            w.push(b"ab").unwrap();
            assert!(
                matches!(w.push(&[1; 41]), Err(SharedError::Changed)),
                "{width}"
            );
            let mut region = vec![0u8; len];
            let mut w = ListWriter::new(&mut region, &h);
            w.push(b"ab").unwrap();
            assert!(matches!(w.finish(), Err(SharedError::Changed)));
            let mut region = vec![0u8; len];
            let mut w = ListWriter::new(&mut region, &h);
            w.push(b"ab").unwrap();
            w.push(&[1; 40]).unwrap();
            assert!(matches!(w.push(b""), Err(SharedError::Changed)));
        }
    }

    #[test]
    fn corrupt_entries_are_errors_not_reads_outside() {
        let mut region = build_with(&[b"abc", b"de"], Some(0));
        let h = Header::parse(&region).unwrap();
        // Item 1 claims to end past the blob, then to end before it starts.
        let at = h.sections[0].offset + 16;
        region[at..at + 8].copy_from_slice(&1000u64.to_le_bytes());
        let v = ListView::new(&region, &h).unwrap();
        assert_eq!(v.get(0).unwrap(), b"abc");
        assert!(matches!(v.get(1), Err(SharedError::Corrupt(_))));
        region[at..at + 8].copy_from_slice(&2u64.to_le_bytes());
        let v = ListView::new(&region, &h).unwrap();
        assert!(matches!(v.get(1), Err(SharedError::Corrupt(_))));
        let mut h2 = h.clone();
        h2.count = 5;
        assert!(ListView::new(&region, &h2).is_err());
        h2.kind = Kind::Array;
        assert!(ListView::new(&region, &h2).is_err());

        // Slots: a length past the slot, an outside item past the blob, a width not allowed.
        let long = [9u8; 30];
        let mut region = build_with(&[b"abc", &long], Some(24));
        let h = Header::parse(&region).unwrap();
        let s0 = h.sections[0].offset;
        region[s0] = 30;
        let v = ListView::new(&region, &h).unwrap();
        assert!(matches!(v.get(0), Err(SharedError::Corrupt(_))));
        assert_eq!(v.get(1).unwrap(), &long);
        region[s0 + 24 + 16..s0 + 24 + 24].copy_from_slice(&u64::MAX.to_le_bytes());
        let v = ListView::new(&region, &h).unwrap();
        assert!(matches!(v.get(1), Err(SharedError::Corrupt(_))));
        let mut h3 = h.clone();
        h3.param = 20;
        assert!(ListView::new(&region, &h3).is_err());
    }
}
