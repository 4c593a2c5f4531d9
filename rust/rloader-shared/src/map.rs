//! A mapping of `str` keys to 64-bit integers, in insertion order, with an open-addressing
//! hash table for lookups.
//!
//! Sections 0 and 1: the keys, as a list (`list.rs`: offsets, then UTF-8 bytes).
//! Section 2: the values, i64 LE, in the keys' order.
//! Section 3: the table: a power of two (≥ 2 × count, ≥ 8) of u32 LE slots, 0 for empty,
//! else 1 + the index of a key; a key's probe starts at XXH3-64 of its bytes and goes on
//! linearly.

use xxhash_rust::xxh3::xxh3_64;

use crate::layout::{self, place, u64_at, Header, Kind};
use crate::list::{ListView, ListWriter};
use crate::SharedError;

fn table_slots(count: usize) -> Result<usize, SharedError> {
    if count >= u32::MAX as usize {
        return Err(SharedError::TooLarge(format!(
            "a shared mapping holds fewer than {} keys",
            u32::MAX
        )));
    }
    Ok((2 * count).next_power_of_two().max(8))
}

/// The header (hash still zero) and region length of a mapping of `count` keys whose UTF-8
/// bytes add up to `keys_len`.
pub fn map_layout(count: usize, keys_len: usize) -> Result<(Header, usize), SharedError> {
    let slots = table_slots(count)?;
    let too_large = || SharedError::TooLarge("the mapping".into());
    let offsets = count
        .checked_add(1)
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(too_large)?;
    let values = count.checked_mul(8).ok_or_else(too_large)?;
    let (sections, len) = place(&[offsets, keys_len, values, 4 * slots])?;
    Ok((
        Header {
            kind: Kind::StrIntMap,
            param: 0,
            count: count as u64,
            hash: [0; 16],
            sections,
        },
        len,
    ))
}

fn slot(table: &[u8], s: usize) -> u32 {
    u32::from_le_bytes(table[4 * s..4 * s + 4].try_into().expect("4 bytes"))
}

/// Fills a mapping's sections, entry after entry.
pub struct MapWriter<'a> {
    keys: ListWriter<'a>,
    values: &'a mut [u8],
    table: &'a mut [u8],
    next: usize,
}

impl<'a> MapWriter<'a> {
    pub fn new(region: &'a mut [u8], header: &Header) -> MapWriter<'a> {
        let [_, _, values, table] = header.sections;
        let (lists, rest) = region.split_at_mut(values.offset);
        let (values, table) = rest.split_at_mut(table.offset - values.offset);
        let values = &mut values[..header.sections[2].len];
        let table = &mut table[..header.sections[3].len];
        table.fill(0);
        MapWriter {
            keys: ListWriter::new(lists, header),
            values,
            table,
            next: 0,
        }
    }

    /// Adds `key` (UTF-8) with `value`. A key given twice is an error.
    pub fn push(&mut self, key: &[u8], value: i64) -> Result<(), SharedError> {
        if 8 * (self.next + 1) > self.values.len() {
            return Err(SharedError::Changed);
        }
        let mask = self.table.len() / 4 - 1;
        let mut s = xxh3_64(key) as usize & mask;
        loop {
            match slot(self.table, s) {
                0 => break,
                taken if self.keys.item(taken as usize - 1) == key => {
                    return Err(SharedError::BadInput(format!(
                        "key {:?} is given twice",
                        String::from_utf8_lossy(key)
                    )))
                }
                _ => s = (s + 1) & mask,
            }
        }
        self.keys.push(key)?;
        self.table[4 * s..4 * s + 4].copy_from_slice(&(self.next as u32 + 1).to_le_bytes());
        self.values[8 * self.next..8 * self.next + 8].copy_from_slice(&value.to_le_bytes());
        self.next += 1;
        Ok(())
    }

    pub fn finish(self) -> Result<(), SharedError> {
        if 8 * self.next != self.values.len() {
            return Err(SharedError::Changed);
        }
        self.keys.finish()
    }
}

/// Reads a mapping in a region.
#[derive(Clone, Copy)]
pub struct MapView<'a> {
    pub keys: ListView<'a>,
    values: &'a [u8],
    table: &'a [u8],
}

