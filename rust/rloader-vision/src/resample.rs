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
// Every path below computes the same i32 sums (integer addition is exact, so neither the order
// of the taps nor extra taps of weight 0 change a byte); they differ only in speed.
// - The vertical pass adds whole source rows into a row of i32 sums: long contiguous loops the
//   compiler vectorises; built twice, for the baseline target and with AVX2 (8 lanes of
//   `vpmulld`; ~3x faster), chosen at run time.
// - The horizontal pass reads a window per output pixel. `Windows` gives every output a window
//   of one fixed length (zero weights fill it), so the loops have constant bounds. With AVX2, an
//   RGB window is read two pixels (6 bytes, loaded as 8) at a time against weights laid out
//   [k0 k0 k0 k1 k1 k1 0 0], and an L window 8 pixels at a time; pixels whose 8-byte loads would
//   pass the row's end take the scalar loop.

/// Rows `first..first + rows` of `src`, each resampled to `out_w` pixels.
fn horizontal_pass(src: &View<'_>, first: usize, rows: usize, out_w: usize, taps: &Taps) -> Image {
    let bands = src.bands;
    let mut out = vec![0u8; out_w * rows * bands];
    let windows = Windows::new(taps, src.width, bands);
    for (y, out_row) in out.chunks_exact_mut(out_w * bands).enumerate() {
        let in_row = src.row(first + y);
        match (bands, &windows) {
            (3, Some(w)) => w.row::<3>(in_row, out_row),
            (_, Some(w)) => w.row::<1>(in_row, out_row),
            (3, None) => horizontal_row::<3>(in_row, out_row, taps),
            (_, None) => horizontal_row::<1>(in_row, out_row, taps),
        }
    }
    Image::from_vec(out_w, rows, bands, out)
}

/// Any number of taps per output.
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
    start: Vec<usize>,
    k: Vec<i32>,
    /// The weights as the AVX2 loops read them (see the NOTE), `simd_stride` per output.
    simd_k: Vec<i32>,
    simd_stride: usize,
}

