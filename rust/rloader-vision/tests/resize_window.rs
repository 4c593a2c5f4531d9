//! A window of a resize, computed alone (`resize_window`, `WindowedResize` from only the source
//! pixels it reads), equals the whole resize cut to the window byte for byte: every filter,
//! both pass orders, boxes, enlargements and windows at the edges.

use rloader_vision::geometry::crop;
use rloader_vision::image::Image;
use rloader_vision::resample::{resize, resize_window, Filter, Window, WindowedResize};

const FILTERS: [Filter; 6] = Filter::ALL;

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
}

fn noise(rng: &mut Lcg, w: usize, h: usize, bands: usize) -> Image {
    let data = (0..w * h * bands).map(|_| rng.below(256) as u8).collect();
    Image::from_vec(w, h, bands, data)
}

fn cut(img: &Image, win: Window) -> Image {
    let (x, y) = (win.x as i64, win.y as i64);
    crop(img, x, y, x + win.width as i64, y + win.height as i64)
}

/// One case: the whole resize cut, against the window alone and from only its source.
fn check(rng: &mut Lcg, src: &Image, out: (usize, usize), filter: Filter, bbox: [f64; 4]) {
    let want_all = resize(src, out.0, out.1, filter, bbox);
    for _ in 0..4 {
        let (x, y) = (rng.below(out.0), rng.below(out.1));
        let win = Window {
            x,
            y,
            width: rng.between(1, out.0 - x),
            height: rng.between(1, out.1 - y),
        };
        let case = format!(
            "{filter:?} {}x{}x{} -> {out:?} box {bbox:?} window {win:?}",
            src.width, src.height, src.bands
        );
        let want = cut(&want_all, win);
        assert_eq!(
            resize_window(src, out.0, out.1, filter, bbox, win),
            want,
            "{case}"
        );

        // From a part of the source: what the window reads, with a margin of up to 3 pixels.
        let plan = WindowedResize::new((src.width, src.height), out, filter, bbox, win);
        let s = plan.source();
        if s.width == 0 || s.height == 0 {
            assert!(
                want.data.iter().all(|&v| v == 0),
                "{case}: reads nothing, not black"
            );
            continue;
        }
        assert!(
            s.x + s.width <= src.width && s.y + s.height <= src.height,
            "{case}"
        );
        let (px, py) = (s.x - rng.below(4).min(s.x), s.y - rng.below(4).min(s.y));
        let part = Window {
            x: px,
            y: py,
            width: (s.x + s.width + rng.below(4)).min(src.width) - px,
            height: (s.y + s.height + rng.below(4)).min(src.height) - py,
        };
        let got = plan.run(&cut(src, part), px, py);
        assert_eq!(got, want, "{case}: from the part {part:?} of the source");
    }
}

#[test]
fn a_window_equals_the_whole_resize_cut() {
    let mut rng = Lcg(7);
    for round in 0..150 {
        let bands = if round % 3 == 0 { 1 } else { 3 };
        let (w, h) = (rng.between(1, 90), rng.between(1, 90));
        let src = noise(&mut rng, w, h, bands);
        // Shrinks, enlargements, one axis kept.
        let out = match round % 4 {
            0 => (rng.between(1, w), rng.between(1, h)),
            1 => (rng.between(1, 2 * w + 3), rng.between(1, 2 * h + 3)),
            2 => (w, rng.between(1, 2 * h)),
            _ => (rng.between(1, 2 * w), h),
        };
        for filter in FILTERS {
            check(&mut rng, &src, out, filter, [0.0, 0.0, w as f64, h as f64]);
            // A fractional box, as draft and RandomResizedCrop on a scaled decode make.
            let x0 = rng.below(w) as f64 * 0.75;
            let y0 = rng.below(h) as f64 * 0.5;
            let x1 = x0 + (w as f64 - x0) * (rng.between(1, 8) as f64 / 8.0);
            let y1 = y0 + (h as f64 - y0) * (rng.between(1, 8) as f64 / 8.0);
            check(&mut rng, &src, out, filter, [x0, y0, x1, y1]);
        }
    }
}

/// Pillow 13 runs the vertical pass first when the height shrinks by more than twice what the
/// width does: decided on the whole sizes, not the window's.
#[test]
fn a_window_keeps_the_whole_resizes_pass_order() {
    let mut rng = Lcg(11);
    for (w, h, out) in [
        (40, 200, (38, 50)),
        (60, 31, (59, 10)),
        (300, 220, (256, 87)),
        (50, 50, (45, 40)),
        (51, 50, (46, 40)),
        (200, 150, (16, 16)),
    ] {
        let src = noise(&mut rng, w, h, 3);
        for filter in FILTERS {
            check(&mut rng, &src, out, filter, [0.0, 0.0, w as f64, h as f64]);
        }
    }
}

/// A whole-pixel box of the output's size is Pillow's crop shortcut: its window is a crop.
#[test]
fn a_window_of_the_crop_shortcut() {
    let mut rng = Lcg(3);
    let src = noise(&mut rng, 30, 20, 3);
    for filter in FILTERS {
        check(&mut rng, &src, (12, 9), filter, [5.0, 4.0, 17.0, 13.0]);
    }
}
