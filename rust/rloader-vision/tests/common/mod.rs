//! What the crate's tests and benches share: JPEGs made from RGB pixels (`jpeg`).
#![allow(dead_code)] // (each test draws what it needs)

use turbojpeg::{Compressor, PixelFormat, Subsamp};

/// How a test JPEG is written.
#[derive(Clone, Copy)]
pub struct Encoding {
    pub quality: i32,
    pub subsamp: Subsamp,
    pub progressive: bool,
}

/// `pixels` (RGB rows of `width`) as a JPEG; `Subsamp::Gray` makes a grayscale one.
pub fn jpeg(pixels: &[u8], width: usize, height: usize, how: Encoding) -> Vec<u8> {
    let image = turbojpeg::Image {
        pixels,
        width,
        pitch: width * 3,
        height,
        format: PixelFormat::RGB,
    };
    let mut c = Compressor::new().unwrap();
    c.set_quality(how.quality).unwrap();
    c.set_subsamp(how.subsamp).unwrap();
    c.set_progressive(how.progressive).unwrap();
    c.compress_to_vec(image).unwrap()
}
