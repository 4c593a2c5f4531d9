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

/// Overwrites `slots` with `0, 1, ..., len - 1`.
pub(crate) fn fill_identity<T: CompactIndex>(slots: &mut [T]) {
    for (i, slot) in slots.iter_mut().enumerate() {
        *slot = T::from_u64(i as u64);
    }
}
