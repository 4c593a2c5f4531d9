//! PNG by the `png` crate. Lossless, so only the conversion to RGB matters: each file becomes
//! what Pillow's `convert("RGB")` makes of the mode Pillow opens it in.
//!
//! - 8-bit RGB and L decode as they are; RGBA and LA drop alpha; palette images map through
//!   their palette (entries past its end are black, as Pillow pads it).
//! - 1, 2 and 4-bit L (Pillow's "1", and "L" through "L;2", "L;4") and palette images: each
//!   value scaled to 0..=255 (by 255, 85, 17), or its palette entry.
//! - 16-bit RGB, RGBA and LA: the high byte of each sample (rawmodes "RGB;16B", "RGBA;16B",
//!   "LA;16B"; Pillow opens 16-bit LA as "RGBA").
//! - 16-bit L: Pillow opens it as "I;16", whose conversion to RGB clips at 255 (Convert.c's
//!   `I16_RGB`): not the high byte.
//! - A tRNS chunk: on L and RGB only `info["transparency"]`, the pixels unchanged; on a palette
//!   image that marks one entry transparent and every other opaque, the same (Pillow keeps
//!   that entry's index).
//!
//! Each rule is Pillow 11.3's and 13.0's alike (tests/test_vision_decode.py checks both).
//! Left to Pillow: a palette image's tRNS with any other alphas (Pillow keeps them as bytes,
//! and `convert("RGB")` warns that such images should be converted to RGBA), and animated PNGs.

use std::io::Cursor;

use png::{BitDepth, ColorType, Transformations};

use super::{Format, Header, NotHandled};
use crate::image::Image;

fn failed(err: png::DecodingError) -> NotHandled {
    NotHandled::DecodeFailed(err.to_string())
}

fn reader(data: &[u8]) -> Result<png::Reader<Cursor<&[u8]>>, NotHandled> {
    let mut decoder = png::Decoder::new(Cursor::new(data));
    // Palette to RGB, gray of 1, 2, 4 bits scaled to 8, tRNS to an alpha band (dropped here).
    // (16-bit samples are narrowed in `decode`, in the pass that drops alpha.)
    decoder.set_transformations(Transformations::EXPAND);
    decoder.read_info().map_err(failed)
}

/// Whether a palette image's tRNS is what Pillow reads as one transparent index
/// (`^\xff*\x00\xff*$`): one entry 0, every other 255.
fn one_transparent_entry(trns: &[u8]) -> bool {
    trns.iter().filter(|&&a| a == 0).count() == 1 && trns.iter().all(|&a| a == 0 || a == 255)
}

pub(super) fn probe(data: &[u8]) -> Result<Header, NotHandled> {
    let reader = reader(data)?;
    let info = reader.info();
    if let Some(trns) = &info.trns {
        if info.color_type == ColorType::Indexed && !one_transparent_entry(trns) {
            return Err(NotHandled::Unsupported(
                "palette PNG with a tRNS of partial alphas".into(),
            ));
        }
    }
    if info.animation_control.is_some() {
        return Err(NotHandled::Unsupported("animated PNG".into()));
    }
    let bands = match info.color_type {
        ColorType::Grayscale | ColorType::GrayscaleAlpha => 1,
        ColorType::Rgb | ColorType::Rgba | ColorType::Indexed => 3,
    };
    Ok(Header {
        format: Format::Png,
        width: info.width as usize,
        height: info.height as usize,
        bands,
        mcu_width: 0,
        cmyk: false,
    })
}

pub(super) fn decode(data: &[u8], header: &Header) -> Result<Image, NotHandled> {
    let mut reader = reader(data)?;
    let (color, depth) = reader.output_color_type();
    let gray16 = reader.info().color_type == ColorType::Grayscale;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| NotHandled::Unsupported("PNG too large to decode".into()))?;
    let mut buf = vec![0; size];
    let frame = reader.next_frame(&mut buf).map_err(failed)?;
    // Pillow reads the whole file: a broken chunk after the image data fails there too.
    reader.finish().map_err(failed)?;
    let (width, height) = (frame.width as usize, frame.height as usize);
    if (width, height) != (header.width, header.height) {
        return Err(NotHandled::DecodeFailed(
            "PNG frame size differs from its header".into(),
        ));
    }
    let mut image = Image::new(width, height, header.bands);
    let rows = Rows {
        buf: &buf,
        stride: frame.line_size,
        src_bands: color.samples(),
    };
    match depth {
        BitDepth::Eight => rows.narrow(&mut image, |&[v]: &[u8; 1]| v),
        // "I;16" to RGB clips; every other 16-bit mode keeps the high byte (big-endian).
        BitDepth::Sixteen if gray16 => rows.narrow(
            &mut image,
            |&[hi, lo]: &[u8; 2]| if hi == 0 { lo } else { 255 },
        ),
        BitDepth::Sixteen => rows.narrow(&mut image, |&[hi, _]: &[u8; 2]| hi),
        other => {
            return Err(NotHandled::Unsupported(format!(
                "PNG output of {other:?} bits"
            )))
        }
    }
    Ok(image)
}

