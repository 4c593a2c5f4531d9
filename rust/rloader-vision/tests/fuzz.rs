//! Fuzzing the decode entry point: mutated JPEG and PNG files through `probe`, `decode` (whole,
//! and a random region at a random DCT scale) and `plan::run` with random steps.
//!
//! The seeds are small valid files made here (JPEG: every subsampling, progressive, gray,
//! CMYK, YCCK; PNG: RGB, RGBA, L, LA, palette, of 16 bits and of 1, 2, 4, with tRNS), each mutated by bit flips, overwritten runs, truncation,
//! insertions, duplicated spans and splices of two seeds. No input may panic or crash; a
//! file either decodes or is reported as not handled (the caller gives it to Pillow).
//! Decodes are skipped above 4 megapixels (a mutated header may claim 65535x65535; the caller
//! applies Pillow's decompression-bomb limit before decoding).
//!
//! `cargo test` runs a short fixed-seed round; the long one is `make fuzz`:
//! `RLOADER_FUZZ_INPUTS=100000 cargo test --release -p rloader-vision --test fuzz -- --ignored
//! --nocapture` (`RLOADER_FUZZ_SEED` picks the seed; the run prints the one it used).

use std::collections::BTreeMap;
use std::time::Instant;

use rloader_vision::decode::{self, Region};
use rloader_vision::plan::{self, Output, Step};
use rloader_vision::resample::Filter;
use rloader_vision::tensor::Table;
use turbojpeg::Subsamp;

mod common;
use common::Encoding;

#[path = "../../test-support/fuzz_rng.rs"]
mod fuzz_rng;
use fuzz_rng::Rng;

const MAX_PIXELS: usize = 1 << 22;

fn picture(rng: &mut Rng, width: usize, height: usize, bands: usize) -> Vec<u8> {
    let base = rng.bytes(bands);
    (0..width * height * bands)
        .map(|i| {
            base[i % bands]
                .wrapping_add(((i / bands) % width) as u8)
                .wrapping_add(rng.below(16) as u8)
        })
        .collect()
}

fn seeds(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let subsamps = [
        Subsamp::None,
        Subsamp::Sub2x1,
        Subsamp::Sub2x2,
        Subsamp::Sub1x2,
        Subsamp::Sub4x1,
        Subsamp::Gray,
    ];
    for (i, &subsamp) in subsamps.iter().enumerate() {
        for progressive in [false, true] {
            let (w, h) = (5 + 7 * i, 3 + 11 * i);
            let pixels = picture(rng, w, h, 3);
            let quality = 50 + 8 * i as i32;
            out.push(common::jpeg(
                &pixels,
                w,
                h,
                Encoding {
                    quality,
                    subsamp,
                    progressive,
                },
            ));
        }
    }
    let colors = [
        (png::ColorType::Rgb, 3),
        (png::ColorType::Rgba, 4),
        (png::ColorType::Grayscale, 1),
        (png::ColorType::GrayscaleAlpha, 2),
        (png::ColorType::Indexed, 1),
    ];
    for (i, &(color, bands)) in colors.iter().enumerate() {
        let (w, h) = (3 + 9 * i, 4 + 5 * i);
        let mut file = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut file, w as u32, h as u32);
            enc.set_color(color);
            enc.set_depth(png::BitDepth::Eight);
            if color == png::ColorType::Indexed {
                enc.set_palette(rng.bytes(3 * 256));
            }
            let mut writer = enc.write_header().unwrap();
            writer.write_image_data(&picture(rng, w, h, bands)).unwrap();
        }
        out.push(file);
    }
    out.extend(cmyk_seeds(rng));
    out.extend(depth_seeds(rng));
    out
}

/// Four-component JPEGs: YCCK and plain CMYK, baseline and progressive.
fn cmyk_seeds(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, (plain_cmyk, progressive)) in [(false, false), (true, true)].into_iter().enumerate() {
        let (w, h) = (6 + 9 * i, 5 + 4 * i);
        let how = Encoding {
            quality: 70,
            subsamp: Subsamp::Sub2x2,
            progressive,
        };
        let pixels = picture(rng, w, h, 4);
        out.push(common::cmyk_jpeg(&pixels, w, h, how, plain_cmyk));
    }
    out
}

