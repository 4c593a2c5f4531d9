//! PNG by the `png` crate. Lossless, so only the conversion to RGB matters: 8-bit RGB and L
//! decode as they are, RGBA and LA drop alpha and palette images map through their palette,
//! as Pillow's `convert("RGB")` does. Files whose conversion Pillow does otherwise (16-bit,
//! fewer than 8 bits, a tRNS chunk, over which Pillow may warn) are left to Pillow.

use std::io::Cursor;

use png::{BitDepth, ColorType, Transformations};

use super::{Format, Header, NotHandled};
use crate::image::Image;

fn failed(err: png::DecodingError) -> NotHandled {
    NotHandled::DecodeFailed(err.to_string())
}

fn reader(data: &[u8]) -> Result<png::Reader<Cursor<&[u8]>>, NotHandled> {
    let mut decoder = png::Decoder::new(Cursor::new(data));
    decoder.set_transformations(Transformations::EXPAND);
    decoder.read_info().map_err(failed)
}

pub(super) fn probe(data: &[u8]) -> Result<Header, NotHandled> {
    let reader = reader(data)?;
    let info = reader.info();
    if info.bit_depth != BitDepth::Eight {
        return Err(NotHandled::Unsupported(format!(
            "PNG of {:?} bits",
            info.bit_depth
        )));
    }
    if info.trns.is_some() {
        return Err(NotHandled::Unsupported("PNG with a tRNS chunk".into()));
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
    if depth != BitDepth::Eight {
        return Err(NotHandled::Unsupported(format!(
            "PNG output of {depth:?} bits"
        )));
    }
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
    let stride = frame.line_size;
    let src_bands = color.samples();
    let mut image = Image::new(width, height, header.bands);
    let row_bytes = width * header.bands;
    for y in 0..height {
        let src = &buf[y * stride..y * stride + width * src_bands];
        let dst = &mut image.data[y * row_bytes..(y + 1) * row_bytes];
        if src_bands == header.bands {
            dst.copy_from_slice(src);
        } else {
            // RGBA -> RGB, LA -> L: alpha dropped.
            for (d, s) in dst
                .chunks_exact_mut(header.bands)
                .zip(src.chunks_exact(src_bands))
            {
                d.copy_from_slice(&s[..header.bands]);
            }
        }
    }
    Ok(image)
}
