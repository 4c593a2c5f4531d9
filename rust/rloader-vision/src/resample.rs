//! Pillow's `Image.resize(size, resample, box)` (no `reducing_gap`) for 8-bit L and RGB images,
//! bit for bit: the convolution filters of `libImaging/Resample.c` and NEAREST, which Pillow
//! runs as an affine transform (`libImaging/Geometry.c`).

// NOTE [Pillow's resampling arithmetic]
//
// What Pillow 13 computes, and so what this file computes (same operations, same order, same
// types: a different rounding anywhere changes some output byte).
//
// Entry (`_imaging.c` `_resize`). The box arrives as four C floats (f32, rounded from Python's
// floats); sizes below 1, a negative box offset, a box past the image or with x1 < x0 are errors.
// If box[0] and box[1] are whole and box[2] - box[0] == out_w and box[3] - box[1] == out_h (f32
// arithmetic), the result is a plain crop of the source at the box, whatever the filter (Python's
// own shortcut, same size and full box gives a copy, is a case of it). Otherwise NEAREST goes to
// the affine transform and the other filters to `ImagingResample`.
//
// Filters, on f64: BOX 1 on (-0.5, 0.5], support 0.5; BILINEAR 1 - |x| on |x| < 1, support 1;
// HAMMING sin(pi x)/(pi x) * (0.54f + 0.46f * cos(pi x)) with the two constants as f32 values
// widened to f64, 1 at 0, 0 from |x| >= 1, support 1; BICUBIC Keys' cubic with a = -0.5, written
// as Pillow writes it (((a+2)x - (a+3)) x x + 1 below 1, (((x-5)x + 8)x - 4) a below 2),
// support 2; LANCZOS sinc(x) sinc(x/3) on [-3, 3), support 3. sin and cos are the C library's.
//
// Coefficients per axis (`precompute_coeffs`), for an input of `in_size` pixels, the box's edges
// in0, in1 (f32) and `out_size` outputs:
//   scale = f64(in1 - in0 computed in f32) / out_size; filterscale = max(scale, 1)
//   support = filter_support * filterscale; ksize = ceil(support) * 2 + 1 (the row stride)
//   for each output i: center = f64(in0) + (i + 0.5) * scale
//     xmin = trunc(center - support + 0.5) clamped to >= 0
//     xmax = trunc(center + support + 0.5) clamped to <= in_size; n = xmax - xmin taps
//     w[x] = filter(((x + xmin) - center + 0.5) * (1 / filterscale)), summed left to right into
//     ww; each w[x] /= ww unless ww == 0
//   then to 22-bit fixed point (PRECISION_BITS = 32 - 8 - 2): trunc(w * 2^22 + 0.5) for w >= 0,
//   trunc(w * 2^22 - 0.5) below 0, as i32.
// A pixel is (2^21 + sum of pixel * coefficient) in i32, then clip8: (sum >> 22) clamped to
// 0..=255. Integer sums are exact, so the order of the taps is free (we may vectorise).
//
// Passes (`ImagingResampleInner`). The horizontal pass is needed when out_w != in_w or
// box[0] != 0 or box[2] != out_w (box[2] against the OUTPUT width, as Pillow compares it); the
// vertical one when out_h != in_h or box[1] != 0 or box[3] != out_h. Neither: a copy. Both: the
// horizontal pass runs first, over only the source rows the vertical pass will read (from the
// first output row's xmin to the last one's xmin + n; the vertical bounds are shifted by that
// first row), unless the height shrinks by more than twice what the width does:
//   out_h < in_h and (in_h - out_h) > 2 * (in_w - out_w)   (image sizes, not the box's)
// then the vertical pass runs first (over the columns the horizontal pass will read). Pillow 13
// brought that second order in (python-pillow/Pillow#9549); the rule above is the one that
// matches Pillow 13.0.0 on ~4400 random sizes and boxes, with its boundary checked both ways
// (in_h - out_h == 2 * (in_w - out_w) stays horizontal-first). The order changes rounding, since
// the first pass rounds to 8 bits. Before Pillow 13 the horizontal pass always ran first:
// `set_vertical_first_rule(false)` reproduces those versions.
//
// NEAREST (`ImagingTransform` affine -> `ImagingScaleAffine`, since the matrix has no shear):
//   a0 = f64(box[2] - box[0] in f32) / out_w, a2 = box[0]; a4, a5 likewise for y.
//   x positions: xo = a2 + a0 * 0.5, then xo += a0 after each column (f64 accumulation, not
//   a2 + (x + 0.5) * a0); column x reads source column COORD(xo) = -1 if xo < 0 else trunc(xo).
//   rows: yo = a5 + a4 * 0.5, yo += a4 after each row, source row COORD(yo).
//   Output starts black; a row whose source row is outside the image stays black; within a row,
//   the columns from the first to the last in-range one are copied (each from its tabulated
//   column; a column never tabulated would read column 0), the rest stay black.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::image::Image;

/// A resampling filter, as Pillow's `Image.Resampling` names them.
/// Whether the height-first order of Pillow 13 applies (see the NOTE's "Passes"); Pillow
/// before 13 always runs the horizontal pass first. The process has one Pillow, so this is
/// set once for the process (`set_vertical_first_rule`), from the Pillow it runs with.
static VERTICAL_FIRST_RULE: AtomicBool = AtomicBool::new(true);

/// Reproduce Pillow 13's pass order (`true`, the default) or older Pillow's (`false`).
pub fn set_vertical_first_rule(on: bool) {
    VERTICAL_FIRST_RULE.store(on, Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    Nearest,
    Box,
    Bilinear,
    Hamming,
    Bicubic,
    Lanczos,
}

impl Filter {
    /// Every filter, in Pillow's documentation's order.
    pub const ALL: [Filter; 6] = [
        Filter::Nearest,
        Filter::Box,
        Filter::Bilinear,
        Filter::Hamming,
        Filter::Bicubic,
        Filter::Lanczos,
    ];
}

/// Pillow's `img.resize((out_w, out_h), filter, box)`; box = (x0, y0, x1, y1) in f64 source pixels.
///
/// # Panics
/// Where Pillow raises ValueError: an output size of 0, a negative box offset, a box past the
/// image, a box with x1 < x0 or y1 < y0; and for images that are not 1 or 3 bands.
pub fn resize(src: &Image, out_w: usize, out_h: usize, filter: Filter, bbox: [f64; 4]) -> Image {
    resize_view(&View::whole(src), out_w, out_h, filter, bbox)
}

/// The pixels of `resize(src, out_w, out_h, filter, bbox)` inside `window`, byte for byte, with
/// only those computed (see NOTE [Resizing a window]).
///
/// # Panics
/// As `resize`, and where `window` is empty or passes the output's edges.
pub fn resize_window(
    src: &Image,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    bbox: [f64; 4],
    window: Window,
) -> Image {
    let size = (src.width, src.height);
    WindowedResize::new(size, (out_w, out_h), filter, bbox, window).run(src, 0, 0)
}

/// A rectangle of an image: columns `x..x + width`, rows `y..y + height`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

impl Window {
    /// All of a `width` x `height` image.
    pub fn whole(width: usize, height: usize) -> Self {
        Self {
            x: 0,
            y: 0,
            width,
            height,
        }
    }

    fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0
    }

    /// From the ends of its columns and rows (`x0..x1`, `y0..y1`).
    fn spanning((x0, x1): (usize, usize), (y0, y1): (usize, usize)) -> Self {
        Self {
            x: x0,
            y: y0,
            width: x1 - x0,
            height: y1 - y0,
        }
    }
}