/// PNGs of 16 bits (every color type that has them) and of 1, 2 and 4 (gray, palette), some
/// with a tRNS chunk of the kinds decoded here.
fn depth_seeds(rng: &mut Rng) -> Vec<Vec<u8>> {
    use png::{BitDepth, ColorType};
    let kinds: [(ColorType, BitDepth, Option<&[u8]>); 9] = [
        (ColorType::Grayscale, BitDepth::Sixteen, Some(&[1, 0])),
        (ColorType::GrayscaleAlpha, BitDepth::Sixteen, None),
        (ColorType::Rgb, BitDepth::Sixteen, Some(&[0, 1, 0, 2, 0, 3])),
        (ColorType::Rgba, BitDepth::Sixteen, None),
        (ColorType::Grayscale, BitDepth::One, None),
        (ColorType::Grayscale, BitDepth::Two, Some(&[0, 1])),
        (ColorType::Grayscale, BitDepth::Four, None),
        (ColorType::Indexed, BitDepth::Two, Some(&[255, 0])),
        (ColorType::Indexed, BitDepth::Four, None),
    ];
    let mut out = Vec::new();
    for (i, (color, depth, trns)) in kinds.into_iter().enumerate() {
        let (w, h) = (2 + 5 * i, 3 + 2 * i);
        let row_bytes = (w * color.samples() * depth as usize).div_ceil(8);
        let mut file = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut file, w as u32, h as u32);
            enc.set_color(color);
            enc.set_depth(depth);
            if color == ColorType::Indexed {
                enc.set_palette(rng.bytes(3 << depth as usize));
            }
            if let Some(trns) = trns {
                enc.set_trns(trns);
            }
            let mut writer = enc.write_header().unwrap();
            writer.write_image_data(&rng.bytes(row_bytes * h)).unwrap();
        }
        out.push(file);
    }
    out
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> (&'static str, Vec<u8>) {
    let mut data = seeds[rng.below(seeds.len())].clone();
    let kind = rng.pick(&[
        "none",
        "flip",
        "overwrite",
        "truncate",
        "insert",
        "duplicate",
        "splice",
        "several",
    ]);
    let rounds = match kind {
        "none" => 0, // a valid file: the steps after decoding run too
        "several" => 2 + rng.below(6),
        _ => 1,
    };
    for _ in 0..rounds {
        let len = data.len().max(1);
        let at = rng.below(len);
        match if kind == "several" {
            rng.pick(&["flip", "overwrite", "truncate", "insert", "duplicate"])
        } else {
            kind
        } {
            "flip" => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(data.len().max(1));
                    if let Some(b) = data.get_mut(i) {
                        *b ^= 1 << rng.below(8);
                    }
                }
            }
            "overwrite" => {
                let n = (1 + rng.below(16)).min(data.len().saturating_sub(at));
                let bytes = if rng.one_in(3) {
                    vec![rng.pick(&[0u8, 0xFF, 0x7F, 0x80]); n]
                } else {
                    rng.bytes(n)
                };
                data[at..at + n].copy_from_slice(&bytes);
            }
            "truncate" => data.truncate(at),
            "insert" => {
                let n = 1 + rng.below(32);
                let bytes = rng.bytes(n);
                data.splice(at..at, bytes);
            }
            "duplicate" => {
                let end = (at + 1 + rng.below(64)).min(data.len());
                let span = data[at..end].to_vec();
                let to = rng.below(data.len() + 1);
                data.splice(to..to, span);
            }
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(other.len());
                data.truncate(at);
                data.extend_from_slice(&other[cut..]);
            }
        }
    }
    (kind, data)
}

