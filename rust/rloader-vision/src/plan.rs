//! A sample's steps, as the caller drew them, run in one pass from file bytes to the output.
//!
//! The caller (rloader.vision) reads the transform pipeline once and, per sample, draws its
//! random parameters exactly as torchvision would (same generator, same order), so what comes
//! here is fixed: which crops, resizes and flips, in order, and what the pixels become.

use crate::decode::{self, Format, Header, NotHandled, Region};
use crate::geometry;
use crate::image::Image;
use crate::resample::{self, Filter, Window, WindowedResize};
use crate::tensor::{self, Table};

/// One of Pillow's operations on the decoded image, with its arguments fixed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// `img.crop((left, top, right, bottom))`; outside the image is black.
    Crop {
        left: i64,
        top: i64,
        right: i64,
        bottom: i64,
    },
    /// `img.resize((width, height), filter, box)`.
    Resize {
        width: usize,
        height: usize,
        filter: Filter,
        bbox: [f64; 4],
    },
    /// `img.transpose(FLIP_LEFT_RIGHT)`.
    FlipLeftRight,
    /// `img.transpose(FLIP_TOP_BOTTOM)`.
    FlipTopBottom,
}

/// What the pixels become at the end of the steps.
pub enum Output<'a> {
    /// Pillow's "RGB" bytes, height x width x 3 (the pipeline goes on in torchvision).
    Rgb,
    /// A CHW tensor's bytes, each value through its channel's table.
    Chw(Table<'a>),
}

/// The size after the steps, from the decoded size.
pub fn output_size(mut width: usize, mut height: usize, steps: &[Step]) -> (usize, usize) {
    for step in steps {
        match *step {
            Step::Crop {
                left,
                top,
                right,
                bottom,
            } => {
                width = (right - left).max(0) as usize;
                height = (bottom - top).max(0) as usize;
            }
            Step::Resize {
                width: w,
                height: h,
                ..
            } => (width, height) = (w, h),
            Step::FlipLeftRight | Step::FlipTopBottom => {}
        }
    }
    (width, height)
}

/// Decodes `data` (whose header is `header`) at `1/scale_denom`, runs `steps` and writes the
/// result into `out` as `output` says; `out` must be its exact size (`output_size`). Only the
/// part of the file the first steps read is decoded: a leading crop's, or the source pixels a
/// leading resize (of which only a following crop's window is computed) reads.
pub fn run(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
    steps: &[Step],
    output: &Output<'_>,
    out: &mut [u8],
) -> Result<(), NotHandled> {
    let (width, height) = decode::scaled_size(header, scale_denom);
    let img = match *steps {
        [Step::Crop {
            left,
            top,
            right,
            bottom,
        }, ..] => {
            let region = covered(width, height, left, top, right, bottom);
            let decoded = decode::decode(data, header, scale_denom, region)?;
            // The crop in the decoded part's coordinates: what lies outside it lies outside
            // the image too, and stays black.
            let (dx, dy) = (decoded.x as i64, decoded.y as i64);
            let mut steps = steps.to_vec();
            steps[0] = Step::Crop {
                left: left - dx,
                top: top - dy,
                right: right - dx,
                bottom: bottom - dy,
            };
            apply(decoded.image, &steps)
        }
        [Step::Resize {
            width: w,
            height: h,
            filter,
            bbox,
        }, ref rest @ ..] => {
            let crop = rest.first().and_then(|c| CropOfResize::new(w, h, c));
            let (window, rest) = match &crop {
                Some(c) => (c.window, &rest[1..]),
                None => (Window::whole(w, h), rest),
            };
            let resize = WindowedResize::new((width, height), (w, h), filter, bbox, window);
            let s = resize.source();
            // Reading nothing (NEAREST past the image): the whole file is decoded, as Pillow
            // would, so that a corrupt one still fails.
            let region = (s.width > 0 && s.height > 0).then_some(Region {
                x: s.x,
                y: s.y,
                width: s.width,
                height: s.height,
            });
            let decoded = decode::decode(data, header, scale_denom, region)?;
            let img = resize.run(&decoded.image, decoded.x, decoded.y);
            let img = match &crop {
                Some(c) => c.place(img),
                None => img,
            };
            apply(img, rest)
        }
        _ => apply(
            decode::decode(data, header, scale_denom, None)?.image,
            steps,
        ),
    };
    match output {
        Output::Rgb => tensor::write_rgb(&img, out),
        Output::Chw(table) => tensor::write_chw(&img, table, out),
    }
    Ok(())
}

