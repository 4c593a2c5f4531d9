//! What the integration tests share: a list region, its items, fresh names.
#![allow(dead_code)] // each test binary uses a part

use std::sync::Arc;

use rloader_shared::{
    list_layout, Claim, Container, ContentHasher, Expect, Family, Ident, Kind, ListView,
    ListWriter, Name, Registry, SealedRegion, WritableRegion,
};

pub fn region(items: &[&[u8]]) -> (SealedRegion, [u8; 16]) {
    let blob = items.iter().map(|i| i.len()).sum();
    let (mut h, len) = list_layout(Kind::BytesList, items.len(), blob).unwrap();
    let mut hasher = ContentHasher::new(Kind::BytesList);
    items.iter().for_each(|i| hasher.item(i));
    h.hash = hasher.finish();
    let mut w = WritableRegion::create("rloader-shared:test", len).unwrap();
    h.write(w.bytes_mut());
    let mut lw = ListWriter::new(w.bytes_mut(), &h);
    items.iter().for_each(|i| lw.push(i).unwrap());
    lw.finish().unwrap();
    (w.seal().unwrap(), h.hash)
}

pub fn items(c: &Container) -> Vec<Vec<u8>> {
    let v = ListView::new(c.bytes(), c.header()).unwrap();
    (0..v.len()).map(|i| v.get(i).unwrap().to_vec()).collect()
}

pub fn fresh_name(test: &str) -> Name {
    let nonce = Name::anonymous(Family::List).unwrap();
    Name::keyed(Family::List, test, Ident::Version(&format!("{nonce}")))
}

pub const ANY: Expect = Expect {
    family: Family::List,
    hash: None,
};

pub fn build(s: &'static Registry, name: &Name, data: &[&[u8]]) -> Arc<Container> {
    match s.claim(name, ANY).unwrap() {
        Claim::Build(b) => b.serve(region(data).0).unwrap(),
        Claim::Wait(_) => panic!("{name} is served already"),
    }
}
