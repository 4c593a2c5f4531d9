//! What the crate's tests and benches share: a photo-like picture (`photo`) and JPEGs made
//! from RGB pixels (`jpeg`) or CMYK ones (`cmyk_jpeg`).
#![allow(dead_code)] // (each test draws what it needs)

use turbojpeg::{Colorspace, Compressor, PixelFormat, Subsamp};

/// How a test JPEG is written.
#[derive(Clone, Copy)]
pub struct Encoding {
    pub quality: i32,
    pub subsamp: Subsamp,
    pub progressive: bool,
}

/// `pixels` (RGB rows of `width`) as a JPEG; `Subsamp::Gray` makes a grayscale one.
pub fn jpeg(pixels: &[u8], width: usize, height: usize, how: Encoding) -> Vec<u8> {
    compress(pixels, width, height, PixelFormat::RGB, how, None)
}

/// `pixels` (CMYK rows of `width`, 4 bytes a pixel) as a four-component JPEG: YCCK, or with
/// `plain_cmyk` the components as they are (CMYK).
pub fn cmyk_jpeg(
    pixels: &[u8],
    width: usize,
    height: usize,
    how: Encoding,
    plain_cmyk: bool,
) -> Vec<u8> {
    let colorspace = if plain_cmyk {
        Colorspace::CMYK
    } else {
        Colorspace::YCCK
    };
    compress(
        pixels,
        width,
        height,
        PixelFormat::CMYK,
        how,
        Some(colorspace),
    )
}

fn compress(
    pixels: &[u8],
    width: usize,
    height: usize,
    format: PixelFormat,
    how: Encoding,
    colorspace: Option<Colorspace>,
) -> Vec<u8> {
    let image = turbojpeg::Image {
        pixels,
        width,
        pitch: width * format.size(),
        height,
        format,
    };
    let mut c = Compressor::new().unwrap();
    c.set_quality(how.quality).unwrap();
    c.set_subsamp(how.subsamp).unwrap();
    c.set_progressive(how.progressive).unwrap();
    if let Some(colorspace) = colorspace {
        c.set_colorspace(colorspace).unwrap();
    }
    c.compress_to_vec(image).unwrap()
}

/// A photo-like `w` x `h` RGB picture (rows of `w * 3` bytes): gradients plus deterministic
/// noise.
pub fn photo(w: usize, h: usize) -> Vec<u8> {
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
    data
}
