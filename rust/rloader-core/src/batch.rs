//! `BatchSampler`: any index stream grouped into batches.

/// Groups an index stream into batches of `batch_size`; the last batch is shorter
/// unless `drop_last`, in which case a short last batch is dropped.
pub struct Batches<I: Iterator<Item = u64>> {
    inner: I,
    batch_size: usize,
    drop_last: bool,
}

impl<I: Iterator<Item = u64>> Batches<I> {
    /// # Panics
    /// If `batch_size == 0` (torch raises `ValueError`; callers validate first).
    pub fn new(inner: I, batch_size: usize, drop_last: bool) -> Self {
        assert!(batch_size > 0, "batch_size must be positive");
        Batches {
            inner,
            batch_size,
            drop_last,
        }
    }

    /// Clears `out` and fills it with the next batch, reusing its allocation.
    /// Returns false, with `out` empty, when there is no further batch.
    pub fn next_into(&mut self, out: &mut Vec<u64>) -> bool {
        out.clear();
        // No more room up front than a batch can take from what is left: a batch_size
        // of 10^12 over 3 indices is valid.
        out.reserve(self.batch_size.min(self.inner.size_hint().0.max(1)));
        out.extend(self.inner.by_ref().take(self.batch_size));
        let complete = out.len() == self.batch_size;
        if complete || (!out.is_empty() && !self.drop_last) {
            true
        } else {
            out.clear();
            false
        }
    }

    /// The number of batches `len` remaining indices make.
    fn batches_for(&self, len: usize) -> usize {
        if self.drop_last {
            len / self.batch_size
        } else {
            len.div_ceil(self.batch_size)
        }
    }
}

impl<I: Iterator<Item = u64>> Iterator for Batches<I> {
    type Item = Vec<u64>;

    fn next(&mut self) -> Option<Vec<u64>> {
        let mut batch = Vec::new();
        self.next_into(&mut batch).then_some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let (low, high) = self.inner.size_hint();
        (
            self.batches_for(low),
            high.map(|high| self.batches_for(high)),
        )
    }
}

impl<I: ExactSizeIterator<Item = u64>> ExactSizeIterator for Batches<I> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(n: u64, batch_size: usize, drop_last: bool) -> Vec<Vec<u64>> {
        Batches::new(0..n, batch_size, drop_last).collect()
    }

    #[test]
    fn last_batch_is_short_unless_dropped() {
        assert_eq!(
            batches(7, 3, false),
            [vec![0, 1, 2], vec![3, 4, 5], vec![6]]
        );
        assert_eq!(batches(7, 3, true), [vec![0, 1, 2], vec![3, 4, 5]]);
    }

    #[test]
    fn exact_multiple_keeps_every_batch_both_ways() {
        for drop_last in [false, true] {
            assert_eq!(batches(6, 3, drop_last), [vec![0, 1, 2], vec![3, 4, 5]]);
        }
    }

    #[test]
    fn empty_stream_and_stream_shorter_than_a_batch() {
        assert!(batches(0, 4, false).is_empty());
        assert!(batches(0, 4, true).is_empty());
        assert_eq!(batches(2, 4, false), [vec![0, 1]]);
        assert!(batches(2, 4, true).is_empty());
    }

    #[test]
    fn batch_size_far_beyond_the_stream_takes_no_room_for_it() {
        assert_eq!(batches(3, usize::MAX / 2, false), [vec![0, 1, 2]]);
        let mut unsized_stream = Batches::new((0..3u64).filter(|_| true), 1 << 60, false);
        assert_eq!(unsized_stream.next(), Some(vec![0, 1, 2]));
    }

    #[test]
    fn batch_size_one() {
        assert_eq!(batches(3, 1, true), [vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn next_into_reuses_the_buffer_and_reports_exhaustion() {
        let mut it = Batches::new(0..5, 2, false);
        let mut out = vec![99; 10];
        assert!(it.next_into(&mut out));
        assert_eq!(out, [0, 1]);
        assert!(it.next_into(&mut out));
        assert_eq!(out, [2, 3]);
        assert!(it.next_into(&mut out));
        assert_eq!(out, [4]);
        assert!(!it.next_into(&mut out));
        assert!(out.is_empty());
        assert!(!it.next_into(&mut out));
    }

    #[test]
    fn len_counts_batches() {
        let indices = |n: u64| (0..n).collect::<Vec<_>>().into_iter();
        assert_eq!(Batches::new(indices(7), 3, false).len(), 3);
        assert_eq!(Batches::new(indices(7), 3, true).len(), 2);
        assert_eq!(Batches::new(indices(0), 3, false).len(), 0);
        let mut partly_read = Batches::new(indices(7), 3, false);
        partly_read.next();
        assert_eq!(partly_read.len(), 2);
    }

    #[test]
    #[should_panic(expected = "batch_size must be positive")]
    fn zero_batch_size_panics() {
        Batches::new(0..3, 0, false);
    }
}
