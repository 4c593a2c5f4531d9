//! JPEG by libjpeg-turbo (the `turbojpeg` crate's vendored 3.1, through its raw TurboJPEG 3
//! API), the decoder Pillow's wheels bundle. Pillow's decoder sets nothing beyond libjpeg's
//! defaults outside `draft` (the islow IDCT, fancy upsampling), and TurboJPEG's defaults are
//! the same, so the pixels are Pillow's.
//!
//! Four-component JPEGs (CMYK, and YCCK, which libjpeg converts to CMYK) are what Pillow opens
//! as "CMYK" with the rawmode "CMYK;I": it assumes Adobe's inverted polarity for every such
//! file, marker or not (JpegImagePlugin's SOS handler), and inverts each byte libjpeg gives.
//! `convert("RGB")` then runs Convert.c's `cmyk2rgb`; `cmyk_to_rgb` below does both steps.
//!
//! A region decodes only the iMCU columns and the rows it covers (TurboJPEG's cropping region:
//! jpeg_crop_scanline and jpeg_skip_scanlines), whose pixels equal the same region of the whole
//! decode: the tests compare both over every subsampling, progressive files and odd sizes.

use std::cell::RefCell;
use std::ptr::NonNull;

use turbojpeg::raw;

use super::{Decoded, Format, Header, NotHandled, Region};
use crate::image::Image;

/// A TurboJPEG decompressor: libjpeg's state, made once per thread (tj3Init allocates it).
struct Handle(NonNull<libc::c_void>);

impl Handle {
    fn new() -> Result<Self, NotHandled> {
        // SAFETY: tj3Init has no preconditions; null is its failure.
        let ptr = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        NonNull::new(ptr)
            .map(Handle)
            .ok_or_else(|| NotHandled::DecodeFailed("tj3Init failed".into()))
    }

    fn ptr(&self) -> raw::tjhandle {
        self.0.as_ptr()
    }

    /// The error of the call that just failed, as TurboJPEG words it.
    fn error(&self) -> NotHandled {
        // SAFETY: a live handle; the string is TurboJPEG's, copied before the next call.
        let msg = unsafe { std::ffi::CStr::from_ptr(raw::tj3GetErrorStr(self.ptr())) };
        NotHandled::DecodeFailed(msg.to_string_lossy().into_owned())
    }

    fn check(&self, rc: libc::c_int) -> Result<(), NotHandled> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn get(&self, param: raw::TJPARAM) -> libc::c_int {
        // SAFETY: a live handle; tj3Get only reads.
        unsafe { raw::tj3Get(self.ptr(), param as libc::c_int) }
    }

    fn read_header(&self, data: &[u8]) -> Result<(), NotHandled> {
        // SAFETY: data is a live slice of data.len() bytes.
        self.check(unsafe {
            raw::tj3DecompressHeader(self.ptr(), data.as_ptr(), data.len() as raw::size_t)
        })
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: made by tj3Init, destroyed once.
        unsafe { raw::tj3Destroy(self.ptr()) }
    }
}

// SAFETY: a TurboJPEG handle holds no thread-affine state; it is used by one thread at a time
// (thread-local below).
unsafe impl Send for Handle {}

/// turbojpeg.h's `tjMCUWidth` (a static table in the header, not a symbol of the library): the
/// iMCU width of each TJSAMP (4:4:4, 4:2:2, 4:2:0, gray, 4:4:0, 4:1:1, 4:4:1).
const MCU_WIDTH: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];

/// The tallest iMCU (4:2:0, 4:4:0): rows a region takes above and below it.
const MAX_MCU_HEIGHT: usize = 16;

thread_local! {
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread's handle. A handle whose call failed is dropped, and the next call
/// makes a fresh one: after an error part of libjpeg's state (Huffman tables, the source's
/// position) can be left over, and the next file read through that handle was misread.
fn with_handle<T>(f: impl FnOnce(&Handle) -> Result<T, NotHandled>) -> Result<T, NotHandled> {
    HANDLE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Handle::new()?);
        }
        let result = f(slot.as_ref().expect("made above"));
        if result.is_err() {
            *slot = None;
        }
        result
    })
}

pub(super) fn probe(data: &[u8]) -> Result<Header, NotHandled> {
    with_handle(|h| {
        h.read_header(data)?;
        if h.get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0 {
            return Err(NotHandled::Unsupported("lossless JPEG".into()));
        }
        let colorspace = h.get(raw::TJPARAM_TJPARAM_COLORSPACE);
        let is = |cs: raw::TJCS| colorspace == cs as libc::c_int;
        let (bands, cmyk) = if is(raw::TJCS_TJCS_GRAY) {
            (1, false)
        } else if is(raw::TJCS_TJCS_YCbCr) || is(raw::TJCS_TJCS_RGB) {
            (3, false)
        } else if is(raw::TJCS_TJCS_CMYK) || is(raw::TJCS_TJCS_YCCK) {
            (3, true)
        } else {
            return Err(NotHandled::Unsupported(format!(
                "JPEG colorspace {colorspace}"
            )));
        };
        let subsamp = h.get(raw::TJPARAM_TJPARAM_SUBSAMP);
        // An unknown subsampling has no iMCU width to align a region to: 0, no regions.
        let mcu = usize::try_from(subsamp)
            .ok()
            .and_then(|s| MCU_WIDTH.get(s).copied())
            .unwrap_or(0);
        Ok(Header {
            format: Format::Jpeg,
            width: h.get(raw::TJPARAM_TJPARAM_JPEGWIDTH) as usize,
            height: h.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT) as usize,
            bands,
            mcu_width: mcu,
            cmyk,
        })
    })
}

