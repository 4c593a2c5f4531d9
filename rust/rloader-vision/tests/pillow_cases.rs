//! Golden cases from the real Pillow (tests/data/make_pillow_cases.py writes them and documents
//! the format): every resize filter, boxes, extreme ratios, crops and flips, compared byte for
//! byte.

use rloader_vision::geometry::{crop, crop_resize, flip_left_right, flip_top_bottom};
use rloader_vision::image::Image;
use rloader_vision::resample::{resize, Filter};

const CASES: &[u8] = include_bytes!("data/pillow_cases.bin");

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> usize {
        u16::from_le_bytes(self.take(2).try_into().unwrap()).into()
    }
    fn u32(&mut self) -> usize {
        u32::from_le_bytes(self.take(4).try_into().unwrap()) as usize
    }
    fn i32(&mut self) -> i64 {
        i32::from_le_bytes(self.take(4).try_into().unwrap()).into()
    }
    fn f64(&mut self) -> f64 {
        f64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn image(&mut self) -> Image {
        let (w, h, bands) = (self.u16(), self.u16(), usize::from(self.u8()));
        Image::from_vec(w, h, bands, self.take(w * h * bands).to_vec())
    }
    fn filter(&mut self) -> Filter {
        // Pillow's numbering.
        match self.u8() {
            0 => Filter::Nearest,
            1 => Filter::Lanczos,
            2 => Filter::Bilinear,
            3 => Filter::Bicubic,
            4 => Filter::Box,
            5 => Filter::Hamming,
            other => panic!("unknown filter {other}"),
        }
    }
}

/// Where two images first differ, for a readable failure.
fn first_difference(got: &Image, want: &Image) -> String {
    if (got.width, got.height, got.bands) != (want.width, want.height, want.bands) {
        return format!(
            "size {}x{}x{} != {}x{}x{}",
            got.width, got.height, got.bands, want.width, want.height, want.bands
        );
    }
    let count = got
        .data
        .iter()
        .zip(&want.data)
        .filter(|(a, b)| a != b)
        .count();
    let i = got
        .data
        .iter()
        .zip(&want.data)
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let px = i / want.bands;
    format!(
        "{count} bytes differ; first at x={} y={} band={}: {} != {}",
        px % want.width,
        px / want.width,
        i % want.bands,
        got.data[i],
        want.data[i]
    )
}

#[test]
fn every_case_equals_pillow() {
    let mut r = Reader { bytes: CASES };
    assert_eq!(r.take(4), b"RLPC");
    assert_eq!(r.u32(), 1, "format version");
    let n = r.u8().into();
    let pillow = std::str::from_utf8(r.take(n)).unwrap().to_owned();
    let (n_images, n_cases) = (r.u32(), r.u32());
    let images: Vec<Image> = (0..n_images).map(|_| r.image()).collect();

    let mut failures = Vec::new();
    let mut per_op = [0usize; 5];
    for case in 0..n_cases {
        let op = r.u8();
        let src = &images[r.u32()];
        let (what, got) = match op {
            0 => {
                let filter = r.filter();
                let (w, h) = (r.u16(), r.u16());
                let bbox = [r.f64(), r.f64(), r.f64(), r.f64()];
                let what = format!(
                    "resize {}x{}x{} -> {w}x{h} {filter:?} box {bbox:?}",
                    src.width, src.height, src.bands
                );
                (what, resize(src, w, h, filter, bbox))
            }
            1 => {
                let (l, t, rt, b) = (r.i32(), r.i32(), r.i32(), r.i32());
                (
                    format!("crop {}x{} at {:?}", src.width, src.height, (l, t, rt, b)),
                    crop(src, l, t, rt, b),
                )
            }
            2 | 3 => {
                let mut img = src.clone();
                if op == 2 {
                    flip_left_right(&mut img);
                } else {
                    flip_top_bottom(&mut img);
                }
                (
                    format!("flip {op} {}x{}x{}", src.width, src.height, src.bands),
                    img,
                )
            }
            4 => {
                let (l, t, rt, b) = (r.i32(), r.i32(), r.i32(), r.i32());
                let filter = r.filter();
                let (w, h) = (r.u16(), r.u16());
                let what = format!(
                    "crop_resize {}x{}x{} crop {:?} -> {w}x{h} {filter:?}",
                    src.width,
                    src.height,
                    src.bands,
                    (l, t, rt, b)
                );
                (what, crop_resize(src, l, t, rt, b, w, h, filter))
            }
            other => panic!("unknown op {other}"),
        };
        let want = r.image();
        per_op[usize::from(op)] += 1;
        if got != want {
            failures.push(format!(
                "case {case}: {what}: {}",
                first_difference(&got, &want)
            ));
        }
    }
    assert!(r.bytes.is_empty(), "trailing bytes in the case file");
    eprintln!(
        "{n_cases} cases from Pillow {pillow} (resize, crop, flips, crop_resize): {per_op:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {n_cases} cases differ from Pillow {pillow}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
