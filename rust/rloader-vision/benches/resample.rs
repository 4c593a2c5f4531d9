//! The resizes a torchvision ImageFolder pipeline runs on an ImageNet-sized picture (500x375
//! RGB): `Resize(256)` (short side to 256, bilinear), `RandomResizedCrop(224)` (a crop resized
//! to 224x224, bilinear, fused), `Resize((224, 224))`, and the other filters at the same size.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rloader_vision::geometry::crop_resize;
use rloader_vision::image::Image;
use rloader_vision::resample::{resize, Filter};

/// A photo-like 500x375 RGB picture: gradients plus deterministic noise.
fn picture(w: usize, h: usize) -> Image {
    let mut state = 0x2545_f491_u32;
    let mut data = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let base = (x * 255 / w + y * 255 / h + c * 60) / 2;
                data.push((base + (state % 24) as usize).min(255) as u8);
            }
        }
    }
    Image::from_vec(w, h, 3, data)
}

fn resizes(c: &mut Criterion) {
    let img = picture(500, 375);
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
        picture(500, 375).data.iter().step_by(3).copied().collect(),
    );
    c.bench_function("500x375 L resize 224x224 bilinear", |b| {
        b.iter(|| resize(black_box(&gray), 224, 224, Filter::Bilinear, full))
    });
}

criterion_group!(benches, resizes);
criterion_main!(benches);