// NOTE [Resizing a window]
//
// Each output pixel of Pillow's resize is a function of its own coordinates alone: its
// horizontal and vertical taps depend only on its column and row (`center = in0 + (i + 0.5) *
// scale`, not on any other output), the intermediate pixel the first pass rounds to 8 bits
// depends only on one source row (or column) and those taps, and integer sums are exact. So a
// window of the output is computed with the taps of its own columns and rows, the first pass
// over only the source rows (columns) those taps read, and gives the same bytes as the whole
// resize cut to the window. What must still be the whole resize's:
// - the taps' arithmetic: in_size (where `xmax` is clamped) is the whole source's, scale the
//   whole box over the whole output;
// - which passes run and in which order: Pillow decides from the whole sizes and box
//   (NOTE [Pillow's resampling arithmetic]), and the order changes the rounding;
// - NEAREST's positions: `xo` is accumulated from column 0 (f64 sums), so the table of source
//   columns is built from column 0 and then cut; rows likewise;
// - the crop shortcut (a whole-pixel box of the output's size) stays a crop, of the window.
// The pixels read are `WindowedResize::source()`: a caller may hold only those (a decoder's
// region), with the taps' positions moved by where its pixels start.

/// A resize of which only a window of the output is computed, planned before the source's
/// pixels exist: `source` says which of them it reads, so that a decoder may decode only
/// those, and `run` computes the window from them.
pub struct WindowedResize {
    window: Window,
    source: Window,
    how: How,
}

enum How {
    /// A whole-pixel box of the output's size: the window is the source's pixels at (x, y).
    Crop { x: usize, y: usize },
    /// NEAREST: the window's columns `span.0..span.1` read source columns `columns`, each row
    /// in `rows` reads its source row (None: the row stays black), the rest is black.
    Nearest {
        columns: Vec<usize>,
        span: (usize, usize),
        rows: Vec<Option<usize>>,
    },
    /// The convolution filters: taps of the window's columns (None: no horizontal pass) and
    /// rows (None: no vertical pass), and Pillow's order of the passes.
    Convolve {
        horiz: Option<Taps>,
        vert: Option<Taps>,
        vertical_first: bool,
    },
}

impl WindowedResize {
    /// `window` of `resize` to `out_size` of an image of `in_size`.
    ///
    /// # Panics
    /// As `resize_window`.
    pub fn new(
        in_size: (usize, usize),
        out_size: (usize, usize),
        filter: Filter,
        bbox: [f64; 4],
        window: Window,
    ) -> Self {
        let ((in_w, in_h), (out_w, out_h)) = (in_size, out_size);
        assert!(out_w >= 1 && out_h >= 1, "height and width must be > 0");
        // `_resize` parses the box with "ffff": C floats.
        let b = bbox.map(|v| v as f32);
        assert!(b[0] >= 0.0 && b[1] >= 0.0, "box offset can't be negative");
        assert!(
            b[2] <= in_w as f32 && b[3] <= in_h as f32,
            "box can't exceed original image size"
        );
        assert!(
            b[2] - b[0] >= 0.0 && b[3] - b[1] >= 0.0,
            "box can't be empty"
        );
        assert!(
            !window.is_empty()
                && window.x + window.width <= out_w
                && window.y + window.height <= out_h,
            "window outside the output"
        );
        let columns = (window.x, window.x + window.width);
        let rows = (window.y, window.y + window.height);

        // A whole-pixel box of the output's size is a crop, for every filter.
        if b[0] - b[0].trunc() == 0.0
            && b[2] - b[0] == out_w as f32
            && b[1] - b[1].trunc() == 0.0
            && b[3] - b[1] == out_h as f32
        {
            let (x, y) = (b[0] as usize + window.x, b[1] as usize + window.y);
            return Self {
                window,
                source: Window { x, y, ..window },
                how: How::Crop { x, y },
            };
        }
        if filter == Filter::Nearest {
            return Self::nearest(in_size, out_size, b, window);
        }

        let kernel = Kernel::of(filter);
        let need_h = out_w != in_w || b[0] != 0.0 || b[2] != out_w as f32;
        let need_v = out_h != in_h || b[1] != 0.0 || b[3] != out_h as f32;
        let vertical_first = need_h
            && need_v
            && VERTICAL_FIRST_RULE.load(Relaxed)
            && out_h < in_h
            && (in_h - out_h) as i64 > 2 * (in_w as i64 - out_w as i64);
        let horiz =
            need_h.then(|| Taps::new(in_w, b[0], b[2], out_w, kernel, columns.0..columns.1));
        let vert = need_v.then(|| Taps::new(in_h, b[1], b[3], out_h, kernel, rows.0..rows.1));
        // Without a pass, output column (row) i is source column (row) i.
        let source = Window::spanning(
            horiz.as_ref().map_or(columns, Taps::span),
            vert.as_ref().map_or(rows, Taps::span),
        );
        Self {
            window,
            source,
            how: How::Convolve {
                horiz,
                vert,
                vertical_first,
            },
        }
    }

    /// `ImagingScaleAffine`'s tables (see NOTE [Pillow's resampling arithmetic]), cut to the
    /// window.
    fn nearest(
        in_size: (usize, usize),
        out_size: (usize, usize),
        b: [f32; 4],
        window: Window,
    ) -> Self {
        let ((in_w, in_h), (out_w, out_h)) = (in_size, out_size);
        let a0 = f64::from(b[2] - b[0]) / out_w as f64;
        let a4 = f64::from(b[3] - b[1]) / out_h as f64;
        let (a2, a5) = (f64::from(b[0]), f64::from(b[1]));

        // Source column of each output column; [lo, hi) spans the in-range ones.
        let mut table = vec![0usize; out_w];
        let (mut lo, mut hi) = (out_w, 0);
        let mut xo = a2 + a0 * 0.5;
        for (x, t) in table.iter_mut().enumerate() {
            let xin = coord(xo);
            if xin >= 0 && (xin as usize) < in_w {
                hi = x + 1;
                lo = lo.min(x);
                *t = xin as usize;
            }
            xo += a0;
        }
        let mut rows = Vec::with_capacity(window.height);
        let mut yo = a5 + a4 * 0.5;
        for y in 0..window.y + window.height {
            let yin = coord(yo);
            if y >= window.y {
                rows.push((yin >= 0 && (yin as usize) < in_h).then_some(yin as usize));
            }
            yo += a4;
        }

        // The window's part of [lo, hi), relative to the window.
        let end = window.x + window.width;
        let (lo, hi) = (lo.clamp(window.x, end), hi.clamp(window.x, end));
        let span = (lo - window.x, hi.max(lo) - window.x);
        let columns = table[lo..hi.max(lo)].to_vec();
        let read_rows = rows.iter().flatten();
        let source = match (
            columns.iter().min().zip(columns.iter().max()),
            read_rows.clone().min().zip(read_rows.max()),
        ) {
            (Some((&x0, &x1)), Some((&y0, &y1))) => Window::spanning((x0, x1 + 1), (y0, y1 + 1)),
            _ => Window::whole(0, 0),
        };
        Self {
            window,
            source,
            how: How::Nearest {
                columns,
                span,
                rows,
            },
        }
    }

