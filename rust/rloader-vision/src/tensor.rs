//! Pixels to a tensor's bytes: HWC bands to CHW planes, each value through a table.
//!
//! Every conversion torchvision makes from a uint8 image to its first tensor (`ToTensor`,
//! `PILToTensor`, `ToImage`, `ConvertImageDtype`, `ToDtype`, then `Normalize`) maps each
//! channel's byte to one output value on its own. So the caller computes, once per pipeline and
//! with torch itself, the value each of the 256 bytes becomes in each channel, and here each
//! pixel only looks its value up: the result is torch's by construction, whatever arithmetic
//! torch used (a division by 255, a multiplication by its float32 reciprocal, FMA or not).

use crate::image::{Image, ImageView};

/// The output values of each channel's 256 bytes: `channels * 256` values of `elem` bytes each
/// (native byte order, as the tensor holds them), channel-major.
pub struct Table<'a> {
    pub values: &'a [u8],
    pub elem: usize,
    pub channels: usize,
}

/// Writes `img` (1 or 3 bands; an `&Image` or a view of borrowed bytes) into `out` as
/// `table.channels` planes of `height * width` values. A 1-band image fills every channel from its one band, as `convert("RGB")` would
/// have copied it to each.
///
/// # Panics
/// If `out` or the table do not have the sizes above, or the image has neither 1 band nor as
/// many as the table's channels.
pub fn write_chw<'a>(img: impl Into<ImageView<'a>>, table: &Table<'_>, out: &mut [u8]) {
    let img = img.into();
    let plane = img.width * img.height;
    assert_eq!(
        out.len(),
        table.channels * plane * table.elem,
        "output size"
    );
    assert_eq!(
        table.values.len(),
        table.channels * 256 * table.elem,
        "table size"
    );
    assert!(img.bands == 1 || img.bands == table.channels, "bands");
    if img.bands == 3 && table.channels == 3 && table.elem == 4 {
        return rgb_through_u32(img, table.values, out);
    }
    for c in 0..table.channels {
        let band = if img.bands == 1 { 0 } else { c };
        let lut = &table.values[c * 256 * table.elem..(c + 1) * 256 * table.elem];
        let dst = &mut out[c * plane * table.elem..(c + 1) * plane * table.elem];
        match table.elem {
            1 => plane_through::<1>(img, band, lut, dst),
            2 => plane_through::<2>(img, band, lut, dst),
            4 => plane_through::<4>(img, band, lut, dst),
            8 => plane_through::<8>(img, band, lut, dst),
            other => panic!("no tensor element of {other} bytes"),
        }
    }
}

/// The common case (RGB to float32 or int32), one pass over the pixels writing three planes:
/// the values as 4-byte words, not byte slices.
fn rgb_through_u32(img: ImageView<'_>, values: &[u8], out: &mut [u8]) {
    let word = |b: &[u8]| u32::from_ne_bytes(b.try_into().expect("4 bytes"));
    let luts: Vec<[u32; 256]> = (0..3)
        .map(|c| std::array::from_fn(|v| word(&values[(c * 256 + v) * 4..][..4])))
        .collect();
    let plane = img.width * img.height * 4;
    let (r, rest) = out.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    let planes = r
        .chunks_exact_mut(4)
        .zip(g.chunks_exact_mut(4))
        .zip(b.chunks_exact_mut(4));
    for (((r, g), b), px) in planes.zip(img.data.chunks_exact(3)) {
        r.copy_from_slice(&luts[0][px[0] as usize].to_ne_bytes());
        g.copy_from_slice(&luts[1][px[1] as usize].to_ne_bytes());
        b.copy_from_slice(&luts[2][px[2] as usize].to_ne_bytes());
    }
}

fn plane_through<const N: usize>(img: ImageView<'_>, band: usize, lut: &[u8], dst: &mut [u8]) {
    let lut: Vec<[u8; N]> = lut
        .chunks_exact(N)
        .map(|v| v.try_into().expect("N bytes"))
        .collect();
    let src = img.data.iter().skip(band).step_by(img.bands);
    for (d, &v) in dst.chunks_exact_mut(N).zip(src) {
        d.copy_from_slice(&lut[v as usize]);
    }
}

/// Writes `img` as interleaved RGB rows (Pillow's "RGB" bytes), a 1-band image's band copied to
/// all three, as `convert("RGB")` does.
pub fn write_rgb(img: &Image, out: &mut [u8]) {
    assert_eq!(out.len(), img.width * img.height * 3, "output size");
    match img.bands {
        3 => out.copy_from_slice(&img.data),
        1 => {
            for (d, &v) in out.chunks_exact_mut(3).zip(&img.data) {
                d.fill(v);
            }
        }
        other => panic!("no RGB from {other} bands"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_come_from_bands_through_each_channels_table() {
        // 2x1 RGB: pixels (1,2,3), (4,5,6); tables: channel c maps v to v + 100 c.
        let img = Image::from_vec(2, 1, 3, vec![1, 2, 3, 4, 5, 6]);
        let values: Vec<u8> = (0..3)
            .flat_map(|c| (0..256).map(move |v| (v as u8).wrapping_add(100 * c)))
            .collect();
        let mut out = vec![0; 6];
        write_chw(
            &img,
            &Table {
                values: &values,
                elem: 1,
                channels: 3,
            },
            &mut out,
        );
        assert_eq!(out, [1, 4, 102, 105, 203, 206]);
    }

    #[test]
    fn the_rgb_float_path_writes_what_the_general_one_does() {
        let data: Vec<u8> = (0..7 * 5 * 3).map(|i| (i * 37 % 256) as u8).collect();
        let img = Image::from_vec(7, 5, 3, data);
        let values: Vec<u8> = (0..3 * 256u32)
            .flat_map(|v| (v as f32 * 0.37 - 5.0).to_ne_bytes())
            .collect();
        let table = Table {
            values: &values,
            elem: 4,
            channels: 3,
        };
        let mut fast = vec![0; 7 * 5 * 3 * 4];
        write_chw(&img, &table, &mut fast);
        let mut general = vec![0; fast.len()];
        let plane = 7 * 5 * 4;
        for c in 0..3 {
            plane_through::<4>(
                (&img).into(),
                c,
                &values[c * 1024..(c + 1) * 1024],
                &mut general[c * plane..(c + 1) * plane],
            );
        }
        assert_eq!(fast, general);
    }

    #[test]
    fn a_gray_image_fills_every_channel_and_wide_values_keep_their_bytes() {
        let img = Image::from_vec(2, 1, 1, vec![0, 255]);
        let values: Vec<u8> = (0..3)
            .flat_map(|c| {
                (0..256u32).flat_map(move |v| (v as f32 / 255.0 + c as f32).to_ne_bytes())
            })
            .collect();
        let mut out = vec![0; 2 * 3 * 4];
        write_chw(
            &img,
            &Table {
                values: &values,
                elem: 4,
                channels: 3,
            },
            &mut out,
        );
        let floats: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(floats, [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]);
        let mut rgb = vec![0; 6];
        write_rgb(&img, &mut rgb);
        assert_eq!(rgb, [0, 0, 0, 255, 255, 255]);
    }
}