/// The png crate's output rows: `src_bands` samples a pixel, each row `stride` bytes apart.
struct Rows<'a> {
    buf: &'a [u8],
    stride: usize,
    src_bands: usize,
}

impl Rows<'_> {
    /// Fills `image` (its first `image.bands` bands of each pixel, alpha dropped) with each
    /// sample of `N` bytes made one byte by `byte`.
    fn narrow<const N: usize>(&self, image: &mut Image, byte: impl Fn(&[u8; N]) -> u8) {
        let (width, bands) = (image.width, image.bands);
        let pixel_bytes = self.src_bands * N;
        for y in 0..image.height {
            let dst = &mut image.data[y * width * bands..][..width * bands];
            let src = &self.buf[y * self.stride..][..width * pixel_bytes];
            if N == 1 && self.src_bands == bands {
                dst.copy_from_slice(src);
                continue;
            }
            for (d, s) in dst
                .chunks_exact_mut(bands)
                .zip(src.chunks_exact(pixel_bytes))
            {
                for (v, sample) in d.iter_mut().zip(s.chunks_exact(N)) {
                    *v = byte(sample.try_into().expect("N bytes"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `width` x 1 PNG of `samples` (already packed at `depth`).
    fn png_file(
        width: u32,
        color: ColorType,
        depth: BitDepth,
        samples: &[u8],
        palette: Option<&[u8]>,
        trns: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut file = Vec::new();
        let mut enc = png::Encoder::new(&mut file, width, 1);
        enc.set_color(color);
        enc.set_depth(depth);
        if let Some(palette) = palette {
            enc.set_palette(palette.to_vec());
        }
        if let Some(trns) = trns {
            enc.set_trns(trns.to_vec());
        }
        enc.write_header()
            .unwrap()
            .write_image_data(samples)
            .unwrap();
        file
    }

    fn decoded(file: &[u8]) -> Image {
        decode(file, &probe(file).unwrap()).unwrap()
    }

    #[test]
    fn sixteen_bit_gray_clips_and_other_sixteen_bit_modes_keep_the_high_byte() {
        // Values 0x0007, 0x00FF, 0x0100, 0xABCD: "I;16" to RGB clips at 255.
        let values = [0, 7, 0, 255, 1, 0, 0xAB, 0xCD];
        let gray = png_file(
            4,
            ColorType::Grayscale,
            BitDepth::Sixteen,
            &values,
            None,
            None,
        );
        assert_eq!(decoded(&gray).data, [7, 255, 255, 255]);
        let gray_trns = png_file(
            4,
            ColorType::Grayscale,
            BitDepth::Sixteen,
            &values,
            None,
            Some(&[0, 7]),
        );
        assert_eq!(decoded(&gray_trns).data, [7, 255, 255, 255]);
        // LA: (0x0007, 0x00FF), (0x0100, 0xABCD): L's high byte.
        let la = png_file(
            2,
            ColorType::GrayscaleAlpha,
            BitDepth::Sixteen,
            &values,
            None,
            None,
        );
        assert_eq!(decoded(&la).data, [0, 1]);
        let rgba = [values, values].concat();
        let rgba = png_file(2, ColorType::Rgba, BitDepth::Sixteen, &rgba, None, None);
        assert_eq!(decoded(&rgba).data, [0, 0, 1, 0, 0, 1]);
    }

    #[test]
    fn low_bit_gray_scales_and_palette_entries_past_the_end_are_black() {
        // 2 bits: 0b00_01_10_11 -> 0, 85, 170, 255.
        let gray = png_file(
            4,
            ColorType::Grayscale,
            BitDepth::Two,
            &[0b00_01_10_11],
            None,
            None,
        );
        assert_eq!(decoded(&gray).data, [0, 85, 170, 255]);
        let palette = [10, 20, 30, 40, 50, 60];
        let indexed = png_file(
            3,
            ColorType::Indexed,
            BitDepth::Four,
            &[0x01, 0x20],
            Some(&palette),
            Some(&[255, 0]),
        );
        assert_eq!(decoded(&indexed).data, [10, 20, 30, 40, 50, 60, 0, 0, 0]);
        let alphas = png_file(
            1,
            ColorType::Indexed,
            BitDepth::Four,
            &[0],
            Some(&palette),
            Some(&[128]),
        );
        assert!(matches!(probe(&alphas), Err(NotHandled::Unsupported(_))));
    }

    #[test]
    fn a_palette_trns_is_one_transparent_index_only_as_pillow_reads_it() {
        assert!(one_transparent_entry(b"\x00"));
        assert!(one_transparent_entry(b"\xff\xff\x00\xff"));
        assert!(!one_transparent_entry(b""));
        assert!(!one_transparent_entry(b"\xff\xff"));
        assert!(!one_transparent_entry(b"\x00\x00"));
        assert!(!one_transparent_entry(b"\xff\x80\x00"));
    }
}
