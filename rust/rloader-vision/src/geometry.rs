//! Pillow's `Image.crop` (integer box, zeros outside the image), `transpose(FLIP_LEFT_RIGHT)`
//! and `transpose(FLIP_TOP_BOTTOM)`, and a crop-then-resize that does not copy the crop out.

use crate::image::Image;
use crate::resample::{resize_view, Filter, View};

/// Pillow's `img.crop((left, top, right, bottom))`: the box's pixels, black (0) where the box
/// leaves the image (`ImagingCrop` fills, then pastes the overlap).
///
/// # Panics
/// If `right < left` or `bottom < top` (Pillow raises ValueError).
pub fn crop(src: &Image, left: i64, top: i64, right: i64, bottom: i64) -> Image {
    assert!(right >= left, "Coordinate 'right' is less than 'left'");
    assert!(bottom >= top, "Coordinate 'lower' is less than 'upper'");
    let (w, h, b) = ((right - left) as usize, (bottom - top) as usize, src.bands);
    if let Some((l, t)) = inside(src, left, top, right, bottom) {
        return View::rect(src, l, t, w, h).copy_rect(0, 0, w, h);
    }
    let mut out = Image::new(w, h, b);
    // The overlap of the box with the image, in source coordinates.
    let x0 = left.clamp(0, src.width as i64);
    let x1 = right.clamp(0, src.width as i64);
    let y0 = top.clamp(0, src.height as i64);
    let y1 = bottom.clamp(0, src.height as i64);
    if x0 < x1 && y0 < y1 {
        let (n, dx) = ((x1 - x0) as usize * b, (x0 - left) as usize * b);
        for y in y0..y1 {
            let from = &src.row(y as usize)[x0 as usize * b..][..n];
            let to_row = (y - top) as usize * w * b;
            out.data[to_row + dx..to_row + dx + n].copy_from_slice(from);
        }
    }
    out
}

/// The box's top-left corner as indices when the box lies wholly inside the image.
fn inside(src: &Image, left: i64, top: i64, right: i64, bottom: i64) -> Option<(usize, usize)> {
    let fits = left >= 0 && top >= 0 && right <= src.width as i64 && bottom <= src.height as i64;
    fits.then_some((left as usize, top as usize))
}

/// Pillow's `img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)`, in place.
pub fn flip_left_right(img: &mut Image) {
    let (w, b) = (img.width, img.bands);
    if w == 0 {
        return;
    }
    for row in img.data.chunks_exact_mut(w * b) {
        match b {
            3 => reverse_pixels::<3>(row),
            1 => row.reverse(),
            _ => {
                for i in 0..w / 2 {
                    let j = w - 1 - i;
                    for c in 0..b {
                        row.swap(i * b + c, j * b + c);
                    }
                }
            }
        }
    }
}

fn reverse_pixels<const B: usize>(row: &mut [u8]) {
    let w = row.len() / B;
    let (left, right) = row.split_at_mut(w / 2 * B);
    // `right` holds the middle pixel (odd widths) first, then the mirror of `left`.
    let right = &mut right[(w % 2) * B..];
    for (a, z) in left
        .chunks_exact_mut(B)
        .zip(right.chunks_exact_mut(B).rev())
    {
        let t: [u8; B] = a.try_into().expect("B bytes");
        a.copy_from_slice(z);
        z.copy_from_slice(&t);
    }
}

/// Pillow's `img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)`, in place.
pub fn flip_top_bottom(img: &mut Image) {
    let (stride, h) = (img.width * img.bands, img.height);
    if stride == 0 {
        return;
    }
    let (top, bottom) = img.data.split_at_mut(h / 2 * stride);
    let bottom = &mut bottom[(h % 2) * stride..];
    for (a, z) in top
        .chunks_exact_mut(stride)
        .zip(bottom.chunks_exact_mut(stride).rev())
    {
        a.swap_with_slice(z);
    }
}

