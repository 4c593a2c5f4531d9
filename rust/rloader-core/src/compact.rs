//! Index buffers in the narrowest word that holds them.
//!
//! Samplers keep whole permutations and alias columns in memory. Below 2^32
//! entries a `u32` holds every index, halves the memory and doubles what fits in
//! cache, which is what makes shuffling ten million indices fast. Above that they
//! fall back to `u64`. Values are widened to `u64` only as they leave the crate.

/// An unsigned word that stores dataset indices: `u32` or `u64`.
pub(crate) trait CompactIndex: Copy + Ord + Send + Sync + 'static {
    /// Narrows `value`, which the caller guarantees fits.
    fn from_u64(value: u64) -> Self;
    fn to_u64(self) -> u64;
}

impl CompactIndex for u32 {
    #[inline]
    fn from_u64(value: u64) -> Self {
        debug_assert!(value <= u64::from(u32::MAX));
        value as u32
    }
    #[inline]
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
}

impl CompactIndex for u64 {
    #[inline]
    fn from_u64(value: u64) -> Self {
        value
    }
    #[inline]
    fn to_u64(self) -> u64 {
        self
    }
}

/// Whether `n` indices `0..n` fit in `u32` words.
#[inline]
pub(crate) fn fits_u32(n: u64) -> bool {
    n <= u64::from(u32::MAX) + 1
}

/// `[0, 1, ..., n - 1]` in words of type `T`.
pub(crate) fn identity<T: CompactIndex>(n: u64) -> Vec<T> {
    let mut out = Vec::with_capacity(usize::try_from(n).expect("index buffer exceeds memory"));
    out.extend((0..n).map(T::from_u64));
    out
}

/// Refills `buf` (same length) with `0..len`.
pub(crate) fn reset_identity<T: CompactIndex>(buf: &mut [T]) {
    for (i, slot) in buf.iter_mut().enumerate() {
        *slot = T::from_u64(i as u64);
    }
}
