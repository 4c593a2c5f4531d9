//! Large index buffers, backed by transparent huge pages where the kernel offers them.
//!
//! Sampling touches big, freshly allocated buffers (a permutation of 10M is 40 MB). Faulting
//! them in 4 KiB page by page costs about as much as the sampling itself on a VM; asking for
//! 2 MiB pages (`madvise(MADV_HUGEPAGE)`, honoured when the kernel's THP mode is `madvise` or
//! `always`) cuts that several-fold. The advice changes no contents and no behaviour: where it
//! is refused or unsupported, the buffers are ordinary memory.

/// Buffers smaller than this are left alone: a huge page would not fit in them.
const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// An empty Vec with room for at least `capacity` elements, advised to use huge pages.
///
/// A big buffer gets up to 2 MiB more capacity (virtual memory), so that the huge page its
/// first `capacity` elements end in lies inside it: the advice covers that page whole, and the
/// buffer's tail faults in as one huge page rather than up to 512 small ones.
pub fn with_capacity<T>(capacity: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let bytes = capacity.saturating_mul(size);
    if bytes < HUGE_PAGE_MIN_BYTES {
        return Vec::with_capacity(capacity);
    }
    let buffer: Vec<T> = Vec::with_capacity(capacity + HUGE_PAGE.div_ceil(size));
    let start = buffer.as_ptr() as usize;
    let end = (start + bytes).next_multiple_of(HUGE_PAGE);
    advise_huge_pages(buffer.as_ptr().cast(), end - start);
    buffer
}

/// The huge page size of x86-64 (and of arm64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

/// Scratch room for `len` elements that only huge pages back, where the kernel offers them: an
/// empty Vec to keep alive, and the offset in it where the room starts, on a 2 MiB boundary.
///
/// A buffer's own ends rarely fall on 2 MiB boundaries, and the partial huge pages there fault
/// in 4 KiB at a time: about 512 faults per buffer, over a millisecond on a VM. Scratch space
/// that is not handed out as a Vec can skip them: the Vec has 4 MiB more capacity (virtual
/// memory, never touched), and `len` elements from the offset span whole huge pages only.
pub fn aligned_scratch<T>(len: usize) -> (Vec<T>, usize) {
    let size = std::mem::size_of::<T>();
    let bytes = len.saturating_mul(size);
    if bytes < HUGE_PAGE_MIN_BYTES || size == 0 || HUGE_PAGE % size != 0 {
        return (with_capacity(len), 0);
    }
    let extra = 2 * HUGE_PAGE / size;
    let buffer: Vec<T> = Vec::with_capacity(len + extra);
    let start = buffer.as_ptr() as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE);
    if (aligned - start) % size != 0 {
        return (buffer, 0);
    }
    // [aligned, aligned + bytes rounded up to 2 MiB) lies inside the allocation, which runs
    // 4 MiB past `start + bytes`.
    advise_huge_pages(aligned as *const u8, bytes.next_multiple_of(HUGE_PAGE));
    (buffer, (aligned - start) / size)
}

/// A Vec of `len` copies of `value`, advised to use huge pages before it is first written.
pub fn filled<T: Copy>(value: T, len: usize) -> Vec<T> {
    let mut buffer = with_capacity(len);
    buffer.resize(len, value);
    buffer
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(start: *const u8, bytes: usize) {
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    const PAGE: usize = 4096;
    let begin = (start as usize).div_ceil(PAGE) * PAGE;
    let end = (start as usize + bytes) / PAGE * PAGE;
    if end > begin {
        // SAFETY: the range lies inside one live allocation of ours, and MADV_HUGEPAGE is
        // advice only: it neither frees nor changes memory. A refusal is harmless, so the
        // result is ignored.
        unsafe {
            libc::madvise(begin as *mut libc::c_void, end - begin, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_start: *const u8, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_what_was_asked() {
        let small: Vec<u32> = filled(7, 10);
        assert_eq!(small, vec![7; 10]);
        let big: Vec<u64> = filled(3, 1 << 20);
        assert_eq!(big.len(), 1 << 20);
        assert!(big.iter().all(|&x| x == 3));
        let empty: Vec<u64> = with_capacity(1 << 20);
        assert!(empty.is_empty() && empty.capacity() >= 1 << 20);
    }

    #[test]
    fn aligned_scratch_has_room_from_a_huge_page_boundary() {
        let len = 3 << 20;
        let (buffer, offset): (Vec<u64>, usize) = aligned_scratch(len);
        assert!(buffer.capacity() >= offset + len);
        let start = buffer.as_ptr() as usize + offset * 8;
        assert_eq!(start % HUGE_PAGE, 0);
        let (small, offset): (Vec<u64>, usize) = aligned_scratch(10);
        assert_eq!(offset, 0);
        assert!(small.capacity() >= 10);
    }
}
