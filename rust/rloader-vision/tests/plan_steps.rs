//! `plan::run` against the same steps made one at a time on the whole decode: a resize a crop
//! follows is computed as the crop's window of it, from only the part of the file that window
//! reads, and gives the same bytes. And `plan::draft`: Pillow's choice of scale, the same
//! output size, pixels close to exact.

use rloader_vision::decode::{self, Header};
use rloader_vision::geometry::{crop, flip_left_right};
use rloader_vision::image::Image;
use rloader_vision::plan::{self, Output, Step};
use rloader_vision::resample::{resize, Filter};
use rloader_vision::tensor::write_rgb;
use turbojpeg::Subsamp;

mod common;
use common::Encoding;

const FILTERS: [Filter; 6] = Filter::ALL;

/// A smooth picture with some texture, as photos are (draft's PSNR means something on it).
fn jpeg(width: usize, height: usize, subsamp: Subsamp, gray: bool) -> Vec<u8> {
    let mut pixels = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            let (fx, fy) = (x as f64 / width as f64, y as f64 / height as f64);
            let wave = ((fx * 9.0).sin() * (fy * 7.0).cos() * 60.0) as i32;
            pixels.push((100 + wave + (x % 5) as i32 * 3) as u8);
            pixels.push((fy * 200.0) as u8 + (y % 3) as u8);
            pixels.push((fx * 180.0 + 40.0) as u8);
        }
    }
    let subsamp = if gray { Subsamp::Gray } else { subsamp };
    common::jpeg(
        &pixels,
        width,
        height,
        Encoding {
            quality: 90,
            subsamp,
            progressive: false,
        },
    )
}

/// The steps one at a time, on the whole decode: what Pillow does.
fn unfused(decoded: &Image, steps: &[Step]) -> Image {
    let mut img = decoded.clone();
    for step in steps {
        img = match *step {
            Step::Crop {
                left,
                top,
                right,
                bottom,
            } => crop(&img, left, top, right, bottom),
            Step::Resize {
                width,
                height,
                filter,
                bbox,
            } => resize(&img, width, height, filter, bbox),
            Step::FlipLeftRight => {
                flip_left_right(&mut img);
                img
            }
            Step::FlipTopBottom => unimplemented!(),
        };
    }
    img
}

fn rgb(img: &Image) -> Vec<u8> {
    let mut out = vec![0u8; img.width * img.height * 3];
    write_rgb(img, &mut out);
    out
}

fn fused(data: &[u8], header: &Header, denom: usize, steps: &[Step], draft: bool) -> Vec<u8> {
    let (w, h) = decode::scaled_size(header, denom);
    let (w, h) = plan::output_size(w, h, steps);
    let mut out = vec![0u8; w * h * 3];
    let run = if draft { plan::run_draft } else { plan::run };
    run(data, header, denom, steps, &Output::Rgb, &mut out).unwrap();
    out
}

/// torchvision's Resize(short) on a `w` x `h` picture.
fn resize_short(w: usize, h: usize, short: usize, filter: Filter) -> Step {
    let (rw, rh) = if w <= h {
        (short, short * h / w)
    } else {
        (short * w / h, short)
    };
    Step::Resize {
        width: rw,
        height: rh,
        filter,
        bbox: [0.0, 0.0, w as f64, h as f64],
    }
}

fn center_crop(w: usize, h: usize, cw: i64, ch: i64) -> Step {
    // torchvision's center_crop: round((h - ch) / 2).
    let top = ((h as f64 - ch as f64) / 2.0).round() as i64;
    let left = ((w as f64 - cw as f64) / 2.0).round() as i64;
    Step::Crop {
        left,
        top,
        right: left + cw,
        bottom: top + ch,
    }
}

fn size_of(step: &Step) -> (usize, usize) {
    match *step {
        Step::Resize { width, height, .. } => (width, height),
        _ => unreachable!(),
    }
}

