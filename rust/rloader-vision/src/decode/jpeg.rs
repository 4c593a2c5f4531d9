//! JPEG by libjpeg-turbo (the `turbojpeg` crate's vendored 3.1), the decoder Pillow's wheels
//! bundle. Pillow's decoder sets nothing beyond libjpeg's defaults outside `draft` (the islow
//! IDCT, fancy upsampling), and TurboJPEG's defaults are the same, so the pixels are Pillow's.

use std::cell::RefCell;

use turbojpeg::{Colorspace, Decompressor, PixelFormat, ScalingFactor};

use super::{Format, Header, NotHandled};
use crate::image::Image;

thread_local! {
    // A decompressor per thread, made once: tj3Init allocates libjpeg's state each time.
    static DECOMPRESSOR: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

fn with_decompressor<T>(
    f: impl FnOnce(&mut Decompressor) -> Result<T, NotHandled>,
) -> Result<T, NotHandled> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(failed)?);
        }
        f(slot.as_mut().expect("made above"))
    })
}

fn failed(err: turbojpeg::Error) -> NotHandled {
    NotHandled::DecodeFailed(err.to_string())
}

pub(super) fn probe(data: &[u8]) -> Result<Header, NotHandled> {
    let header = with_decompressor(|d| {
        d.set_scaling_factor(ScalingFactor::ONE).map_err(failed)?;
        d.read_header(data).map_err(failed)
    })?;
    if header.is_lossless {
        return Err(NotHandled::Unsupported("lossless JPEG".into()));
    }
    let bands = match header.colorspace {
        Colorspace::Gray => 1,
        Colorspace::YCbCr | Colorspace::RGB => 3,
        // Pillow opens these as CMYK (Adobe's inverted too) and converts with its own formula.
        other => {
            return Err(NotHandled::Unsupported(format!(
                "JPEG colorspace {other:?}"
            )))
        }
    };
    Ok(Header {
        format: Format::Jpeg,
        width: header.width,
        height: header.height,
        bands,
    })
}

pub(super) fn decode(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
) -> Result<Image, NotHandled> {
    let (width, height) = super::scaled_size(header, scale_denom);
    let format = if header.bands == 1 {
        PixelFormat::GRAY
    } else {
        PixelFormat::RGB
    };
    let mut image = Image::new(width, height, header.bands);
    with_decompressor(|d| {
        d.set_scaling_factor(ScalingFactor::new(1, scale_denom))
            .map_err(failed)?;
        let out = turbojpeg::Image {
            pixels: image.data.as_mut_slice(),
            width,
            pitch: width * header.bands,
            height,
            format,
        };
        // A warning (corrupt data, a premature end) fails too: Pillow decides those files.
        d.decompress(data, out).map_err(failed)
    })?;
    Ok(image)
}