impl<'a> MapView<'a> {
    pub fn new(region: &'a [u8], header: &Header) -> Result<MapView<'a>, SharedError> {
        if header.kind != Kind::StrIntMap {
            return Err(SharedError::Corrupt(
                "the region does not hold a mapping".into(),
            ));
        }
        let mut as_list = header.clone();
        as_list.kind = Kind::StrList;
        let keys = ListView::new(region, &as_list)?;
        let [_, _, values, table] = header.sections;
        let slots = table.len / 4;
        if values.len != 8 * keys.len()
            || table.len % 4 != 0
            || !slots.is_power_of_two()
            || slots <= keys.len()
        {
            return Err(SharedError::Corrupt(
                "the mapping's values or table do not match its keys".into(),
            ));
        }
        Ok(MapView {
            keys,
            values: layout::bytes(region, values),
            table: layout::bytes(region, table),
        })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The value of entry `i` (< len).
    pub fn value(&self, i: usize) -> i64 {
        u64_at(self.values, 8 * i) as i64
    }

    /// The index of `key`, if the mapping holds it.
    pub fn find(&self, key: &[u8]) -> Result<Option<usize>, SharedError> {
        let slots = self.table.len() / 4;
        let mask = slots - 1;
        let mut s = xxh3_64(key) as usize & mask;
        // A well-formed table has an empty slot (it is at least twice as large as the keys);
        // bounding the probe keeps a malformed one from looping.
        for _ in 0..slots {
            match slot(self.table, s) as usize {
                0 => return Ok(None),
                i if i > self.len() => {
                    return Err(SharedError::Corrupt(
                        "the mapping's table is malformed".into(),
                    ))
                }
                i if self.keys.get(i - 1)? == key => return Ok(Some(i - 1)),
                _ => s = (s + 1) & mask,
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(entries: &[(&str, i64)]) -> Result<Vec<u8>, SharedError> {
        let keys: usize = entries.iter().map(|(k, _)| k.len()).sum();
        let (h, len) = map_layout(entries.len(), keys)?;
        let mut region = vec![0u8; len];
        h.write(&mut region);
        let mut w = MapWriter::new(&mut region, &h);
        for (k, v) in entries {
            w.push(k.as_bytes(), *v)?;
        }
        w.finish()?;
        Ok(region)
    }

    #[test]
    fn lookups_find_every_key_and_only_them() {
        let names: Vec<String> = (0..1000).map(|i| format!("class_{i}")).collect();
        let entries: Vec<(&str, i64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i as i64 * 7 - 3000))
            .collect();
        let region = build(&entries).unwrap();
        let m = MapView::new(&region, &Header::parse(&region).unwrap()).unwrap();
        assert_eq!(m.len(), 1000);
        for (i, (k, v)) in entries.iter().enumerate() {
            assert_eq!(m.find(k.as_bytes()).unwrap(), Some(i));
            assert_eq!(m.value(i), *v);
            assert_eq!(m.keys.get(i).unwrap(), k.as_bytes());
        }
        for absent in ["", "class_1000", "class_", "Class_1"] {
            assert_eq!(m.find(absent.as_bytes()).unwrap(), None);
        }
    }

    #[test]
    fn an_empty_mapping_finds_nothing() {
        let region = build(&[]).unwrap();
        let m = MapView::new(&region, &Header::parse(&region).unwrap()).unwrap();
        assert!(m.is_empty());
        assert_eq!(m.find(b"x").unwrap(), None);
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let e = build(&[("a", 1), ("b", 2), ("a", 3)]).unwrap_err();
        assert!(e.to_string().contains("\"a\" is given twice"), "{e}");
    }

    #[test]
    fn a_table_full_of_strangers_ends_the_probe() {
        let mut region = build(&[("a", 1), ("b", 2)]).unwrap();
        let h = Header::parse(&region).unwrap();
        let t = h.sections[3];
        // Every slot names key 0 ("a"): a lookup of "zz" visits them all and stops.
        for s in 0..t.len / 4 {
            region[t.offset + 4 * s..t.offset + 4 * s + 4].copy_from_slice(&1u32.to_le_bytes());
        }
        let m = MapView::new(&region, &h).unwrap();
        assert_eq!(m.find(b"zz").unwrap(), None);
        region[t.offset..t.offset + 4].copy_from_slice(&99u32.to_le_bytes());
        let m = MapView::new(&region, &h).unwrap();
        let mut corrupt = false;
        for key in [&b"a"[..], b"b", b"zz", b"q"] {
            corrupt |= matches!(m.find(key), Err(SharedError::Corrupt(_)));
        }
        assert!(corrupt, "a slot naming key 99 of 2 is reported");
    }
}