    /// The source pixels the window reads (empty where it reads none: all black).
    pub fn source(&self) -> Window {
        self.source
    }

    /// The window's pixels, from `part`: the source's pixels at (`x`, `y`), covering `source()`.
    ///
    /// # Panics
    /// Where `part` does not cover `source()`, or is not 1 or 3 bands.
    pub fn run(self, part: &Image, x: usize, y: usize) -> Image {
        self.run_view(&View::whole(part), x, y)
    }

    fn run_view(self, pixels: &View<'_>, x: usize, y: usize) -> Image {
        let s = self.source;
        assert!(
            s.is_empty()
                || (x <= s.x
                    && y <= s.y
                    && s.x + s.width <= x + pixels.width
                    && s.y + s.height <= y + pixels.height),
            "the pixels do not cover what the window reads"
        );
        let (w, h) = (self.window.width, self.window.height);
        match self.how {
            How::Crop { x: cx, y: cy } => pixels.copy_rect(cx - x, cy - y, w, h),
            How::Nearest {
                mut columns,
                span,
                rows,
            } => {
                for c in &mut columns {
                    *c -= x;
                }
                let bands = pixels.bands;
                let mut out = vec![0u8; w * h * bands];
                for (out_row, row) in out.chunks_exact_mut(w * bands).zip(rows) {
                    let Some(sy) = row else { continue };
                    let in_row = pixels.row(sy - y);
                    let to = &mut out_row[span.0 * bands..span.1 * bands];
                    match bands {
                        3 => copy_columns::<3>(in_row, to, &columns),
                        _ => copy_columns::<1>(in_row, to, &columns),
                    }
                }
                Image::from_vec(w, h, bands, out)
            }
            How::Convolve {
                horiz,
                vert,
                vertical_first,
            } => match (horiz, vert) {
                (None, None) => pixels.copy_rect(self.window.x - x, self.window.y - y, w, h),
                (Some(mut horiz), None) => {
                    horiz.shift(x);
                    horizontal_pass(pixels, self.window.y - y, h, w, &horiz)
                }
                (None, Some(mut vert)) => {
                    vert.shift(y);
                    vertical_pass(&pixels.columns(self.window.x - x, w), h, &vert)
                }
                (Some(mut horiz), Some(mut vert)) if vertical_first => {
                    // Only the columns the horizontal pass reads.
                    let (first, end) = horiz.span();
                    horiz.shift(first);
                    vert.shift(y);
                    let temp = vertical_pass(&pixels.columns(first - x, end - first), h, &vert);
                    horizontal_pass(&View::whole(&temp), 0, h, w, &horiz)
                }
                (Some(mut horiz), Some(mut vert)) => {
                    // Only the rows the vertical pass reads.
                    let (first, end) = vert.span();
                    vert.shift(first);
                    horiz.shift(x);
                    let temp = horizontal_pass(pixels, first - y, end - first, w, &horiz);
                    vertical_pass(&View::whole(&temp), h, &vert)
                }
            },
        }
    }
}

/// A rectangle of an image's pixels, read in place: `resize` reads a whole image through one,
/// `geometry::crop_resize` a crop, so a crop inside the image is never copied out.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    data: &'a [u8],
    /// Bytes from one source row to the next.
    stride: usize,
    /// Byte offset of the view's first pixel.
    offset: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) bands: usize,
}

impl<'a> View<'a> {
    pub(crate) fn whole(img: &'a Image) -> Self {
        Self::rect(img, 0, 0, img.width, img.height)
    }

    /// The `width` x `height` pixels at (`left`, `top`), which must lie inside `img`.
    pub(crate) fn rect(
        img: &'a Image,
        left: usize,
        top: usize,
        width: usize,
        height: usize,
    ) -> Self {
        assert!(
            img.bands == 1 || img.bands == 3,
            "only 1- and 3-band images are supported"
        );
        assert!(
            left + width <= img.width && top + height <= img.height,
            "view outside the image"
        );
        let stride = img.width * img.bands;
        Self {
            data: &img.data,
            stride,
            offset: top * stride + left * img.bands,
            width,
            height,
            bands: img.bands,
        }
    }

    /// Columns `left..left + width` of the view.
    fn columns(&self, left: usize, width: usize) -> Self {
        assert!(left + width <= self.width, "columns outside the view");
        Self {
            offset: self.offset + left * self.bands,
            width,
            ..*self
        }
    }

    #[inline]
    fn row(&self, y: usize) -> &'a [u8] {
        let start = self.offset + y * self.stride;
        &self.data[start..start + self.width * self.bands]
    }

    /// Sub-rectangle copied out, as `ImagingCrop` of a box inside the image.
    pub(crate) fn copy_rect(&self, left: usize, top: usize, width: usize, height: usize) -> Image {
        let b = self.bands;
        let mut out = Vec::with_capacity(width * height * b);
        for y in top..top + height {
            out.extend_from_slice(&self.row(y)[left * b..(left + width) * b]);
        }
        Image::from_vec(width, height, b, out)
    }
}

/// `resize` over a view: the view is the image Pillow would see.
pub(crate) fn resize_view(
    src: &View<'_>,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    bbox: [f64; 4],
) -> Image {
    let (size, out) = ((src.width, src.height), (out_w, out_h));
    // An empty output panics in `new`, before the window is checked.
    let window = Window::whole(out_w, out_h);
    WindowedResize::new(size, out, filter, bbox, window).run_view(src, 0, 0)
}

// ---------------------------------------------------------------------------------------------
// The convolution filters

#[derive(Clone, Copy)]
struct Kernel {
    support: f64,
    weight: fn(f64) -> f64,
}

impl Kernel {
    fn of(filter: Filter) -> Self {
        let (support, weight): (f64, fn(f64) -> f64) = match filter {
            Filter::Box => (0.5, box_weight),
            Filter::Bilinear => (1.0, bilinear_weight),
            Filter::Hamming => (1.0, hamming_weight),
            Filter::Bicubic => (2.0, bicubic_weight),
            Filter::Lanczos => (3.0, lanczos_weight),
            Filter::Nearest => unreachable!("NEAREST is the affine path"),
        };
        Self { support, weight }
    }
}

fn box_weight(x: f64) -> f64 {
    if x > -0.5 && x <= 0.5 {
        1.0
    } else {
        0.0
    }
}