#[test]
fn a_resize_then_a_crop_is_the_crops_window_of_the_resize() {
    let subsamps = [Subsamp::Sub2x2, Subsamp::None, Subsamp::Sub2x1];
    let mut checked = 0;
    for (k, &(w, h)) in [
        (500, 375),
        (375, 500),
        (127, 95),
        (33, 17),
        (300, 40),
        (640, 480),
    ]
    .iter()
    .enumerate()
    {
        let gray = k == 3;
        let data = jpeg(w, h, subsamps[k % 3], gray);
        let header = decode::probe(&data).unwrap();
        // At 1/2 too, for some.
        for denom in [1, 2].into_iter().take(1 + k % 2) {
            let (sw, sh) = decode::scaled_size(&header, denom);
            let whole = decode::decode(&data, &header, denom, None).unwrap().image;
            for (f, &filter) in FILTERS.iter().enumerate() {
                let short = [160, 24, 11][(k + f) % 3].min(2 * sw.min(sh));
                let resize = resize_short(sw, sh, short, filter);
                let (rw, rh) = size_of(&resize);
                let (rw, rh) = (rw as i64, rh as i64);
                // Centre crops inside, a crop past the edges (black there), one at a corner, one
                // wholly outside (not fused: the whole resize, then black).
                let crops = [
                    center_crop(rw as usize, rh as usize, rw * 7 / 8, rh * 7 / 8),
                    center_crop(rw as usize, rh as usize, 1, 1),
                    center_crop(rw as usize, rh as usize, rw + 9, rh / 2 + 1),
                    Step::Crop {
                        left: rw - 3,
                        top: -2,
                        right: rw + 2,
                        bottom: 5,
                    },
                    Step::Crop {
                        left: rw + 1,
                        top: 0,
                        right: rw + 4,
                        bottom: 2,
                    },
                ];
                // The whole resize once (of the flipped picture too), cut by each crop.
                let resized = unfused(&whole, &[resize]);
                let flipped = unfused(&whole, &[Step::FlipLeftRight, resize]);
                for c in crops {
                    // Leading (from a region of the file), and after a flip (from the pixels in
                    // memory).
                    for (steps, want) in [
                        (vec![resize, c], rgb(&unfused(&resized, &[c]))),
                        (
                            vec![resize, c, Step::FlipLeftRight],
                            rgb(&unfused(&resized, &[c, Step::FlipLeftRight])),
                        ),
                        (
                            vec![Step::FlipLeftRight, resize, c],
                            rgb(&unfused(&flipped, &[c])),
                        ),
                    ] {
                        let got = fused(&data, &header, denom, &steps, false);
                        assert!(got == want, "{w}x{h} 1/{denom} {steps:?}");
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 200, "{checked}");
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (255.0f64.powi(2) / mse.max(1e-12)).log10()
}

#[test]
fn draft_picks_pillows_scale_and_keeps_the_size() {
    let data = jpeg(1000, 700, Subsamp::Sub2x2, false);
    let header = decode::probe(&data).unwrap();
    let bilinear = |width, height, bbox| Step::Resize {
        width,
        height,
        filter: Filter::Bilinear,
        bbox,
    };
    let crop = |left, top, right, bottom| Step::Crop {
        left,
        top,
        right,
        bottom,
    };
    let full = [0.0, 0.0, 1000.0, 700.0];
    // (steps, scale Pillow's draft picks; None: no draft)
    let cases = [
        (vec![bilinear(365, 256, full)], Some(2)), // 1000 // 365 = 2, 700 // 256 = 2
        (vec![bilinear(501, 256, full)], None),
        (vec![bilinear(500, 350, full)], Some(2)),
        (vec![bilinear(250, 175, full)], Some(4)),
        (vec![bilinear(249, 174, full)], Some(4)),
        (vec![bilinear(100, 80, full)], Some(8)),
        (vec![bilinear(100, 80, full), crop(10, 10, 90, 70)], Some(8)),
        (
            vec![
                crop(100, 50, 900, 650),
                bilinear(224, 224, [0.0, 0.0, 800.0, 600.0]),
            ],
            Some(2),
        ),
        (
            vec![
                crop(0, 0, 1000, 700),
                bilinear(224, 224, [0.0, 0.0, 1000.0, 700.0]),
            ],
            Some(2),
        ),
        (
            vec![
                crop(3, 5, 903, 605),
                bilinear(112, 64, [0.0, 0.0, 900.0, 600.0]),
            ],
            Some(8),
        ),
        // A crop past the picture, a flip first: exact.
        (
            vec![
                crop(-1, 0, 999, 700),
                bilinear(100, 70, [0.0, 0.0, 1000.0, 700.0]),
            ],
            None,
        ),
        (vec![Step::FlipLeftRight, bilinear(100, 80, full)], None),
        (vec![crop(0, 0, 500, 500)], None),
    ];
    for (steps, want) in cases {
        let scale = plan::draft(&header, 1, &steps).map(|(d, _)| d);
        // The steps' reduction is exact where it is not whole; 365 wide: 2 by floor.
        let want = if steps == [bilinear(365, 256, full)] {
            Some(2)
        } else {
            want
        };
        assert_eq!(scale, want, "{steps:?}");
        let exact = fused(&data, &header, 1, &steps, false);
        let drafted = fused(&data, &header, 1, &steps, true);
        assert_eq!(drafted.len(), exact.len(), "{steps:?}");
        if scale.is_none() {
            assert!(drafted == exact, "{steps:?}");
        } else {
            let db = psnr(&drafted, &exact);
            assert!(db > 25.0, "{steps:?}: {db:.1} dB");
        }
    }
    // At 1/2 already, at most 1/8 in all.
    let steps = [bilinear(30, 20, [0.0, 0.0, 500.0, 350.0])];
    assert_eq!(plan::draft(&header, 2, &steps).map(|(d, _)| d), Some(8));
}
