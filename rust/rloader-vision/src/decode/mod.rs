//! Files to pixels: what `PIL.Image.open(f).convert("RGB")` gives, for the files this crate
//! decodes exactly; `probe` says which those are, and anything else is left to Pillow.
//!
//! A file is decoded here only where the result is known to equal Pillow's bit for bit; every
//! other file (another format, a mode whose conversion is not reproduced, any decoder error or
//! warning) is reported as not handled and the caller hands it to Pillow, which then gives
//! its own pixels or raises its own exception. So a corrupt file raises exactly what
//! torchvision raises, and a warning libjpeg-turbo gives never changes a result.

mod jpeg;
mod png;

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::image::Image;

/// What a file holds, read from its header without decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub format: Format,
    pub width: usize,
    pub height: usize,
    /// Bands of the decoded pixels (1: Pillow's "L", 3: "RGB"), before the conversion to RGB
    /// the caller makes last (an L image is resampled as one band, the same arithmetic per band).
    pub bands: usize,
    /// The width of a JPEG's iMCU (8 or 16 pixels; 0 where unknown: no regions), to which a
    /// region's left edge is aligned; 0 for PNG.
    pub mcu_width: usize,
    /// A JPEG of four components (CMYK or YCCK), decoded as CMYK and converted to RGB as
    /// Pillow converts its "CMYK" images.
    pub cmyk: bool,
}

/// A rectangle of the (scaled) image, the part of it a sample's steps need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

/// Decoded pixels, and where their top-left corner lies in the whole (scaled) image: a region
/// decodes to at least the region, from `x <= region.x` (a JPEG's iMCU column), `y`.
pub struct Decoded {
    pub image: Image,
    pub x: usize,
    pub y: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jpeg,
    Png,
}

/// Why a file was not decoded here: the caller gives it to Pillow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotHandled {
    /// Not a JPEG or PNG, or one whose pixels Pillow converts in a way not reproduced here.
    Unsupported(String),
    /// The decoder failed or warned; Pillow decides what that file gives.
    DecodeFailed(String),
}

/// Reads the header of a JPEG or PNG this crate decodes exactly; `Err` for anything else.
pub fn probe(data: &[u8]) -> Result<Header, NotHandled> {
    if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        jpeg::probe(data)
    } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        png::probe(data)
    } else {
        Err(NotHandled::Unsupported("neither JPEG nor PNG".into()))
    }
}

/// Decodes a file `probe` accepted. `scale_denom` (1, 2, 4 or 8) decodes a JPEG at that
/// fraction of its size in the DCT, as Pillow's `draft` does; PNGs decode at 1 only. A
/// `region` (inside the scaled image) may decode only what covers it (JPEG); its pixels are
/// those of the whole decode.
pub fn decode(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
    region: Option<Region>,
) -> Result<Decoded, NotHandled> {
    let started = Instant::now();
    let decoded = decode_uncounted(data, header, scale_denom, region);
    DECODE_TIME.with(|t| t.set(t.get() + started.elapsed()));
    decoded
}

thread_local! {
    static DECODE_TIME: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// The time this thread has spent in `decode` since the last call: how a sample's time splits
/// between decoding and the rest (`DataLoader.stats()`).
pub fn take_decode_time() -> Duration {
    DECODE_TIME.with(|t| t.replace(Duration::ZERO))
}

fn decode_uncounted(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
    region: Option<Region>,
) -> Result<Decoded, NotHandled> {
    match header.format {
        Format::Jpeg => jpeg::decode(data, header, scale_denom, region),
        Format::Png if scale_denom == 1 => Ok(Decoded {
            image: png::decode(data, header)?,
            x: 0,
            y: 0,
        }),
        Format::Png => Err(NotHandled::Unsupported(
            "PNGs do not decode at a reduced scale".into(),
        )),
    }
}

/// The size a JPEG decodes to at `1/scale_denom` (libjpeg's rounding up, as Pillow's `draft`).
pub fn scaled_size(header: &Header, scale_denom: usize) -> (usize, usize) {
    (
        header.width.div_ceil(scale_denom),
        header.height.div_ceil(scale_denom),
    )
}