fn bilinear_weight(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn hamming_weight(x: f64) -> f64 {
    let x = x.abs();
    if x == 0.0 {
        return 1.0;
    }
    if x >= 1.0 {
        return 0.0;
    }
    let x = x * std::f64::consts::PI;
    // Pillow's constants are C float literals (0.54f, 0.46f), widened to double.
    x.sin() / x * (f64::from(0.54f32) + f64::from(0.46f32) * x.cos())
}

fn bicubic_weight(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

fn lanczos_weight(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Half of the last fixed-point unit: every sum starts from it, so `>>` rounds.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

#[inline(always)]
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One axis's taps: output `i` reads `len[i]` inputs from `start[i]`, weighted by
/// `k[i * ksize..][..len[i]]` (22-bit fixed point).
struct Taps {
    ksize: usize,
    start: Vec<usize>,
    len: Vec<usize>,
    k: Vec<i32>,
}

impl Taps {
    /// `precompute_coeffs` then `normalize_coeffs_8bpc`, for the outputs `outputs` of
    /// `out_size` (the whole resize's positions; see NOTE [Resizing a window]).
    fn new(
        in_size: usize,
        in0: f32,
        in1: f32,
        out_size: usize,
        kernel: Kernel,
        outputs: Range<usize>,
    ) -> Self {
        let scale = f64::from(in1 - in0) / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = kernel.support * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let inv = 1.0 / filterscale;
        let mut start = Vec::with_capacity(outputs.len());
        let mut len = Vec::with_capacity(outputs.len());
        let mut k = vec![0i32; outputs.len() * ksize];
        let mut w = vec![0f64; ksize];
        for (i, row) in outputs.zip(k.chunks_exact_mut(ksize)) {
            let center = f64::from(in0) + (i as f64 + 0.5) * scale;
            // C's (int) truncates toward zero; `as` does too (values are far from i32's ends).
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
            let n = (xmax - xmin).max(0) as usize;
            let mut ww = 0.0;
            for (x, wx) in w[..n].iter_mut().enumerate() {
                *wx = (kernel.weight)(((x as i64 + xmin) as f64 - center + 0.5) * inv);
                ww += *wx;
            }
            for (kx, &wx) in row.iter_mut().zip(&w[..n]) {
                let wx = if ww != 0.0 { wx / ww } else { wx };
                let scaled = wx * f64::from(1u32 << PRECISION_BITS);
                *kx = if wx < 0.0 {
                    (-0.5 + scaled) as i32
                } else {
                    (0.5 + scaled) as i32
                };
            }
            start.push(xmin as usize);
            len.push(n);
        }
        Self {
            ksize,
            start,
            len,
            k,
        }
    }

    /// The inputs any output reads, `first..end` (starts are monotonic, as Pillow assumes).
    fn span(&self) -> (usize, usize) {
        let last = self.start.len() - 1;
        (self.start[0], self.start[last] + self.len[last])
    }

    /// Inputs counted from `first`: the taps of pixels that start there.
    fn shift(&mut self, first: usize) {
        for s in &mut self.start {
            *s -= first;
        }
    }

    #[inline(always)]
    fn coeffs(&self, i: usize) -> &[i32] {
        &self.k[i * self.ksize..i * self.ksize + self.len[i]]
    }
}

// NOTE [Fast paths of the passes]
//
// Every path below computes the same i32 sums (integer addition is exact, and wraps alike in
// every path, so neither the order of the taps nor extra taps of weight 0 change a byte); they
// differ only in speed.
// - The horizontal pass reads a window per output pixel. `Windows` gives every output a window
//   of one fixed length (zero weights fill it, moved left where it would pass the row's end), so
//   the loops have constant bounds. With AVX2 two rows go at once, one per 128-bit half, and the
//   products are `vpmaddwd`s (i16 x i16, adjacent pairs summed into i32): each weight is split
//   as k = hi * 2^15 + lo, lo = k & 0x7fff and hi = k >> 15 (both fit i16 for |k| < 2^30, which
//   `Windows::new` checks), and a pixel's sum is (sum of p * hi) << 15 + (sum of p * lo) + HALF.
//   An RGB window is read 4 pixels per 16-byte load and a `pshufb` lays out each pair of taps as
//   [R0 R1 G0 G1 B0 B1 0 0], so one `vpmaddwd` gives that pair's R, G, B sums; an L window is
//   read 8 pixels per 8-byte load and 4 outputs' lanes are summed with `vphaddd`. Outputs are
//   clipped 4 at a time by `vpackssdw` + `vpackuswb` (saturating: the same clamp as clip8).
//   Outputs whose loads would pass the row's end (a few at its right edge) take the scalar loop.
// - The vertical pass adds the taps' source rows into sums 32 bytes of a row at a time: with
//   AVX2, 4 registers of i32 sums (`vpmulld`) held across all taps, then clipped and packed; the
//   baseline build runs a plain loop over a reused row of sums.

/// Rows `first..first + rows` of `src`, each resampled to `out_w` pixels.
fn horizontal_pass(src: &View<'_>, first: usize, rows: usize, out_w: usize, taps: &Taps) -> Image {
    let bands = src.bands;
    let row_out = out_w * bands;
    let mut out = vec![0u8; row_out * rows];
    if out.is_empty() {
        return Image::from_vec(out_w, rows, bands, out);
    }
    let Some(windows) = Windows::new(taps, src.width, bands) else {
        for (y, out_row) in out.chunks_exact_mut(row_out).enumerate() {
            let in_row = src.row(first + y);
            match bands {
                3 => horizontal_row::<3>(in_row, out_row, taps),
                _ => horizontal_row::<1>(in_row, out_row, taps),
            }
        }
        return Image::from_vec(out_w, rows, bands, out);
    };
    let mut pairs = out.chunks_exact_mut(2 * row_out);
    let mut y = first;
    for pair in &mut pairs {
        let (a, b) = pair.split_at_mut(row_out);
        windows.rows(src.row(y), src.row(y + 1), a, Some(b));
        y += 2;
    }
    let last = pairs.into_remainder();
    if !last.is_empty() {
        windows.rows(src.row(y), src.row(y), last, None);
    }
    Image::from_vec(out_w, rows, bands, out)
}

/// Any number of taps per output: the plain loop, as Pillow writes it.
fn horizontal_row<const B: usize>(in_row: &[u8], out_row: &mut [u8], taps: &Taps) {
    for (i, px) in out_row.chunks_exact_mut(B).enumerate() {
        let k = taps.coeffs(i);
        let start = taps.start[i] * B;
        let input = &in_row[start..start + k.len() * B];
        let mut sum = [HALF; B];
        for (p, &kx) in input.chunks_exact(B).zip(k) {
            for c in 0..B {
                sum[c] += i32::from(p[c]) * kx;
            }
        }
        for c in 0..B {
            px[c] = clip8(sum[c]);
        }
    }
}

/// The horizontal taps laid out for loops of one fixed length: every output reads exactly `n`
/// inputs (the most any output reads), its window moved left where it would pass the row's
/// end, with weight 0 on the inputs it does not use. Loops whose length is a constant unroll
/// and lose their bounds checks.
struct Windows {
    n: usize,
    bands: usize,
    start: Vec<usize>,
    k: Vec<i32>,
    /// The weights as the AVX2 loops read them (see the NOTE), `simd_stride` per output: RGB,
    /// per pair of taps, the pair's `lo` halves then its `hi` halves, each as two i16 in an i32;
    /// L, per 8 taps, their 8 `lo` then their 8 `hi` as i16, 8 i32 in all. Empty where a weight
    /// does not split into two i16.
    simd_k: Vec<i32>,
    simd_stride: usize,
    /// Outputs `..simd_end` are those whose AVX2 loads stay inside the row (starts only grow).
    simd_end: usize,
}

/// The longest window with a loop of its own; longer ones take `horizontal_row`.
const MAX_WINDOW: usize = 16;

/// `k` as (k & 0x7fff, k >> 15), the halves the AVX2 loops multiply; None where `k >> 15` does
/// not fit i16.
fn split_weight(k: i32) -> Option<(i16, i16)> {
    Some(((k & 0x7fff) as i16, i16::try_from(k >> 15).ok()?))
}

/// Two i16 as the lanes of one i32 (`a` in the low half, as `vpmaddwd` reads memory).
fn two_i16(a: i16, b: i16) -> i32 {
    (u32::from(a as u16) | u32::from(b as u16) << 16) as i32
}

impl Windows {
    fn new(taps: &Taps, in_size: usize, bands: usize) -> Option<Self> {
        let n = taps.len.iter().copied().max().unwrap_or(0);
        if n == 0 || n > in_size || n > MAX_WINDOW {
            return None;
        }
        let outputs = taps.start.len();
        let mut start = Vec::with_capacity(outputs);
        let mut k = vec![0i32; outputs * n];
        for (i, row) in k.chunks_exact_mut(n).enumerate() {
            let s = taps.start[i].min(in_size - n);
            let shift = taps.start[i] - s;
            let coeffs = taps.coeffs(i);
            row[shift..shift + coeffs.len()].copy_from_slice(coeffs);
            start.push(s);
        }
        let (simd_k, simd_stride, simd_end) =
            Self::simd_weights(&k, n, bands, &start, in_size).unwrap_or_default();
        Some(Self {
            n,
            bands,
            start,
            k,
            simd_k,
            simd_stride,
            simd_end,
        })
    }

    /// `simd_k`, `simd_stride` and `simd_end` (see the fields), or None where a weight does not
    /// split.
    fn simd_weights(
        k: &[i32],
        n: usize,
        bands: usize,
        start: &[usize],
        in_size: usize,
    ) -> Option<(Vec<i32>, usize, usize)> {
        let tap = |row: &[i32], j: usize| split_weight(row.get(j).copied().unwrap_or(0));
        let mut simd_k = Vec::new();
        if bands == 3 {
            let pairs = n.div_ceil(2);
            simd_k.reserve(k.len() / n * pairs * 2);
            for row in k.chunks_exact(n) {
                for p in 0..pairs {
                    let ((lo0, hi0), (lo1, hi1)) = (tap(row, 2 * p)?, tap(row, 2 * p + 1)?);
                    simd_k.extend([two_i16(lo0, lo1), two_i16(hi0, hi1)]);
                }
            }
            // 16-byte loads every 4 pixels (12 bytes).
            let last_load = (pairs - 1) / 2 * 12 + 16;
            let end = start.partition_point(|&s| s * 3 + last_load <= in_size * 3);
            Some((simd_k, pairs * 2, end))
        } else {
            let eights = n.div_ceil(8);
            simd_k.reserve(k.len() / n * eights * 8);
            for row in k.chunks_exact(n) {
                for e in 0..eights {
                    let mut lo = [0i16; 8];
                    let mut hi = [0i16; 8];
                    for j in 0..8 {
                        (lo[j], hi[j]) = tap(row, 8 * e + j)?;
                    }
                    simd_k.extend(lo.chunks_exact(2).map(|l| two_i16(l[0], l[1])));
                    simd_k.extend(hi.chunks_exact(2).map(|h| two_i16(h[0], h[1])));
                }
            }
            // 8-byte loads every 8 pixels.
            let end = start.partition_point(|&s| s + eights * 8 <= in_size);
            Some((simd_k, eights * 8, end))
        }
    }

    /// One row (`in_row` to `out_row`).
    #[cfg(test)]
    fn row(&self, in_row: &[u8], out_row: &mut [u8]) {
        self.rows(in_row, in_row, out_row, None);
    }

    /// `in_a` to `out_a` and, where `out_b` is given, `in_b` to it.
    fn rows(&self, in_a: &[u8], in_b: &[u8], out_a: &mut [u8], out_b: Option<&mut [u8]>) {
        #[cfg(target_arch = "x86_64")]
        if !self.simd_k.is_empty() && std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked on the line above.
            unsafe { avx2::window_rows(self, in_a, in_b, out_a, out_b) };
            return;
        }
        self.scalar_row(in_a, out_a);
        if let Some(out_b) = out_b {
            self.scalar_row(in_b, out_b);
        }
    }

    fn scalar_row(&self, in_row: &[u8], out_row: &mut [u8]) {
        match self.bands {
            3 => self.scalar_row_of::<3>(in_row, out_row),
            _ => self.scalar_row_of::<1>(in_row, out_row),
        }
    }

    fn scalar_row_of<const B: usize>(&self, in_row: &[u8], out_row: &mut [u8]) {
        macro_rules! fixed {
            ($($n:literal)*) => {
                match self.n {
                    $($n => self.fixed_row::<B, $n>(in_row, out_row),)*
                    _ => unreachable!("windows are 1..=MAX_WINDOW long"),
                }
            };
        }
        fixed!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    fn fixed_row<const B: usize, const N: usize>(&self, in_row: &[u8], out_row: &mut [u8]) {
        let outputs = out_row
            .chunks_exact_mut(B)
            .zip(&self.start)
            .zip(self.k.chunks_exact(N));
        for ((px, &start), k) in outputs {
            let input = &in_row[start * B..start * B + N * B];
            let k: &[i32; N] = k.try_into().expect("windows of N");
            let mut sum = [HALF; B];
            for (p, &kj) in input.chunks_exact(B).zip(k) {
                for c in 0..B {
                    sum[c] += i32::from(p[c]) * kj;
                }
            }
            for c in 0..B {
                px[c] = clip8(sum[c]);
            }
        }
    }

    /// Output pixels `from..` of a row, any window length (the AVX2 loops' end of the row).
    #[cfg(target_arch = "x86_64")]
    fn pixels_from<const B: usize>(&self, in_row: &[u8], from: usize, out_row: &mut [u8]) {
        for (i, px) in out_row.chunks_exact_mut(B).enumerate().skip(from) {
            let (start, k) = (self.start[i] * B, &self.k[i * self.n..(i + 1) * self.n]);
            let mut sum = [HALF; B];
            for (p, &kj) in in_row[start..start + self.n * B].chunks_exact(B).zip(k) {
                for c in 0..B {
                    sum[c] += i32::from(p[c]) * kj;
                }
            }
            for c in 0..B {
                px[c] = clip8(sum[c]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{clip8, Taps, View, Windows, HALF, PRECISION_BITS};

    /// `Windows::rows` with `vpmaddwd` (see NOTE [Fast paths of the passes]).
    ///
    /// # Safety
    /// The CPU must support AVX2; `w.simd_k` must not be empty.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn window_rows(
        w: &Windows,
        in_a: &[u8],
        in_b: &[u8],
        out_a: &mut [u8],
        out_b: Option<&mut [u8]>,
    ) {
        let rows = (in_a, in_b, out_a, out_b);
        if w.bands == 3 {
            match w.simd_stride / 2 {
                1 => groups::<Rgb<1>>(w, rows),
                2 => groups::<Rgb<2>>(w, rows),
                3 => groups::<Rgb<3>>(w, rows),
                4 => groups::<Rgb<4>>(w, rows),
                5 => groups::<Rgb<5>>(w, rows),
                6 => groups::<Rgb<6>>(w, rows),
                7 => groups::<Rgb<7>>(w, rows),
                8 => groups::<Rgb<8>>(w, rows),
                _ => unreachable!("windows are at most MAX_WINDOW long"),
            }
        } else {
            match w.simd_stride / 8 {
                1 => groups::<Gray<1>>(w, rows),
                2 => groups::<Gray<2>>(w, rows),
                _ => unreachable!("windows are at most MAX_WINDOW long"),
            }
        }
    }

    type Rows<'a, 'b> = (&'a [u8], &'a [u8], &'b mut [u8], Option<&'b mut [u8]>);

    /// 4 output pixels of two rows at once.
    trait Group {
        const BANDS: usize;
        /// Outputs `at[0..4]` of rows a (the low 128 bits) and b (the high ones), as bytes
        /// clipped and packed to the start of each half.
        unsafe fn group(w: &Windows, a: &[u8], b: &[u8], at: [usize; 4]) -> __m256i;
    }

    /// Every output of the rows: groups of 4 up to `w.simd_end`, then the scalar loop.
    #[inline(always)]
    unsafe fn groups<G: Group>(w: &Windows, (in_a, in_b, out_a, mut out_b): Rows<'_, '_>) {
        let b = G::BANDS;
        let pixels = out_a.len() / b;
        let end = w.simd_end.min(pixels);
        let mut i = 0;
        while i < end {
            let last = end - 1;
            let at = [i, (i + 1).min(last), (i + 2).min(last), (i + 3).min(last)];
            let v = G::group(w, in_a, in_b, at);
            let bytes = (end - i).min(4) * b;
            store(out_a, i * b, bytes, _mm256_castsi256_si128(v));
            if let Some(out_b) = out_b.as_deref_mut() {
                store(out_b, i * b, bytes, _mm256_extracti128_si256::<1>(v));
            }
            i += 4;
        }
        // Every output from `end` on is written below, over what the 16-byte stores left there.
        match b {
            3 => w.pixels_from::<3>(in_a, end, out_a),
            _ => w.pixels_from::<1>(in_a, end, out_a),
        }
        if let Some(out_b) = out_b {
            match b {
                3 => w.pixels_from::<3>(in_b, end, out_b),
                _ => w.pixels_from::<1>(in_b, end, out_b),
            }
        }
    }

    /// The first `bytes` of `v` to `out[at..]`: with one 16-byte store where the row has room
    /// (the bytes after `bytes` belong to later outputs, written after), else through a copy.
    #[inline(always)]
    unsafe fn store(out: &mut [u8], at: usize, bytes: usize, v: __m128i) {
        if let Some(to) = out.get_mut(at..at + 16) {
            // SAFETY: `to` is 16 bytes; storeu needs no alignment.
            _mm_storeu_si128(to.as_mut_ptr().cast(), v);
        } else {
            let mut all = [0u8; 16];
            // SAFETY: `all` is 16 bytes.
            _mm_storeu_si128(all.as_mut_ptr().cast(), v);
            out[at..at + bytes].copy_from_slice(&all[..bytes]);
        }
    }

    /// 16 bytes of row a at `at` in the low half, of row b in the high one.
    #[inline(always)]
    unsafe fn load16(a: &[u8], b: &[u8], at: usize) -> __m256i {
        let (a, b) = (&a[at..at + 16], &b[at..at + 16]);
        // SAFETY: `a` and `b` are 16 bytes; loadu needs no alignment.
        let (a, b) = (
            _mm_loadu_si128(a.as_ptr().cast()),
            _mm_loadu_si128(b.as_ptr().cast()),
        );
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b)
    }

    /// 8 bytes of row a at `at` in the low half, of row b in the high one, widened to i16.
    #[inline(always)]
    unsafe fn load8_wide(a: &[u8], b: &[u8], at: usize) -> __m256i {
        let (a, b) = (&a[at..at + 8], &b[at..at + 8]);
        // SAFETY: `a` and `b` are 8 bytes, the bytes loadl reads; it needs no alignment.
        let (a, b) = (
            _mm_loadl_epi64(a.as_ptr().cast()),
            _mm_loadl_epi64(b.as_ptr().cast()),
        );
        let x = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b);
        _mm256_unpacklo_epi8(x, _mm256_setzero_si256())
    }

    /// RGB windows of `P` pairs of taps.
    struct Rgb<const P: usize>;

    impl<const P: usize> Rgb<P> {
        /// Output `i`'s sums >> PRECISION_BITS: [R G B 0] in each half.
        #[inline(always)]
        unsafe fn pixel(w: &Windows, a: &[u8], b: &[u8], i: usize) -> __m256i {
            let at = w.start[i] * 3;
            let k = &w.simd_k[i * 2 * P..(i + 1) * 2 * P];
            // Taps 0, 1 and taps 2, 3 of 4 pixels as [R0 R1 G0 G1 B0 B1 0 0] in i16.
            #[rustfmt::skip]
            let pair = [
                _mm256_setr_epi8(
                    0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                    0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                ),
                _mm256_setr_epi8(
                    6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
                    6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
                ),
            ];
            let mut lo = _mm256_set1_epi32(HALF);
            let mut hi = _mm256_setzero_si256();
            let mut four = _mm256_setzero_si256();
            for p in 0..P {
                if p % 2 == 0 {
                    four = load16(a, b, at + p / 2 * 12);
                }
                let taps = _mm256_shuffle_epi8(four, pair[p % 2]);
                let (k_lo, k_hi) = (k[2 * p], k[2 * p + 1]);
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(taps, _mm256_set1_epi32(k_lo)));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(taps, _mm256_set1_epi32(k_hi)));
            }
            let sum = _mm256_add_epi32(_mm256_slli_epi32::<15>(hi), lo);
            _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(sum)
        }
    }

    impl<const P: usize> Group for Rgb<P> {
        const BANDS: usize = 3;

        #[inline(always)]
        unsafe fn group(w: &Windows, a: &[u8], b: &[u8], at: [usize; 4]) -> __m256i {
            let v0 = Self::pixel(w, a, b, at[0]);
            let v1 = Self::pixel(w, a, b, at[1]);
            let v2 = Self::pixel(w, a, b, at[2]);
            let v3 = Self::pixel(w, a, b, at[3]);
            let rgb0 = _mm256_packs_epi32(v0, v1);
            let rgb1 = _mm256_packs_epi32(v2, v3);
            // [R G B 0] x 4 as bytes, clamped to 0..=255; then the 0s dropped.
            let rgb = _mm256_packus_epi16(rgb0, rgb1);
            #[rustfmt::skip]
            let drop = _mm256_setr_epi8(
                0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
            );
            _mm256_shuffle_epi8(rgb, drop)
        }
    }

    /// L windows of `E` times 8 taps.
    struct Gray<const E: usize>;

    impl<const E: usize> Gray<E> {
        /// Output `i`'s sum without HALF, in 4 parts in each half.
        #[inline(always)]
        unsafe fn pixel(w: &Windows, a: &[u8], b: &[u8], i: usize) -> __m256i {
            let at = w.start[i];
            let k = &w.simd_k[i * 8 * E..(i + 1) * 8 * E];
            let mut lo = _mm256_setzero_si256();
            let mut hi = _mm256_setzero_si256();
            for e in 0..E {
                let taps = load8_wide(a, b, at + 8 * e);
                let (k_lo, k_hi) = (&k[8 * e..8 * e + 4], &k[8 * e + 4..8 * e + 8]);
                // SAFETY: `k_lo` and `k_hi` are 4 i32, the 16 bytes read.
                let k_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(k_lo.as_ptr().cast()));
                let k_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(k_hi.as_ptr().cast()));
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(taps, k_lo));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(taps, k_hi));
            }
            _mm256_add_epi32(_mm256_slli_epi32::<15>(hi), lo)
        }
    }

    impl<const E: usize> Group for Gray<E> {
        const BANDS: usize = 1;

        #[inline(always)]
        unsafe fn group(w: &Windows, a: &[u8], b: &[u8], at: [usize; 4]) -> __m256i {
            let v0 = Self::pixel(w, a, b, at[0]);
            let v1 = Self::pixel(w, a, b, at[1]);
            let v2 = Self::pixel(w, a, b, at[2]);
            let v3 = Self::pixel(w, a, b, at[3]);
            // [sum0 sum1 sum2 sum3] in each half.
            let sums = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
            let sums = _mm256_add_epi32(sums, _mm256_set1_epi32(HALF));
            let px = _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(sums);
            let px = _mm256_packs_epi32(px, px);
            _mm256_packus_epi16(px, px)
        }
    }

    #[inline(always)]
    unsafe fn shift(sum: __m256i) -> __m256i {
        _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(sum)
    }

    /// `super::vertical_rows` 32 bytes at a time, the sums in registers.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn vertical_rows(src: &View<'_>, taps: &Taps, out: &mut [u8]) {
        let row_len = src.width * src.bands;
        // Bytes 4 * i..4 * i + 4 of each half: one register of sums each.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (y, out_row) in out.chunks_exact_mut(row_len).enumerate() {
            let k = taps.coeffs(y);
            let first = taps.start[y];
            let mut x = 0;
            while x + 32 <= row_len {
                let mut acc = [_mm256_set1_epi32(HALF); 4];
                for (j, &kj) in k.iter().enumerate() {
                    let row = &src.row(first + j)[x..x + 32];
                    let kj = _mm256_set1_epi32(kj);
                    for (q, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: 8 bytes of `row`, the bytes loadl reads.
                        let p = _mm_loadl_epi64(row[8 * q..8 * q + 8].as_ptr().cast());
                        let p = _mm256_cvtepu8_epi32(p);
                        *acc = _mm256_add_epi32(*acc, _mm256_mullo_epi32(p, kj));
                    }
                }
                let [a0, a1, a2, a3] = acc;
                let lo = _mm256_packs_epi32(shift(a0), shift(a1));
                let hi = _mm256_packs_epi32(shift(a2), shift(a3));
                let px = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(lo, hi), order);
                // SAFETY: 32 bytes of `out_row`; storeu needs no alignment.
                _mm256_storeu_si256(out_row[x..x + 32].as_mut_ptr().cast(), px);
                x += 32;
            }
            for (x, o) in out_row.iter_mut().enumerate().skip(x) {
                let mut sum = HALF;
                for (j, &kj) in k.iter().enumerate() {
                    sum += i32::from(src.row(first + j)[x]) * kj;
                }
                *o = clip8(sum);
            }
        }
    }
}