fn steps(rng: &mut Rng, width: usize, height: usize) -> Vec<Step> {
    let filters = Filter::ALL;
    let mut out = Vec::new();
    let (mut w, mut h) = (width as i64, height as i64);
    for _ in 0..rng.below(4) {
        match rng.below(4) {
            0 => {
                let (l, t) = (
                    rng.below(w as usize + 4) as i64 - 2,
                    rng.below(h as usize + 4) as i64 - 2,
                );
                let (r, b) = (
                    l + rng.below(w as usize + 3) as i64,
                    t + rng.below(h as usize + 3) as i64,
                );
                out.push(Step::Crop {
                    left: l,
                    top: t,
                    right: r,
                    bottom: b,
                });
                (w, h) = (r - l, b - t);
            }
            1 if w > 0 && h > 0 => {
                let (nw, nh) = (1 + rng.below(40), 1 + rng.below(40));
                out.push(Step::Resize {
                    width: nw,
                    height: nh,
                    filter: rng.pick(&filters),
                    bbox: [0.0, 0.0, w as f64, h as f64],
                });
                (w, h) = (nw as i64, nh as i64);
            }
            2 => out.push(Step::FlipLeftRight),
            _ => out.push(Step::FlipTopBottom),
        }
    }
    out
}

fn run(seed: u64, inputs: u64) -> BTreeMap<String, u64> {
    let mut rng = Rng::new(seed);
    let seeds = seeds(&mut rng);
    let table: Vec<u8> = (0..3 * 256)
        .flat_map(|v| (v as f32).to_ne_bytes())
        .collect();
    let mut counts = BTreeMap::new();
    let mut count = |k: String| *counts.entry(k).or_insert(0) += 1;
    for _ in 0..inputs {
        let (kind, data) = mutate(&mut rng, &seeds);
        let header = match decode::probe(&data) {
            Ok(h) => h,
            Err(_) => {
                count(format!("{kind}: not handled at probe"));
                continue;
            }
        };
        if header.width * header.height > MAX_PIXELS {
            count(format!("{kind}: over the pixel limit"));
            continue;
        }
        let whole = decode::decode(&data, &header, 1, None);
        count(format!(
            "{kind}: decode {}",
            if whole.is_ok() { "ok" } else { "failed" }
        ));
        let scale = rng.pick(&[1, 2, 4, 8]);
        let (sw, sh) = decode::scaled_size(&header, scale);
        if sw > 0 && sh > 0 {
            let x = rng.below(sw);
            let y = rng.below(sh);
            let region = Region {
                x,
                y,
                width: 1 + rng.below(sw - x),
                height: 1 + rng.below(sh - y),
            };
            let _ = decode::decode(&data, &header, scale, Some(region));
        }
        let steps = steps(&mut rng, sw, sh);
        let (ow, oh) = plan::output_size(sw, sh, &steps);
        if ow * oh > MAX_PIXELS {
            continue;
        }
        let output = if rng.one_in(2) {
            Output::Rgb
        } else {
            Output::Chw(Table {
                values: &table,
                elem: 4,
                channels: 3,
            })
        };
        let mut out = vec![0u8; ow * oh * if matches!(output, Output::Rgb) { 3 } else { 12 }];
        let _ = plan::run(&data, &header, scale, &steps, &output, &mut out);
    }
    counts
}

#[test]
fn a_short_fixed_seed_run() {
    let counts = run(0x5eed, 3_000);
    // Every seed decodes, also after the failures before it (a TurboJPEG handle that had
    // failed once misread the next file: "Bogus Huffman table definition").
    assert_eq!(counts.get("none: decode failed"), None, "{counts:?}");
    assert_eq!(counts.get("none: not handled at probe"), None, "{counts:?}");
    assert!(
        counts.get("none: decode ok").is_some_and(|&n| n > 100),
        "{counts:?}"
    );
    assert!(
        counts.keys().any(|k| k.ends_with("not handled at probe")),
        "{counts:?}"
    );
}

/// `make fuzz`: RLOADER_FUZZ_INPUTS inputs (100,000 unless set), from RLOADER_FUZZ_SEED (or the
/// clock's nanoseconds), with the outcomes counted at the end.
#[test]
#[ignore = "long: make fuzz"]
fn a_long_run() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let inputs = env("RLOADER_FUZZ_INPUTS").unwrap_or(100_000);
    let seed = env("RLOADER_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("rloader-vision fuzz: {inputs} inputs, RLOADER_FUZZ_SEED={seed}");
    let t = Instant::now();
    let counts = run(seed, inputs);
    println!("{inputs} inputs in {:.1} s:", t.elapsed().as_secs_f64());
    for (k, n) in counts {
        println!("  {k}: {n}");
    }
}