/// `crop(src, left, top, right, bottom)` then `resize(.., out_w, out_h, filter, full box)`, as
/// torchvision's `resized_crop` does on a PIL image; bit for bit the same bytes.
///
/// A crop inside the image is resampled where it lies (a view into `src`), not copied out. It is
/// NOT passed as Pillow's resize box over the whole source: that is a different computation.
/// With a box, the filter's support reaches source pixels beyond the box's edges (Pillow clamps
/// taps at the image's edges, not the box's), and positions are `box0 + (i + 0.5) * scale` in
/// f64 rather than `(i + 0.5) * scale`, so weights differ in their last bits; NEAREST's
/// accumulated `xo` starts at `box0 + a0 / 2` instead of `a0 / 2` and rounds differently too.
/// (Pillow 13, 50 random crops of a 160x120 picture: the box resize differs from crop + resize
/// in 50 of 50 for BILINEAR, HAMMING, BICUBIC and LANCZOS, 14 for NEAREST, 8 for BOX.)
/// The view keeps the crop's own edges and coordinates, so every filter matches crop + resize.
/// A crop reaching outside the image (zeros there) is copied out first.
///
/// # Panics
/// As `crop` and `resize`.
#[allow(clippy::too_many_arguments)]
pub fn crop_resize(
    src: &Image,
    left: i64,
    top: i64,
    right: i64,
    bottom: i64,
    out_w: usize,
    out_h: usize,
    filter: Filter,
) -> Image {
    assert!(right >= left, "Coordinate 'right' is less than 'left'");
    assert!(bottom >= top, "Coordinate 'lower' is less than 'upper'");
    let (w, h) = ((right - left) as usize, (bottom - top) as usize);
    let full = [0.0, 0.0, w as f64, h as f64];
    match inside(src, left, top, right, bottom) {
        Some((l, t)) => resize_view(&View::rect(src, l, t, w, h), out_w, out_h, filter, full),
        None => {
            let cropped = crop(src, left, top, right, bottom);
            resize_view(&View::whole(&cropped), out_w, out_h, filter, full)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(w: usize, h: usize, bands: usize) -> Image {
        Image::from_vec(
            w,
            h,
            bands,
            (0..w * h * bands).map(|i| (i % 256) as u8).collect(),
        )
    }

    #[test]
    fn crop_outside_the_image_is_black() {
        let img = numbered(3, 2, 1);
        let out = crop(&img, -1, -1, 2, 1);
        assert_eq!(out.data, vec![0, 0, 0, 0, 0, 1]);
        assert_eq!(crop(&img, 5, 5, 7, 6).data, vec![0, 0]);
    }

    #[test]
    fn flips_are_their_own_inverse() {
        for (w, h, b) in [(1, 1, 3), (4, 3, 3), (5, 2, 1), (2, 5, 3)] {
            let img = numbered(w, h, b);
            let mut f = img.clone();
            flip_left_right(&mut f);
            assert_eq!(f.data[..b], img.data[(w - 1) * b..w * b]);
            flip_left_right(&mut f);
            assert_eq!(f, img);
            flip_top_bottom(&mut f);
            assert_eq!(f.row(0), img.row(h - 1));
            flip_top_bottom(&mut f);
            assert_eq!(f, img);
        }
    }

    #[test]
    fn crop_resize_equals_crop_then_resize() {
        let img = numbered(40, 30, 3);
        for filter in Filter::ALL {
            for (l, t, r, b) in [(3, 4, 31, 29), (-3, 2, 20, 33), (0, 0, 40, 30)] {
                let cropped = crop(&img, l, t, r, b);
                let full = [0.0, 0.0, cropped.width as f64, cropped.height as f64];
                let want = crate::resample::resize(&cropped, 13, 17, filter, full);
                assert_eq!(
                    crop_resize(&img, l, t, r, b, 13, 17, filter),
                    want,
                    "{filter:?} {l} {t}"
                );
            }
        }
    }
}
