//! Where a container's bytes lie in its region: a fixed header, then up to four sections.
//!
//! ```text
//! 0    magic "RLSHARE" + format version (1 byte)
//! 8    kind (u32 LE)             Kind: what the sections hold
//! 12   param (u32 LE)            a kind's layout parameter (a list's slot width, or 0)
//! 16   count (u64 LE)            items, entries or rows
//! 24   content hash (16 bytes)   ContentHasher over the items, whatever built them
//! 40   4 sections: (offset u64 LE, length u64 LE), unused ones (0, 0)
//! 104  zeros up to HEADER_LEN
//! ```
//!
//! Sections start on 64-byte boundaries. Every number is little-endian, so a region means the
//! same thing to every process that maps it. What each kind keeps in its sections is described
//! with its writer and view (`list.rs`, `array.rs`, `map.rs`).
//!
//! A region another process sent may be anything: [`Header::parse`] checks the header and that
//! every section lies inside the region, and the views bounds-check every read, so a malformed
//! region gives an error or wrong items, never a read outside the mapping.

use crate::SharedError;

pub const MAGIC: [u8; 7] = *b"RLSHARE";
pub const FORMAT_VERSION: u8 = 1;
pub const HEADER_LEN: usize = 128;
pub const SECTIONS: usize = 4;
const ALIGN: usize = 64;

/// What a container holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Kind {
    /// A list of `str`, kept as UTF-8 (surrogates passed through).
    StrList = 1,
    /// A list of `bytes`.
    BytesList = 2,
    /// A numeric array: raw elements, shape and a numpy dtype string.
    Array = 3,
    /// A mapping of `str` to 64-bit integers, with a hash table.
    StrIntMap = 4,
}

impl Kind {
    pub fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::StrList,
            2 => Kind::BytesList,
            3 => Kind::Array,
            4 => Kind::StrIntMap,
            _ => return None,
        })
    }

    /// The family a kind belongs to: what a name is made for (a `SharedList` finds a list of
    /// either `str` or `bytes` under its key).
    pub fn family(self) -> Family {
        match self {
            Kind::StrList | Kind::BytesList => Family::List,
            Kind::Array => Family::Array,
            Kind::StrIntMap => Family::Map,
        }
    }
}

/// The container classes, as names are made for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    List,
    Array,
    Map,
}

impl Family {
    pub fn label(self) -> &'static str {
        match self {
            Family::List => "list",
            Family::Array => "array",
            Family::Map => "map",
        }
    }
}

/// One section: `len` bytes at `offset` from the region's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Section {
    pub offset: usize,
    pub len: usize,
}

impl Section {
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// A container's header, as written or as parsed from a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// A kind's layout parameter: a list's slot width (0: offsets and bytes), else 0.
    pub param: u32,
    pub count: u64,
    pub hash: [u8; 16],
    pub sections: [Section; SECTIONS],
}

fn too_large(what: &str) -> SharedError {
    SharedError::TooLarge(what.to_owned())
}

/// Sections of the given lengths, in order, each 64-byte aligned after the header; and the
/// region's total length.
pub fn place(lens: &[usize]) -> Result<([Section; SECTIONS], usize), SharedError> {
    assert!(lens.len() <= SECTIONS);
    let mut sections = [Section::default(); SECTIONS];
    let mut at = HEADER_LEN;
    for (s, &len) in sections.iter_mut().zip(lens) {
        *s = Section { offset: at, len };
        at = at
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(ALIGN))
            .ok_or_else(|| too_large("the container"))?;
    }
    Ok((sections, at))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `v` as a usize, or the error naming `what` (a count or offset past the address space).
pub(crate) fn to_usize(v: u64, what: &str) -> Result<usize, SharedError> {
    usize::try_from(v).map_err(|_| SharedError::Corrupt(format!("{what} {v} is out of range")))
}

impl Header {
    /// Writes the header into the first `HEADER_LEN` bytes of `region`.
    pub fn write(&self, region: &mut [u8]) {
        let h = &mut region[..HEADER_LEN];
        h.fill(0);
        h[..7].copy_from_slice(&MAGIC);
        h[7] = FORMAT_VERSION;
        h[8..12].copy_from_slice(&(self.kind as u32).to_le_bytes());
        h[12..16].copy_from_slice(&self.param.to_le_bytes());
        h[16..24].copy_from_slice(&self.count.to_le_bytes());
        h[24..40].copy_from_slice(&self.hash);
        for (i, s) in self.sections.iter().enumerate() {
            let at = 40 + 16 * i;
            h[at..at + 8].copy_from_slice(&(s.offset as u64).to_le_bytes());
            h[at + 8..at + 16].copy_from_slice(&(s.len as u64).to_le_bytes());
        }
    }