/// Every column of `src` resampled to `out_h` rows; `taps` index `src`'s rows.
fn vertical_pass(src: &View<'_>, out_h: usize, taps: &Taps) -> Image {
    let mut out = vec![0u8; src.width * src.bands * out_h];
    if !out.is_empty() {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked on the line above.
            unsafe { avx2::vertical_rows(src, taps, &mut out) };
            return Image::from_vec(src.width, out_h, src.bands, out);
        }
        vertical_rows(src, taps, &mut out);
    }
    Image::from_vec(src.width, out_h, src.bands, out)
}

/// The vertical pass's plain loop.
fn vertical_rows(src: &View<'_>, taps: &Taps, out: &mut [u8]) {
    let row_len = src.width * src.bands;
    // One row of sums, reused: each tap adds a whole source row to it.
    let mut acc = vec![0i32; row_len];
    for (y, out_row) in out.chunks_exact_mut(row_len).enumerate() {
        acc.fill(HALF);
        let k = taps.coeffs(y);
        for (j, &kx) in k.iter().enumerate() {
            let in_row = src.row(taps.start[y] + j);
            for (a, &p) in acc.iter_mut().zip(in_row) {
                *a += i32::from(p) * kx;
            }
        }
        for (o, &a) in out_row.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NEAREST

/// Geometry.c's COORD: -1 for negatives (so that -0.5 is outside too), else truncation.
#[inline]
fn coord(v: f64) -> i64 {
    if v < 0.0 {
        -1
    } else {
        v as i64
    }
}

#[inline(always)]
fn copy_columns<const B: usize>(in_row: &[u8], out: &mut [u8], table: &[usize]) {
    for (px, &x) in out.chunks_exact_mut(B).zip(table) {
        px.copy_from_slice(&in_row[x * B..x * B + B]);
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::SplitMix64;

    use super::*;

    fn gradient(w: usize, h: usize, bands: usize) -> Image {
        let data = (0..w * h * bands).map(|i| (i * 37 % 251) as u8).collect();
        Image::from_vec(w, h, bands, data)
    }

    #[test]
    fn same_size_full_box_is_a_copy() {
        let img = gradient(7, 5, 3);
        for f in [Filter::Nearest, Filter::Bilinear, Filter::Lanczos] {
            assert_eq!(resize(&img, 7, 5, f, [0.0, 0.0, 7.0, 5.0]), img);
        }
    }

    #[test]
    fn whole_pixel_box_of_the_output_size_is_a_crop() {
        let img = gradient(9, 8, 1);
        let out = resize(&img, 3, 2, Filter::Bicubic, [4.0, 5.0, 7.0, 7.0]);
        assert_eq!(out, crate::geometry::crop(&img, 4, 5, 7, 7));
    }

    #[test]
    fn bilinear_coefficients_sum_to_one_in_fixed_point() {
        let taps = Taps::new(500, 0.0, 500.0, 224, Kernel::of(Filter::Bilinear), 0..224);
        for i in 0..224 {
            let sum: i32 = taps.coeffs(i).iter().sum();
            assert!(
                (sum - (1 << PRECISION_BITS)).abs() <= taps.len[i] as i32,
                "{i}: {sum}"
            );
        }
    }

    /// The scalar, fixed-window and AVX2 loops give the same bytes (the golden cases only run
    /// the fastest the test machine has).
    #[test]
    fn every_horizontal_loop_agrees() {
        let mut state = 12345u32;
        let row: Vec<u8> = (0..3 * 97)
            .map(|_| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (state >> 16) as u8
            })
            .collect();
        for filter in [
            Filter::Box,
            Filter::Bilinear,
            Filter::Hamming,
            Filter::Bicubic,
            Filter::Lanczos,
        ] {
            for (in_w, out_w, box0, box1) in [
                (97, 31, 0.0, 97.0),
                (97, 200, 0.0, 97.0),
                (50, 7, 3.5, 41.25),
                (9, 9, 0.5, 9.0),
            ] {
                let taps = Taps::new(in_w, box0, box1, out_w, Kernel::of(filter), 0..out_w);
                for bands in [1, 3] {
                    let input = &row[..in_w * bands];
                    let mut want = vec![0u8; out_w * bands];
                    let mut got = vec![0u8; out_w * bands];
                    let case = format!("{filter:?} {in_w}->{out_w} bands {bands}");
                    // Lanczos at 97 -> 31 reads 19 pixels: no fixed windows, nothing to compare.
                    let Some(windows) = Windows::new(&taps, in_w, bands) else {
                        continue;
                    };
                    if bands == 3 {
                        horizontal_row::<3>(input, &mut want, &taps);
                        windows.scalar_row(input, &mut got);
                        assert_eq!(got, want, "{case}");
                        windows.row(input, &mut got);
                    } else {
                        horizontal_row::<1>(input, &mut want, &taps);
                        windows.scalar_row(input, &mut got);
                        assert_eq!(got, want, "{case}");
                        windows.row(input, &mut got);
                    }
                    assert_eq!(got, want, "{case} (fastest loop)");
                }
            }
        }
    }

    /// The randomised comparisons' draws: rand_xoshiro's SplitMix64 from a fixed seed (as the
    /// fuzz harnesses draw, `rust/test-support/fuzz_rng.rs`).
    struct Draws(SplitMix64);

    impl Draws {
        fn new(seed: u64) -> Self {
            Draws(SplitMix64::seed_from_u64(seed))
        }

        fn below(&mut self, n: usize) -> usize {
            self.0.random_range(0..n)
        }

        /// Bytes mostly random, some rows all 0 or all 255 (the largest sums of each sign).
        fn row(&mut self, len: usize) -> Vec<u8> {
            match self.below(8) {
                0 => vec![255; len],
                1 => vec![0; len],
                2 => (0..len).map(|i| if i % 2 == 0 { 255 } else { 0 }).collect(),
                _ => (0..len).map(|_| self.below(256) as u8).collect(),
            }
        }
    }

    /// The fastest horizontal loop this machine has (two rows at once, and one alone) against
    /// Pillow's plain loop, over random sizes, boxes (windows at both ends of the row), filters
    /// and bands: a wrong lane, pair of taps or overflow shows as a byte that differs.
    #[test]
    fn fast_horizontal_rows_match_the_plain_loop() {
        let mut rng = Draws::new(7);
        let filters = [
            Filter::Box,
            Filter::Bilinear,
            Filter::Hamming,
            Filter::Bicubic,
            Filter::Lanczos,
        ];
        let mut compared = 0;
        for case in 0..3000 {
            let in_w = 1 + rng.below(if case % 4 == 0 { 400 } else { 60 });
            let out_w = 1 + rng.below(3 * in_w.min(60) + 4);
            let x0 = rng.below(in_w) as f32 + rng.below(4) as f32 / 4.0;
            let x0 = if case % 3 == 0 {
                0.0
            } else {
                x0.min(in_w as f32)
            };
            let x1 = x0 + (in_w as f32 - x0) * (1 + rng.below(8)) as f32 / 8.0;
            let filter = filters[case % filters.len()];
            let taps = Taps::new(in_w, x0, x1, out_w, Kernel::of(filter), 0..out_w);
            for bands in [1, 3] {
                let Some(windows) = Windows::new(&taps, in_w, bands) else {
                    continue;
                };
                let (a, b) = (rng.row(in_w * bands), rng.row(in_w * bands));
                let mut want_a = vec![0u8; out_w * bands];
                let mut want_b = vec![0u8; out_w * bands];
                if bands == 3 {
                    horizontal_row::<3>(&a, &mut want_a, &taps);
                    horizontal_row::<3>(&b, &mut want_b, &taps);
                } else {
                    horizontal_row::<1>(&a, &mut want_a, &taps);
                    horizontal_row::<1>(&b, &mut want_b, &taps);
                }
                let what = format!("{filter:?} {in_w}->{out_w} box {x0}..{x1} bands {bands}");
                let mut got_a = vec![0u8; out_w * bands];
                let mut got_b = vec![0u8; out_w * bands];
                windows.rows(&a, &b, &mut got_a, Some(&mut got_b));
                assert_eq!(got_a, want_a, "{what}, row a of two");
                assert_eq!(got_b, want_b, "{what}, row b of two");
                let mut got = vec![0u8; out_w * bands];
                windows.row(&b, &mut got);
                assert_eq!(got, want_b, "{what}, one row");
                compared += usize::from(windows.simd_end > 0);
            }
        }
        // Most cases must reach the vector loops (where the machine has them).
        assert!(
            compared > 3000,
            "only {compared} cases used the vector loops"
        );
    }

    /// The vertical pass's loops (AVX2 where the machine has it, and the plain one) against a
    /// sum per byte, over random sizes, boxes and filters.
    #[test]
    fn fast_vertical_rows_match_the_plain_loop() {
        let mut rng = Draws::new(11);
        for case in 0..600 {
            let filter = [
                Filter::Box,
                Filter::Bilinear,
                Filter::Hamming,
                Filter::Bicubic,
                Filter::Lanczos,
            ][case % 5];
            let (width, bands) = (1 + rng.below(70), [1, 3][case % 2]);
            let in_h = 1 + rng.below(40);
            let out_h = 1 + rng.below(3 * in_h + 2);
            let y0 = if case % 3 == 0 {
                0.0
            } else {
                rng.below(in_h) as f32 / 2.0
            };
            let y1 = y0 + (in_h as f32 - y0) * (1 + rng.below(4)) as f32 / 4.0;
            let taps = Taps::new(in_h, y0, y1, out_h, Kernel::of(filter), 0..out_h);
            let data = rng.row(width * in_h * bands);
            let img = Image::from_vec(width, in_h, bands, data);
            let view = View::whole(&img);
            let row_len = width * bands;
            let mut want = vec![0u8; row_len * out_h];
            for (y, out_row) in want.chunks_exact_mut(row_len).enumerate() {
                for (x, o) in out_row.iter_mut().enumerate() {
                    let mut sum = HALF;
                    for (j, &k) in taps.coeffs(y).iter().enumerate() {
                        sum += i32::from(view.row(taps.start[y] + j)[x]) * k;
                    }
                    *o = clip8(sum);
                }
            }
            let what = format!("{filter:?} {width}x{in_h}->{out_h} bands {bands}");
            assert_eq!(vertical_pass(&view, out_h, &taps).data, want, "{what}");
            let mut plain = vec![0u8; row_len * out_h];
            vertical_rows(&view, &taps, &mut plain);
            assert_eq!(plain, want, "{what}, plain loop");
        }
    }

    #[test]
    #[should_panic(expected = "box can't exceed original image size")]
    fn box_past_the_image_panics() {
        resize(&gradient(4, 4, 1), 2, 2, Filter::Box, [0.0, 0.0, 4.5, 4.0]);
    }
}
