//! `Image`: an 8-bit picture as Pillow holds one, interleaved rows of 1 (L) or 3 (RGB) bands;
//! `ImageView`: the same layout over borrowed bytes.

/// An 8-bit image: `height` rows of `width * bands` bytes, bands interleaved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub width: usize,
    pub height: usize,
    /// 1 (Pillow's "L") or 3 ("RGB").
    pub bands: usize,
    pub data: Vec<u8>,
}

impl Image {
    /// A black image (every byte 0), as Pillow's `Image.new(mode, size)`.
    pub fn new(width: usize, height: usize, bands: usize) -> Self {
        Self {
            width,
            height,
            bands,
            data: vec![0; width * height * bands],
        }
    }

    /// Wraps bytes already laid out as rows of `width * bands`.
    ///
    /// # Panics
    /// If `data` is not `width * height * bands` bytes long.
    pub fn from_vec(width: usize, height: usize, bands: usize, data: Vec<u8>) -> Self {
        assert_size(width, height, bands, data.len());
        Self {
            width,
            height,
            bands,
            data,
        }
    }

    /// One row's bytes.
    pub fn row(&self, y: usize) -> &[u8] {
        let stride = self.width * self.bands;
        &self.data[y * stride..(y + 1) * stride]
    }
}

/// Borrowed bytes in `Image`'s layout (a PIL image's `tobytes()`, say), for what only reads
/// pixels: no copy into an `Image` first.
#[derive(Clone, Copy, Debug)]
pub struct ImageView<'a> {
    pub width: usize,
    pub height: usize,
    pub bands: usize,
    pub data: &'a [u8],
}

impl<'a> ImageView<'a> {
    /// # Panics
    /// If `data` is not `width * height * bands` bytes long.
    pub fn new(width: usize, height: usize, bands: usize, data: &'a [u8]) -> Self {
        assert_size(width, height, bands, data.len());
        Self {
            width,
            height,
            bands,
            data,
        }
    }
}

impl<'a> From<&'a Image> for ImageView<'a> {
    fn from(img: &'a Image) -> Self {
        Self::new(img.width, img.height, img.bands, &img.data)
    }
}

fn assert_size(width: usize, height: usize, bands: usize, len: usize) {
    assert_eq!(
        len,
        width * height * bands,
        "image bytes do not match its size"
    );
}