    /// The header of `region`, checked: magic and version, a known kind, and every section
    /// inside the region and aligned.
    pub fn parse(region: &[u8]) -> Result<Header, SharedError> {
        let corrupt = |why: &str| SharedError::Corrupt(why.to_owned());
        if region.len() < HEADER_LEN {
            return Err(corrupt("the region is shorter than a header"));
        }
        if region[..7] != MAGIC {
            return Err(corrupt(
                "the region does not start with rloader's magic bytes",
            ));
        }
        if region[7] != FORMAT_VERSION {
            return Err(SharedError::Corrupt(format!(
                "the region has format version {}, this rloader reads version {FORMAT_VERSION} \
                 (are two rloader versions sharing a key?)",
                region[7]
            )));
        }
        let kind = Kind::from_u32(u32_at(region, 8))
            .ok_or_else(|| SharedError::Corrupt(format!("unknown kind {}", u32_at(region, 8))))?;
        let mut sections = [Section::default(); SECTIONS];
        for (i, s) in sections.iter_mut().enumerate() {
            let at = 40 + 16 * i;
            let offset = to_usize(u64_at(region, at), "a section offset")?;
            let len = to_usize(u64_at(region, at + 8), "a section length")?;
            if len > 0
                && (offset % ALIGN != 0
                    || offset < HEADER_LEN
                    || offset.checked_add(len).map_or(true, |e| e > region.len()))
            {
                return Err(SharedError::Corrupt(format!(
                    "section {i} ({len} bytes at {offset}) lies outside the region of {} bytes",
                    region.len()
                )));
            }
            *s = Section { offset, len };
        }
        Ok(Header {
            kind,
            param: u32_at(region, 12),
            count: u64_at(region, 16),
            hash: region[24..40].try_into().expect("16 bytes"),
            sections,
        })
    }
}

/// The bytes of `section` in `region` (a section [`Header::parse`] checked).
pub fn bytes(region: &[u8], section: Section) -> &[u8] {
    &region[section.offset..section.end()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> (Header, usize) {
        let (sections, len) = place(&[24, 5, 0]).unwrap();
        let h = Header {
            kind: Kind::StrList,
            param: 0,
            count: 2,
            hash: [7; 16],
            sections,
        };
        (h, len)
    }

    #[test]
    fn sections_are_aligned_after_the_header() {
        let (h, len) = header();
        assert_eq!(
            h.sections[0],
            Section {
                offset: 128,
                len: 24
            }
        );
        assert_eq!(
            h.sections[1],
            Section {
                offset: 192,
                len: 5
            }
        );
        assert_eq!(
            h.sections[2],
            Section {
                offset: 256,
                len: 0
            }
        );
        assert_eq!(len, 256);
        assert!(place(&[usize::MAX - 10]).is_err());
    }

    #[test]
    fn a_header_round_trips() {
        let (h, len) = header();
        let mut region = vec![0xAAu8; len];
        h.write(&mut region);
        assert_eq!(Header::parse(&region).unwrap(), h);
    }

    #[test]
    fn malformed_headers_are_refused() {
        let (h, len) = header();
        let mut good = vec![0u8; len];
        h.write(&mut good);
        let refused = |edit: &dyn Fn(&mut Vec<u8>), expect: &str| {
            let mut r = good.clone();
            edit(&mut r);
            let e = Header::parse(&r).unwrap_err().to_string();
            assert!(e.contains(expect), "{e}");
        };
        refused(&|r| r.truncate(100), "shorter than a header");
        refused(&|r| r[0] = b'X', "magic");
        refused(&|r| r[7] = 2, "format version 2");
        refused(&|r| r[8] = 9, "unknown kind 9");
        // Section 1 pushed past the end, then misaligned, then into the header.
        refused(
            &|r| r[56..64].copy_from_slice(&(len as u64).to_le_bytes()),
            "outside",
        );
        refused(
            &|r| r[56..64].copy_from_slice(&200u64.to_le_bytes()),
            "outside",
        );
        refused(
            &|r| r[56..64].copy_from_slice(&64u64.to_le_bytes()),
            "outside",
        );
        refused(&|r| r[64..72].copy_from_slice(&u64::MAX.to_le_bytes()), "");
    }
}
