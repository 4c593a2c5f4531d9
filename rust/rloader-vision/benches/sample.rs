//! One ImageNet-sized sample's work outside resampling: decoding a 500x375 JPEG (whole and a
//! RandomResizedCrop-sized region) and writing a 224x224 RGB image out as a normalised
//! float32 CHW tensor through its per-channel tables.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rloader_vision::decode::{self, Region};
use rloader_vision::image::Image;
use rloader_vision::tensor::{write_chw, Table};
use turbojpeg::Subsamp;

#[path = "../tests/common/mod.rs"]
mod common;
use common::Encoding;

fn sample(c: &mut Criterion) {
    let (w, h) = (500, 375);
    let pixels = common::photo(w, h);
    let how = Encoding {
        quality: 90,
        subsamp: Subsamp::Sub2x2,
        progressive: false,
    };
    let jpeg = common::jpeg(&pixels, w, h, how);
    let header = decode::probe(&jpeg).unwrap();
    let mut g = c.benchmark_group("500x375 JPEG, q90 4:2:0");
    g.bench_function("decode whole", |b| {
        b.iter(|| decode::decode(black_box(&jpeg), &header, 1, None).unwrap())
    });
    let region = Region {
        x: 90,
        y: 60,
        width: 300,
        height: 260,
    };
    g.bench_function("decode a 300x260 region", |b| {
        b.iter(|| decode::decode(black_box(&jpeg), &header, 1, Some(region)).unwrap())
    });
    g.finish();
    let img = Image::from_vec(224, 224, 3, common::photo(224, 224));
    let values: Vec<u8> = (0..3)
        .flat_map(|c| (0..256).flat_map(move |v| (v as f32 / 255.0 - c as f32).to_ne_bytes()))
        .collect();
    let table = Table {
        values: &values,
        elem: 4,
        channels: 3,
    };
    let mut out = vec![0u8; 224 * 224 * 3 * 4];
    c.bench_function("224x224 RGB to float32 CHW through tables", |b| {
        b.iter(|| write_chw(black_box(&img), &table, &mut out))
    });
}

criterion_group!(benches, sample);
criterion_main!(benches);
