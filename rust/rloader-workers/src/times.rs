//! Each worker process's fetch and collate time (and, within fetch, rloader.vision's decoding
//! and transforms), kept in the pool's region so that the main process can report them
//! (`DataLoader.stats()`).
//!
//! A worker adds each task's nanoseconds to its own cell ([`add`]) before it sends the
//! task's answer; the main process reads the cells ([`read`]) and reports what was added since
//! its epoch began. The cells are never reset: they outlive workers (the region serves a
//! loader's later pools too), and a reader keeps its own starting point. Each cell is one
//! writer's (its worker's), so Relaxed adds suffice; a reader may see an answer a moment
//! before its times, never a torn value.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rloader_queue::ShmRegion;

/// Bytes per worker: a cache line, so that workers do not share one.
pub const BYTES: usize = 64;
const _: () = assert!(COUNTERS * 8 <= BYTES);
/// What a cell counts, by index.
pub const FETCH: usize = 0;
pub const COLLATE: usize = 1;
/// rloader.vision's decoding, and its transforms, within FETCH.
pub const DECODE: usize = 2;
pub const TRANSFORM: usize = 3;
/// How many counters a cell has.
pub const COUNTERS: usize = 4;

/// The counter `which` of the cell at `at`.
fn counter(region: &ShmRegion, at: usize, which: usize) -> &AtomicU64 {
    let off = at + 8 * which;
    assert!(
        which < COUNTERS && off + 8 <= region.len() && off % 8 == 0,
        "not a times cell"
    );
    // SAFETY: in bounds and 8-aligned (checked above; the region is page-aligned), and the
    // bytes of a times cell are only ever used atomically.
    unsafe { &*(region.as_ptr().add(off) as *const AtomicU64) }
}

/// Adds `nanos` to counter `which` (`FETCH`, `COLLATE`, `DECODE`, `TRANSFORM`) of the cell at `at`.
pub fn add(region: &ShmRegion, at: usize, which: usize, nanos: u64) {
    counter(region, at, which).fetch_add(nanos, Relaxed);
}

/// Each counter's nanoseconds (FETCH, COLLATE, DECODE, TRANSFORM) of the cell at `at`, since
/// the region was made.
pub fn read(region: &ShmRegion, at: usize) -> [u64; COUNTERS] {
    [FETCH, COLLATE, DECODE, TRANSFORM].map(|which| counter(region, at, which).load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layout;

    #[test]
    fn each_worker_adds_to_its_own_cell_and_readers_see_the_sums() {
        let layout = Layout::new(3, 2);
        let region = layout.create_region("rloader times test").unwrap();
        add(&region, layout.times(1), FETCH, 5);
        add(&region, layout.times(1), FETCH, 7);
        add(&region, layout.times(1), COLLATE, 3);
        add(&region, layout.times(2), COLLATE, 100);
        add(&region, layout.times(2), DECODE, 40);
        add(&region, layout.times(2), TRANSFORM, 9);
        assert_eq!(read(&region, layout.times(0)), [0, 0, 0, 0]);
        assert_eq!(read(&region, layout.times(1)), [12, 3, 0, 0]);
        assert_eq!(read(&region, layout.times(2)), [0, 100, 40, 9]);
    }
}
