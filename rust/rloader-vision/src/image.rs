//! `Image`: an 8-bit picture as Pillow holds one, interleaved rows of 1 (L) or 3 (RGB) bands.

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
        assert_eq!(
            data.len(),
            width * height * bands,
            "image bytes do not match its size"
        );
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
