//! A sample's steps, as the caller drew them, run in one pass from file bytes to the output.
//!
//! The caller (rloader.vision) reads the transform pipeline once and, per sample, draws its
//! random parameters exactly as torchvision would (same generator, same order), so what comes
//! here is fixed: which crops, resizes and flips, in order, and what the pixels become.

use crate::decode::{self, Header, NotHandled, Region};
use crate::geometry;
use crate::image::Image;
use crate::resample::{self, Filter};
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
/// result into `out` as `output` says; `out` must be its exact size (`output_size`). Where
/// the steps start with a crop, only the part of the file the crop covers is decoded.
pub fn run(
    data: &[u8],
    header: &Header,
    scale_denom: usize,
    steps: &[Step],
    output: &Output<'_>,
    out: &mut [u8],
) -> Result<(), NotHandled> {
    let (width, height) = decode::scaled_size(header, scale_denom);
    let mut steps = steps.to_vec();
    let region = match steps.first() {
        Some(&Step::Crop {
            left,
            top,
            right,
            bottom,
        }) => covered(width, height, left, top, right, bottom),
        _ => None,
    };
    let decoded = decode::decode(data, header, scale_denom, region)?;
    if let Some(Step::Crop {
        left,
        top,
        right,
        bottom,
    }) = steps.first_mut()
    {
        // The crop in the decoded part's coordinates: what lies outside it lies outside the
        // image too, and stays black.
        let (dx, dy) = (decoded.x as i64, decoded.y as i64);
        (*left, *right, *top, *bottom) = (*left - dx, *right - dx, *top - dy, *bottom - dy);
    }
    let img = apply(decoded.image, &steps);
    match output {
        Output::Rgb => tensor::write_rgb(&img, out),
        Output::Chw(table) => tensor::write_chw(&img, table, out),
    }
    Ok(())
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
            Step::Resize {
                width,
                height,
                filter,
                bbox,
            } => resample::resize(&img, width, height, filter, bbox),
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
