//! What identifies a container: the hash of its content, and the name it is found by.

use xxhash_rust::xxh3::{xxh3_128, Xxh3Default};

use crate::layout::{Family, Kind};
use crate::SharedError;

/// The content hash of a container: 128-bit XXH3 over its kind, then each item as its length
/// (u64 LE) and bytes (or each value's 8 bytes, or an array's dtype, shape and elements). The
/// same items in the same order give the same hash whoever builds them, so ranks that each
/// hold the same Python list find one another's copy.
pub struct ContentHasher {
    xxh: Xxh3Default,
    buf: Vec<u8>,
}

const BUF: usize = 64 << 10;

impl ContentHasher {
    pub fn new(kind: Kind) -> ContentHasher {
        let mut h = ContentHasher {
            xxh: Xxh3Default::new(),
            buf: Vec::with_capacity(BUF),
        };
        h.raw(b"rloader-shared content v1");
        h.raw(&(kind as u32).to_le_bytes());
        h
    }

    /// Bytes as they are (no length before them). Small pieces are gathered and hashed in
    /// large ones: the streaming hasher costs a call per update.
    #[inline]
    pub fn raw(&mut self, bytes: &[u8]) {
        if self.buf.len() + bytes.len() > BUF {
            self.xxh.update(&self.buf);
            self.buf.clear();
        }
        if bytes.len() > BUF {
            self.xxh.update(bytes);
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// One item: its length, then its bytes.
    #[inline]
    pub fn item(&mut self, bytes: &[u8]) {
        self.raw(&(bytes.len() as u64).to_le_bytes());
        self.raw(bytes);
    }

    pub fn value(&mut self, v: i64) {
        self.raw(&v.to_le_bytes());
    }

    pub fn finish(mut self) -> [u8; 16] {
        self.xxh.update(&self.buf);
        self.xxh.digest128().to_le_bytes()
    }
}

/// How a keyed container is told apart from others under the same key.
#[derive(Clone, Copy, Debug)]
pub enum Ident<'a> {
    /// A version the user gives: whoever holds the key and version serves the content.
    Version(&'a str),
    /// The content hash: only the same items are found.
    Content([u8; 16]),
}

/// The name a container is found by on this node: an abstract Unix socket address (no file
/// anywhere), `rloader-shared/1/<uid>/<family>/<key, readable part>/<128-bit hash, hex>`.
/// The user id keeps users apart; the hash covers the family, the whole key and the version
/// or content hash.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Name(Vec<u8>);

/// The part of a key shown in names and memfd labels: at most 24 of its characters that are
/// ASCII letters, digits, `.`, `_` or `-`.
pub fn readable(key: &str) -> String {
    key.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .take(24)
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

impl Name {
    pub fn keyed(family: Family, key: &str, ident: Ident<'_>) -> Name {
        let mut id = Vec::new();
        id.extend_from_slice(b"rloader-shared name v1\0");
        id.extend_from_slice(family.label().as_bytes());
        id.extend_from_slice(&(key.len() as u64).to_le_bytes());
        id.extend_from_slice(key.as_bytes());
        match ident {
            Ident::Version(v) => {
                id.push(b'v');
                id.extend_from_slice(v.as_bytes());
            }
            Ident::Content(h) => {
                id.push(b'h');
                id.extend_from_slice(&h);
            }
        }
        let digest = xxh3_128(&id).to_le_bytes();
        Name::from_parts(family, &readable(key), &hex(&digest))
    }

    /// A fresh name no other container has (128 random bits), for a container built without a
    /// key, named when it is first pickled.
    pub fn anonymous(family: Family) -> Result<Name, SharedError> {
        let mut r = [0u8; 16];
        let mut got = 0;
        while got < r.len() {
            got += rustix::rand::getrandom(&mut r[got..], rustix::rand::GetRandomFlags::empty())
                .map_err(|e| SharedError::os("getrandom", e))?;
        }
        Ok(Name::from_parts(family, "-", &hex(&r)))
    }

    fn from_parts(family: Family, shown: &str, digest: &str) -> Name {
        let s = format!(
            "rloader-shared/1/{}/{}/{shown}/{digest}",
            uid(),
            family.label()
        );
        Name(s.into_bytes())
    }

    /// A name as a handle carries it (its bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Name, SharedError> {
        if !bytes.starts_with(b"rloader-shared/") || bytes.len() > 100 {
            return Err(SharedError::BadInput(
                "not the name of a shared container".into(),
            ));
        }
        Ok(Name(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "@{}", String::from_utf8_lossy(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(kind: Kind, items: &[&[u8]]) -> [u8; 16] {
        let mut h = ContentHasher::new(kind);
        for i in items {
            h.item(i);
        }
        h.finish()
    }

    #[test]
    fn the_content_hash_tells_items_apart() {
        let a = content(Kind::StrList, &[b"ab", b"c"]);
        assert_eq!(a, content(Kind::StrList, &[b"ab", b"c"]));
        assert_ne!(
            a,
            content(Kind::StrList, &[b"a", b"bc"]),
            "boundaries count"
        );
        assert_ne!(a, content(Kind::StrList, &[b"c", b"ab"]), "order counts");
        assert_ne!(a, content(Kind::BytesList, &[b"ab", b"c"]), "kind counts");
    }

    #[test]
    fn large_and_small_pieces_hash_as_one_stream() {
        let big = vec![5u8; 3 * BUF + 17];
        let mut one = ContentHasher::new(Kind::BytesList);
        one.raw(&big);
        let mut many = ContentHasher::new(Kind::BytesList);
        for chunk in big.chunks(1000) {
            many.raw(chunk);
        }
        assert_eq!(one.finish(), many.finish());
    }

    #[test]
    fn names_differ_by_family_key_and_ident() {
        let n = |f, k, i| Name::keyed(f, k, i);
        let base = n(Family::List, "paths", Ident::Version("1"));
        assert_eq!(base, n(Family::List, "paths", Ident::Version("1")));
        assert_ne!(base, n(Family::Map, "paths", Ident::Version("1")));
        assert_ne!(base, n(Family::List, "paths2", Ident::Version("1")));
        assert_ne!(base, n(Family::List, "paths", Ident::Version("2")));
        assert_ne!(base, n(Family::List, "paths", Ident::Content([0; 16])));
        let shown = String::from_utf8(base.as_bytes().to_vec()).unwrap();
        assert!(
            shown.starts_with(&format!("rloader-shared/1/{}/list/paths/", uid())),
            "{shown}"
        );
        // A long key still fits an abstract socket address (107 bytes).
        let long = n(
            Family::List,
            &"k/é".repeat(500),
            Ident::Version(&"v".repeat(500)),
        );
        assert!(long.as_bytes().len() < 100, "{}", long);
        assert_ne!(
            Name::anonymous(Family::List).unwrap(),
            Name::anonymous(Family::List).unwrap()
        );
    }
}