pub(super) fn decode(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
    region: Option<Region>,
) -> Result<Decoded, NotHandled> {
    let (full_w, full_h) = super::scaled_size(header, scale_denom);
    // The region widened to whole scaled iMCUs on the left, as TurboJPEG requires.
    let mcu = header.mcu_width.div_ceil(scale_denom);
    let (x, y, width, height) = match region {
        Some(r)
            if mcu > 0
                && r.width > 0
                && r.height > 0
                && (r.width, r.height) != (full_w, full_h) =>
        {
            // One iMCU more on every side: fancy upsampling reads each chroma sample's
            // neighbours, and at a region's edge TurboJPEG would replicate the edge instead.
            let x = (r.x / mcu).saturating_sub(1) * mcu;
            let y = r.y.saturating_sub(MAX_MCU_HEIGHT.div_ceil(scale_denom));
            let right = (r.x + r.width + mcu).min(full_w);
            let bottom = (r.y + r.height + MAX_MCU_HEIGHT.div_ceil(scale_denom)).min(full_h);
            (x, y, right - x, bottom - y)
        }
        _ => (0, 0, full_w, full_h),
    };
    let (format, decoded_bands) = if header.cmyk {
        (raw::TJPF_TJPF_CMYK, 4)
    } else if header.bands == 1 {
        (raw::TJPF_TJPF_GRAY, 1)
    } else {
        (raw::TJPF_TJPF_RGB, 3)
    };
    let mut pixels = vec![0; width * height * decoded_bands];
    with_handle(|h| {
        h.read_header(data)?;
        let factor = raw::tjscalingfactor {
            num: 1,
            denom: scale_denom as libc::c_int,
        };
        // SAFETY: a live handle whose header was just read.
        h.check(unsafe { raw::tj3SetScalingFactor(h.ptr(), factor) })?;
        let crop = if (x, y, width, height) == (0, 0, full_w, full_h) {
            raw::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            raw::tjregion {
                x: x as libc::c_int,
                y: y as libc::c_int,
                w: width as libc::c_int,
                h: height as libc::c_int,
            }
        };
        // SAFETY: as above; the region lies inside the scaled image (Region's contract).
        h.check(unsafe { raw::tj3SetCroppingRegion(h.ptr(), crop) })?;
        // A warning (corrupt data, a premature end) fails too: Pillow decides those files.
        // SAFETY: `pixels` holds height rows of width * decoded_bands bytes, the pitch given.
        h.check(unsafe {
            raw::tj3Decompress8(
                h.ptr(),
                data.as_ptr(),
                data.len() as raw::size_t,
                pixels.as_mut_ptr(),
                (width * decoded_bands) as libc::c_int,
                format as libc::c_int,
            )
        })
    })?;
    if header.cmyk {
        cmyk_to_rgb(&mut pixels);
    }
    Ok(Decoded {
        image: Image::from_vec(width, height, header.bands, pixels),
        x,
        y,
    })
}

/// libjpeg's CMYK bytes (4 per pixel) to the RGB bytes (3 per pixel, in place, the buffer
/// shortened) Pillow's `convert("RGB")` gives: each byte inverted ("CMYK;I"), then Convert.c's
/// `cmyk2rgb`, `255 - k - (c * (255 - k)) / 255` per band in Pillow's rounding (`MULDIV255`).
/// With the inversion folded in: `k - muldiv255(255 - c, k)` of libjpeg's `c` and `k`.
fn cmyk_to_rgb(pixels: &mut Vec<u8>) {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    let n = pixels.len() / 4;
    // Pixel i's RGB goes to 3i, behind its CMYK at 4i: forward in place never overwrites
    // bytes still to be read.
    for i in 0..n {
        let [c, m, y, k] = <[u8; 4]>::try_from(&pixels[4 * i..4 * i + 4]).expect("4 bytes");
        let k = u32::from(k);
        let rgb = [c, m, y].map(|c| (k - muldiv255(255 - u32::from(c), k)) as u8);
        pixels[3 * i..3 * i + 3].copy_from_slice(&rgb);
    }
    pixels.truncate(3 * n);
}

#[cfg(test)]
mod tests {
    use super::cmyk_to_rgb;

    #[test]
    fn cmyk_converts_as_pillows_inverted_cmyk_to_rgb() {
        // libjpeg's bytes -> Pillow 11.3's and 13.0's
        // Image.frombytes("CMYK", size, raw, "raw", "CMYK;I").convert("RGB").
        let mut pixels = vec![
            0, 0, 0, 255, //
            255, 255, 255, 255, //
            0, 0, 0, 0, //
            100, 7, 200, 128, //
            1, 254, 128, 3, //
        ];
        cmyk_to_rgb(&mut pixels);
        assert_eq!(
            pixels,
            [0, 0, 0, 255, 255, 255, 0, 0, 0, 50, 4, 100, 0, 3, 2]
        );
    }
}
