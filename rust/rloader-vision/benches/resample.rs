//! The resizes a torchvision ImageFolder pipeline runs on an ImageNet-sized picture (500x375
//! RGB): `Resize(256)` (short side to 256, bilinear), `RandomResizedCrop(224)` (a crop resized
//! to 224x224, bilinear, fused), `Resize((224, 224))`, and the other filters at the same size.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rloader_vision::geometry::crop_resize;
use rloader_vision::image::Image;
use rloader_vision::resample::{resize, Filter};

#[path = "../tests/common/mod.rs"]
mod common;

fn resizes(c: &mut Criterion) {
    let img = Image::from_vec(500, 375, 3, common::photo(500, 375));
    let full = [0.0, 0.0, 500.0, 375.0];
    let mut g = c.benchmark_group("500x375 RGB");
    g.bench_function("resize 224x224 bilinear", |b| {
        b.iter(|| resize(black_box(&img), 224, 224, Filter::Bilinear, full))
    });
    g.bench_function("Resize(256): 341x256 bilinear", |b| {
        b.iter(|| resize(black_box(&img), 341, 256, Filter::Bilinear, full))
    });
    g.bench_function("crop 300x260 + resize 224x224 bilinear (fused)", |b| {
        b.iter(|| {
            crop_resize(
                black_box(&img),
                60,
                40,
                360,
                300,
                224,
                224,
                Filter::Bilinear,
            )
        })
    });
    for (name, filter) in [
        ("nearest", Filter::Nearest),
        ("box", Filter::Box),
        ("hamming", Filter::Hamming),
        ("bicubic", Filter::Bicubic),
        ("lanczos", Filter::Lanczos),
    ] {
        g.bench_function(format!("resize 224x224 {name}"), |b| {
            b.iter(|| resize(black_box(&img), 224, 224, filter, full))
        });
    }
    g.finish();

    let gray = Image::from_vec(
        500,
        375,
        1,
        common::photo(500, 375).iter().step_by(3).copied().collect(),
    );
    c.bench_function("500x375 L resize 224x224 bilinear", |b| {
        b.iter(|| resize(black_box(&gray), 224, 224, Filter::Bilinear, full))
    });
}

criterion_group!(benches, resizes);
criterion_main!(benches);
