//! A region of a JPEG decodes to the same pixels as that region of the whole decode, for every
//! subsampling, progressive files, odd sizes, CMYK and YCCK, and each DCT scale: what lets a crop decode only
//! the part of the file it covers and stay Pillow's.

use rloader_vision::decode::{self, Region};
use rloader_vision::image::Image;
use turbojpeg::Subsamp;

mod common;
use common::Encoding;

/// A deterministic picture with edges and gradients in every band.
fn picture(width: usize, height: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let noise = (state % 40) as usize;
            out.push(((x * 255 / width.max(1)) ^ (y * 3) ^ noise) as u8);
            out.push(((y * 255 / height.max(1)) + noise) as u8);
            out.push((((x / 7 + y / 5) % 2) * 200 + noise) as u8);
        }
    }
    out
}

fn jpeg(width: usize, height: usize, subsamp: Subsamp, progressive: bool, gray: bool) -> Vec<u8> {
    let pixels = picture(width, height, (width * 31 + height) as u64);
    let subsamp = if gray { Subsamp::Gray } else { subsamp };
    common::jpeg(
        &pixels,
        width,
        height,
        Encoding {
            quality: 87,
            subsamp,
            progressive,
        },
    )
}

fn crop(img: &Image, x: usize, y: usize, w: usize, h: usize) -> Vec<u8> {
    (y..y + h)
        .flat_map(|r| img.row(r)[x * img.bands..(x + w) * img.bands].to_vec())
        .collect()
}

/// Decodes `data` whole and in regions (edges, corners, inside, one pixel, everything) at
/// each DCT scale, and checks each region's pixels against the whole's: how many regions.
fn check_regions(data: &[u8], what: &str, seed: usize) -> usize {
    let header = decode::probe(data).unwrap();
    let mut checked = 0;
    for scale in [1, 2, 4, 8] {
        let whole = decode::decode(data, &header, scale, None).unwrap();
        let (sw, sh) = decode::scaled_size(&header, scale);
        assert_eq!((whole.image.width, whole.image.height), (sw, sh));
        let seed = seed + scale;
        let regions = [
            (0, 0, sw, sh),
            (sw / 3, sh / 4, sw - sw / 3, sh / 2),
            ((seed * 5) % sw, (seed * 3) % sh, 1, 1),
            (sw - (sw / 2).max(1), 0, (sw / 2).max(1), sh),
            (0, sh - (sh / 3).max(1), (sw / 3).max(1), (sh / 3).max(1)),
        ];
        for (x, y, rw, rh) in regions {
            let region = Region {
                x,
                y,
                width: rw,
                height: rh,
            };
            let part = decode::decode(data, &header, scale, Some(region)).unwrap();
            assert!(part.x <= x && part.y <= y);
            let got = crop(&part.image, x - part.x, y - part.y, rw, rh);
            let want = crop(&whole.image, x, y, rw, rh);
            assert!(got == want, "{what} 1/{scale} region {region:?}");
            checked += 1;
        }
    }
    checked
}

const SIZES: [(usize, usize); 5] = [(1, 1), (9, 7), (33, 17), (127, 95), (500, 375)];

#[test]
fn a_region_decodes_to_the_pixels_of_the_whole_decode() {
    let subsamps = [
        Subsamp::None,
        Subsamp::Sub2x1,
        Subsamp::Sub2x2,
        Subsamp::Sub1x2,
        Subsamp::Sub4x1,
    ];
    let mut checked = 0;
    for (k, &(w, h)) in SIZES.iter().enumerate() {
        for (s, &subsamp) in subsamps.iter().enumerate() {
            for &(progressive, gray) in &[(false, false), (true, false), (false, true)] {
                let data = jpeg(w, h, subsamp, progressive, gray);
                let what = format!("{w}x{h} {subsamp:?} progressive={progressive} gray={gray}");
                checked += check_regions(&data, &what, k * 7 + s * 3);
            }
        }
    }
    assert_eq!(checked, 5 * 5 * 3 * 4 * 5);
}

#[test]
fn a_region_of_a_cmyk_or_ycck_jpeg_decodes_to_the_pixels_of_the_whole_decode() {
    let mut checked = 0;
    for (k, &(w, h)) in SIZES.iter().enumerate() {
        for (s, &subsamp) in [Subsamp::None, Subsamp::Sub2x2].iter().enumerate() {
            for plain_cmyk in [false, true] {
                // The RGB picture's bands and their mean as C, M, Y and K.
                let cmyk: Vec<u8> = picture(w, h, (w * 17 + h) as u64)
                    .chunks_exact(3)
                    .flat_map(|p| {
                        let k = ((u16::from(p[0]) + u16::from(p[1]) + u16::from(p[2])) / 3) as u8;
                        [p[0], p[1], p[2], k]
                    })
                    .collect();
                let how = Encoding {
                    quality: 87,
                    subsamp,
                    progressive: s == 1,
                };
                let data = common::cmyk_jpeg(&cmyk, w, h, how, plain_cmyk);
                assert!(decode::probe(&data).unwrap().cmyk);
                let what = format!("{w}x{h} {subsamp:?} plain_cmyk={plain_cmyk}");
                checked += check_regions(&data, &what, k * 5 + s);
            }
        }
    }
    assert_eq!(checked, 5 * 2 * 2 * 4 * 5);
}