// NOTE [Draft]
//
// `run_draft` trades exactness for speed, as Pillow's `Image.draft` does for `thumbnail`: a
// JPEG is decoded at 1/2, 1/4 or 1/8 of its size in the DCT (libjpeg-turbo's scaling: far less
// IDCT, colour conversion and upsampling, and a resize with far fewer taps) where the steps
// reduce the picture at least that much anyway. Which scale: Pillow's rule, the largest d of
// 8, 4, 2 with d * out <= in on both axes (`scale = min(in_w // out_w, in_h // out_h)`), `in`
// the box the first resize reads (a leading crop's, for RandomResizedCrop) and `out` its size.
// The steps are then rewritten as Pillow's draft + resize would run them: decoded pixel i
// stands for pixels [i * d, (i + 1) * d) of the full-scale picture (libjpeg's size rounds up:
// ceil(w / d)), so the box becomes box / d, fractional, and the resize reads the scaled pixels
// with Pillow's box semantics. Sizes out are unchanged; pixels are close to exact (PSNR in
// benches/vision_draft.py), not equal. Only a JPEG whose steps start with a resize, or a crop
// inside the picture and a resize, is drafted; anything else runs exactly.

/// `run` with the JPEG decoded at a reduced scale where the steps allow (NOTE [Draft]):
/// approximately the same pixels, of the same size.
pub fn run_draft(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
    steps: &[Step],
    output: &Output<'_>,
    out: &mut [u8],
) -> Result<(), NotHandled> {
    match draft(header, scale_denom, steps) {
        Some((denom, steps)) => run(data, header, denom, &steps, output, out),
        None => run(data, header, scale_denom, steps, output, out),
    }
}

/// The scale a draft decodes at (a multiple of `scale_denom`, at most 8) and the steps over
/// that decode, for steps over the `1/scale_denom` decode; None where no draft applies
/// (NOTE [Draft]).
pub fn draft(header: &Header, scale_denom: usize, steps: &[Step]) -> Option<(usize, Vec<Step>)> {
    if header.format != Format::Jpeg {
        return None;
    }
    let (width, height) = decode::scaled_size(header, scale_denom);
    // The box the first resize reads, in the decoded image's pixels, and the steps after it.
    let (bbox, resize, rest) = match *steps {
        [Step::Crop {
            left,
            top,
            right,
            bottom,
        }, resize @ Step::Resize { bbox: b, .. }, ref rest @ ..]
            if left >= 0 && top >= 0 && right <= width as i64 && bottom <= height as i64 =>
        {
            let (l, t) = (left as f64, top as f64);
            ([l + b[0], t + b[1], l + b[2], t + b[3]], resize, rest)
        }
        [resize @ Step::Resize { bbox, .. }, ref rest @ ..] => (bbox, resize, rest),
        _ => return None,
    };
    let Step::Resize {
        width: out_w,
        height: out_h,
        filter,
        ..
    } = resize
    else {
        unreachable!("matched a resize above");
    };
    // Pillow's `draft`: the floor of each axis's reduction, then the largest scale it allows.
    let reduce = ((bbox[2] - bbox[0]) as usize / out_w).min((bbox[3] - bbox[1]) as usize / out_h);
    let d = [8, 4, 2]
        .into_iter()
        .find(|&d| d <= reduce && scale_denom * d <= 8)?;
    let mut drafted = vec![Step::Resize {
        width: out_w,
        height: out_h,
        filter,
        bbox: bbox.map(|v| v / d as f64),
    }];
    drafted.extend_from_slice(rest);
    Some((scale_denom * d, drafted))
}