/// The longest window with a loop of its own; longer ones take `horizontal_row`.
const MAX_WINDOW: usize = 16;

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
        // RGB: 8 lanes per pair of pixels; L: 8 lanes per 8 pixels.
        let simd_stride = if bands == 3 {
            n.div_ceil(2) * 8
        } else {
            n.div_ceil(8) * 8
        };
        let mut simd_k = vec![0i32; outputs * simd_stride];
        for (row, lanes) in k.chunks_exact(n).zip(simd_k.chunks_exact_mut(simd_stride)) {
            for (j, &kj) in row.iter().enumerate() {
                if bands == 3 {
                    let at = j / 2 * 8 + j % 2 * 3;
                    lanes[at..at + 3].fill(kj);
                } else {
                    lanes[j] = kj;
                }
            }
        }
        Some(Self {
            n,
            start,
            k,
            simd_k,
            simd_stride,
        })
    }

    fn row<const B: usize>(&self, in_row: &[u8], out_row: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked on the line above.
            unsafe { avx2::window_row::<B>(self, in_row, out_row) };
            return;
        }
        self.scalar_row::<B>(in_row, out_row);
    }

    fn scalar_row<const B: usize>(&self, in_row: &[u8], out_row: &mut [u8]) {
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

    /// One output pixel, any window length (the AVX2 loops' fallback at the row's end).
    fn pixel<const B: usize>(&self, in_row: &[u8], i: usize, px: &mut [u8]) {
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{clip8, View, Windows, HALF};

    /// Eight bytes from `bytes[at..]`, widened to eight i32 lanes. Callers need AVX2 (both
    /// helpers inline into `window_row`).
    #[inline(always)]
    unsafe fn widen8(bytes: &[u8], at: usize) -> __m256i {
        let eight: [u8; 8] = bytes[at..at + 8].try_into().expect("8 bytes");
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(eight)))
    }

    #[inline(always)]
    unsafe fn lanes(k: &[i32]) -> __m256i {
        let k = &k[..8];
        // SAFETY: `k` is 8 i32, the 32 bytes read; loadu needs no alignment.
        _mm256_loadu_si256(k.as_ptr().cast())
    }

    /// `Windows::fixed_row` with 8 lanes of i32 products (see NOTE [Fast paths of the passes]):
    /// the row's sums first, then one vectorised clip of the whole row.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn window_row<const B: usize>(
        w: &Windows,
        in_row: &[u8],
        out_row: &mut [u8],
    ) {
        match w.simd_stride / 8 {
            1 => window_row_steps::<B, 1>(w, in_row, out_row),
            2 => window_row_steps::<B, 2>(w, in_row, out_row),
            3 => window_row_steps::<B, 3>(w, in_row, out_row),
            4 => window_row_steps::<B, 4>(w, in_row, out_row),
            5 => window_row_steps::<B, 5>(w, in_row, out_row),
            6 => window_row_steps::<B, 6>(w, in_row, out_row),
            7 => window_row_steps::<B, 7>(w, in_row, out_row),
            8 => window_row_steps::<B, 8>(w, in_row, out_row),
            _ => unreachable!("windows are at most MAX_WINDOW long"),
        }
    }

    /// `window_row` with `STEPS` loads of 8 bytes per window.
    #[inline(always)]
    unsafe fn window_row_steps<const B: usize, const STEPS: usize>(
        w: &Windows,
        in_row: &[u8],
        out_row: &mut [u8],
    ) {
        let stride = if B == 3 { 6 } else { 8 };
        // Bytes the 8-byte loads of one window span.
        let span = (STEPS - 1) * stride + 8;
        let pixels = out_row.len() / B;
        // One more than the row: an RGB pixel's sums are stored as 4 lanes.
        let mut sums = vec![0i32; out_row.len() + 1];
        let (init, fold) = if B == 3 {
            // lanes 0..3 += lanes 3..6: one pixel's R, G, B sums.
            (
                _mm256_setr_epi32(HALF, HALF, HALF, 0, 0, 0, 0, 0),
                _mm256_setr_epi32(3, 4, 5, 0, 0, 0, 0, 0),
            )
        } else {
            (
                _mm256_setr_epi32(HALF, 0, 0, 0, 0, 0, 0, 0),
                _mm256_setzero_si256(),
            )
        };
        let mut fallback = Vec::new();
        for i in 0..pixels {
            let at = w.start[i] * B;
            if at + span > in_row.len() {
                fallback.push(i);
                continue;
            }
            let k = &w.simd_k[i * STEPS * 8..(i + 1) * STEPS * 8];
            let window = &in_row[at..at + span];
            let mut acc = init;
            for step in 0..STEPS {
                let bytes = widen8(window, step * stride);
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(bytes, lanes(&k[step * 8..])));
            }
            if B == 3 {
                let rgb = _mm256_castsi256_si128(_mm256_add_epi32(
                    acc,
                    _mm256_permutevar8x32_epi32(acc, fold),
                ));
                let to = &mut sums[i * 3..i * 3 + 4];
                // SAFETY: `to` is 4 i32, the 16 bytes written; storeu needs no alignment.
                _mm_storeu_si128(to.as_mut_ptr().cast(), rgb);
            } else {
                let x = _mm_add_epi32(
                    _mm256_castsi256_si128(acc),
                    _mm256_extracti128_si256::<1>(acc),
                );
                let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b00_00_11_10>(x));
                let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b00_00_00_01>(x));
                sums[i] = _mm_cvtsi128_si32(x);
            }
        }
        for (o, &s) in out_row.iter_mut().zip(&sums) {
            *o = clip8(s);
        }
        for i in fallback {
            w.pixel::<B>(in_row, i, &mut out_row[i * B..i * B + B]);
        }
    }

    /// `vertical_rows` compiled with AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn vertical_rows(src: &View<'_>, taps: &super::Taps, out: &mut [u8]) {
        super::vertical_rows(src, taps, out);
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

#[inline(always)]
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
                        windows.scalar_row::<3>(input, &mut got);
                        assert_eq!(got, want, "{case}");
                        windows.row::<3>(input, &mut got);
                    } else {
                        horizontal_row::<1>(input, &mut want, &taps);
                        windows.scalar_row::<1>(input, &mut got);
                        assert_eq!(got, want, "{case}");
                        windows.row::<1>(input, &mut got);
                    }
                    assert_eq!(got, want, "{case} (fastest loop)");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "box can't exceed original image size")]
    fn box_past_the_image_panics() {
        resize(&gradient(4, 4, 1), 2, 2, Filter::Box, [0.0, 0.0, 4.5, 4.0]);
    }
}