/// The part of a `width` x `height` image a crop covers; None where it covers nothing (the
/// whole file is decoded then: a corrupt one must still fail as in Pillow).
fn covered(
    width: usize,
    height: usize,
    left: i64,
    top: i64,
    right: i64,
    bottom: i64,
) -> Option<Region> {
    let (x0, x1) = (left.clamp(0, width as i64), right.clamp(0, width as i64));
    let (y0, y1) = (top.clamp(0, height as i64), bottom.clamp(0, height as i64));
    (x1 > x0 && y1 > y0).then(|| Region {
        x: x0 as usize,
        y: y0 as usize,
        width: (x1 - x0) as usize,
        height: (y1 - y0) as usize,
    })
}

/// A crop of a resize's output, computed as a window of the resize: the crop's overlap with
/// the output (each output pixel depends only on its own taps: NOTE [Resizing a window]), then
/// black around it where the crop passes the output's edges, as Pillow's crop fills.
struct CropOfResize {
    window: Window,
    left: i64,
    top: i64,
    width: usize,
    height: usize,
}

impl CropOfResize {
    /// `step` as a crop of a `out_w` x `out_h` resize output; None where it is not a crop or
    /// overlaps nothing (the resize then runs whole, and the crop after it).
    fn new(out_w: usize, out_h: usize, step: &Step) -> Option<Self> {
        let Step::Crop {
            left,
            top,
            right,
            bottom,
        } = *step
        else {
            return None;
        };
        if right < left || bottom < top {
            return None; // the crop's own check panics, unfused
        }
        let r = covered(out_w, out_h, left, top, right, bottom)?;
        Some(Self {
            window: Window {
                x: r.x,
                y: r.y,
                width: r.width,
                height: r.height,
            },
            left,
            top,
            width: (right - left) as usize,
            height: (bottom - top) as usize,
        })
    }

    /// The crop, from the window's pixels.
    fn place(&self, img: Image) -> Image {
        if (img.width, img.height) == (self.width, self.height) {
            return img;
        }
        let b = img.bands;
        let mut out = Image::new(self.width, self.height, b);
        let dx = (self.window.x as i64 - self.left) as usize * b;
        let dy = (self.window.y as i64 - self.top) as usize;
        let n = img.width * b;
        for y in 0..img.height {
            let to = (dy + y) * self.width * b + dx;
            out.data[to..to + n].copy_from_slice(img.row(y));
        }
        out
    }
}

fn apply(mut img: Image, steps: &[Step]) -> Image {
    let mut rest = steps;
    while let Some((step, tail)) = rest.split_first() {
        rest = tail;
        img = match *step {
            // A crop a full-box resize follows: one pass, no copy of the crop.
            Step::Crop {
                left,
                top,
                right,
                bottom,
            } => match rest.first() {
                Some(&Step::Resize {
                    width,
                    height,
                    filter,
                    bbox,
                }) if bbox == [0.0, 0.0, (right - left) as f64, (bottom - top) as f64] => {
                    rest = &rest[1..];
                    geometry::crop_resize(&img, left, top, right, bottom, width, height, filter)
                }
                _ => geometry::crop(&img, left, top, right, bottom),
            },
            // A resize a crop follows: only the crop's window of it.
            Step::Resize {
                width,
                height,
                filter,
                bbox,
            } => match rest
                .first()
                .and_then(|c| CropOfResize::new(width, height, c))
            {
                Some(crop) => {
                    rest = &rest[1..];
                    let size = (img.width, img.height);
                    let resize =
                        WindowedResize::new(size, (width, height), filter, bbox, crop.window);
                    crop.place(resize.run(&img, 0, 0))
                }
                None => resample::resize(&img, width, height, filter, bbox),
            },
            Step::FlipLeftRight => {
                geometry::flip_left_right(&mut img);
                img
            }
            Step::FlipTopBottom => {
                geometry::flip_top_bottom(&mut img);
                img
            }
        };
    }
    img
}
