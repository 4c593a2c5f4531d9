//! Uniform shuffles and `RandomSampler`'s index stream.
//!
//! Every shuffle here is the forward Fisher–Yates shuffle: for `i` in `0..len-1`,
//! swap slot `i` with a uniformly chosen slot `j` in `i..len` (`j = i + below(len - i)`).
//! After step `i`, slots `0..=i` are final, so the first `k` entries of a permutation
//! cost only `k` steps ([`shuffle_prefix`]) and come out identical to the first `k`
//! of the full shuffle. Which `j` each step draws depends only on the generator,
//! never on the slots' contents, so the element type (`u32` or `u64` words, see
//! `compact`) does not change the order.

use crate::compact::{self, CompactIndex};
use crate::rng::Rng;

/// Shuffles `items` uniformly in place (Fisher–Yates, `len - 1` draws).
pub fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    let steps = items.len().saturating_sub(1);
    shuffle_prefix(items, steps, rng);
}

/// Runs the first `steps` steps of [`shuffle`] (`steps < items.len()`): afterwards
/// `items[..steps]` equals the first `steps` entries `shuffle` would have produced
/// from the same generator.
///
/// The draws for a block of steps are made first and the slots they name are
/// loaded before any swap, so that the cache misses of a large buffer overlap
/// instead of being paid one after another. The swaps then run in the usual order,
/// so the result is that of the plain loop.
pub fn shuffle_prefix<T>(items: &mut [T], steps: usize, rng: &mut Rng) {
    const BLOCK: usize = 16;
    let len = items.len();
    assert!(steps < len.max(1), "shuffle_prefix: steps must be < len");
    let mut targets = [0usize; BLOCK];
    let mut start = 0;
    while start < steps {
        let block = BLOCK.min(steps - start);
        for (offset, target) in targets[..block].iter_mut().enumerate() {
            let i = start + offset;
            *target = i + rng.below((len - i) as u64) as usize;
            prefetch(items, *target);
        }
        for (offset, &target) in targets[..block].iter().enumerate() {
            items.swap(start + offset, target);
        }
        start += block;
    }
}

/// Hints that `items[index]` will be needed soon.
#[inline(always)]
fn prefetch<T>(items: &[T], index: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let pointer = items[index..].as_ptr().cast::<i8>();
        // SAFETY: a prefetch never faults and reads nothing observable; the pointer
        // is in bounds anyway (the slice index above is checked).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(pointer) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (items, index);
    }
}

/// A uniformly random permutation of `0..n`.
///
/// Shuffles a `u32` buffer when `n <= 2^32` (half the memory traffic of `u64`) and
/// widens once at the end.
pub fn permutation(n: u64, rng: &mut Rng) -> Vec<u64> {
    if compact::fits_u32(n) {
        let mut slots = compact::identity::<u32>(n);
        shuffle(&mut slots, rng);
        slots.into_iter().map(u64::from).collect()
    } else {
        let mut slots = compact::identity::<u64>(n);
        shuffle(&mut slots, rng);
        slots
    }
}

/// [`permutation`] kept in compact words, for callers that only read from it.
pub(crate) fn compact_permutation<T: CompactIndex>(n: u64, rng: &mut Rng) -> Vec<T> {
    let mut slots = compact::identity::<T>(n);
    shuffle(&mut slots, rng);
    slots
}

/// `RandomSampler`'s index stream.
///
/// Without replacement: `num_samples / n` full fresh permutations of `0..n`, then
/// the first `num_samples % n` entries of one more. With replacement:
/// `num_samples` independent `below(n)` draws. Everything comes from one [`Rng`]
/// seeded with `seed`, in stream order. `n == 0` yields nothing.
///
/// Only one permutation is held at a time, in `u32` words when `n <= 2^32`; it is
/// shuffled when its round starts, and for the last, partial round only as many
/// Fisher–Yates steps run as entries are yielded.
pub struct RandomIndices {
    n: u64,
    remaining: u64,
    rng: Rng,
    rounds: Rounds,
}

/// The permutation of the current round, if sampling without replacement.
enum Rounds {
    WithReplacement,
    Narrow(Round<u32>),
    Wide(Round<u64>),
}

/// One round of sampling without replacement. Invariant: `slots[next..yielded_end]`
/// are final entries of this round's permutation not yet yielded.
struct Round<T> {
    slots: Vec<T>,
    next: usize,
    yielded_end: usize,
}

impl<T: CompactIndex> Round<T> {
    fn empty() -> Self {
        Round {
            slots: Vec::new(),
            next: 0,
            yielded_end: 0,
        }
    }

    #[inline]
    fn next(&mut self, n: u64, remaining: u64, rng: &mut Rng) -> u64 {
        if self.next == self.yielded_end {
            self.start(n, remaining, rng);
        }
        let value = self.slots[self.next];
        self.next += 1;
        value.to_u64()
    }

    /// Starts a fresh round that will yield `min(remaining, n)` entries.
    #[cold]
    fn start(&mut self, n: u64, remaining: u64, rng: &mut Rng) {
        if self.slots.is_empty() {
            self.slots = compact::identity(n);
        } else {
            compact::reset_identity(&mut self.slots);
        }
        let len = self.slots.len();
        let wanted = usize::try_from(remaining.min(n)).unwrap_or(len);
        // The last slot needs no draw of its own.
        shuffle_prefix(&mut self.slots, wanted.min(len - 1), rng);
        self.next = 0;
        self.yielded_end = wanted;
    }
}

impl RandomIndices {
    pub fn new(n: u64, num_samples: u64, replacement: bool, seed: u64) -> Self {
        let rounds = if replacement {
            Rounds::WithReplacement
        } else if compact::fits_u32(n) {
            Rounds::Narrow(Round::empty())
        } else {
            Rounds::Wide(Round::empty())
        };
        RandomIndices {
            n,
            remaining: if n == 0 { 0 } else { num_samples },
            rng: Rng::from_seed(seed),
            rounds,
        }
    }
}

impl Iterator for RandomIndices {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        let value = match &mut self.rounds {
            Rounds::WithReplacement => self.rng.below(self.n),
            Rounds::Narrow(round) => round.next(self.n, self.remaining, &mut self.rng),
            Rounds::Wide(round) => round.next(self.n, self.remaining, &mut self.rng),
        };
        self.remaining -= 1;
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match usize::try_from(self.remaining) {
            Ok(len) => (len, Some(len)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl ExactSizeIterator for RandomIndices {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_stats::{assert_chi_square_fits, assert_chi_square_uniform};

    fn is_permutation(values: &[u64], n: u64) -> bool {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        sorted.iter().copied().eq(0..n)
    }

    #[test]
    fn permutation_of_nothing_and_of_one() {
        assert!(permutation(0, &mut Rng::from_seed(0)).is_empty());
        assert_eq!(permutation(1, &mut Rng::from_seed(0)), vec![0]);
    }

    #[test]
    fn permutation_is_a_permutation() {
        for n in [2, 3, 10, 1000, 100_003] {
            assert!(is_permutation(&permutation(n, &mut Rng::from_seed(n)), n));
        }
    }

    #[test]
    fn shuffle_of_u32_and_u64_words_agree() {
        let mut narrow: Vec<u32> = (0..1000).collect();
        let mut wide: Vec<u64> = (0..1000).collect();
        shuffle(&mut narrow, &mut Rng::from_seed(9));
        shuffle(&mut wide, &mut Rng::from_seed(9));
        assert!(narrow.iter().map(|&x| u64::from(x)).eq(wide));
    }

    #[test]
    fn shuffle_prefix_matches_the_full_shuffle() {
        let full = permutation(50, &mut Rng::from_seed(5));
        for steps in [0, 1, 15, 16, 17, 49] {
            let mut slots: Vec<u64> = (0..50).collect();
            shuffle_prefix(&mut slots, steps, &mut Rng::from_seed(5));
            assert_eq!(slots[..steps], full[..steps], "steps = {steps}");
        }
    }

    #[test]
    fn shuffle_of_empty_and_single_slices() {
        let mut empty: [u8; 0] = [];
        shuffle(&mut empty, &mut Rng::from_seed(0));
        let mut one = [7];
        shuffle(&mut one, &mut Rng::from_seed(0));
        assert_eq!(one, [7]);
    }

    /// Every value must be equally likely at every position. An off-by-one in the
    /// draw (Sattolo's `below(len - i - 1)`, which never leaves a value in place, or
    /// the naive `below(len)`) fails this by a wide margin.
    #[test]
    fn permutation_positions_are_uniform() {
        const N: usize = 5;
        let mut rng = Rng::from_seed(11);
        let mut counts = [[0u64; N]; N];
        for _ in 0..50_000 {
            for (position, &value) in permutation(N as u64, &mut rng).iter().enumerate() {
                counts[value as usize][position] += 1;
            }
        }
        for row in &counts {
            assert_chi_square_uniform(row);
        }
    }

    /// All 24 orderings of 4 elements must be equally likely (the naive shuffle's
    /// 4^4 = 256 equally likely paths cannot spread evenly over 24 outcomes).
    #[test]
    fn permutations_of_four_are_equally_likely() {
        let mut rng = Rng::from_seed(12);
        let mut counts = [0u64; 256];
        for _ in 0..120_000 {
            let p = permutation(4, &mut rng);
            counts[(p[0] * 64 + p[1] * 16 + p[2] * 4 + p[3]) as usize] += 1;
        }
        let observed: Vec<u64> = counts.iter().copied().filter(|&c| c > 0).collect();
        assert_eq!(observed.len(), 24);
        assert_chi_square_fits(&observed, &[1.0 / 24.0; 24]);
    }

    #[test]
    fn random_indices_of_empty_dataset_yield_nothing() {
        for replacement in [false, true] {
            let it = RandomIndices::new(0, 10, replacement, 0);
            assert_eq!(it.len(), 0);
            assert_eq!(it.count(), 0);
        }
    }

    #[test]
    fn random_indices_with_zero_samples_yield_nothing() {
        assert_eq!(RandomIndices::new(10, 0, false, 0).count(), 0);
        assert_eq!(RandomIndices::new(10, 0, true, 0).count(), 0);
    }

    #[test]
    fn random_indices_of_one_element() {
        assert_eq!(RandomIndices::new(1, 3, false, 0).collect::<Vec<_>>(), [0, 0, 0]);
        assert_eq!(RandomIndices::new(1, 3, true, 0).collect::<Vec<_>>(), [0, 0, 0]);
    }

    #[test]
    fn random_indices_one_round_is_the_permutation() {
        let stream: Vec<u64> = RandomIndices::new(100, 100, false, 3).collect();
        assert_eq!(stream, permutation(100, &mut Rng::from_seed(3)));
    }

    #[test]
    fn random_indices_more_samples_than_items_chain_fresh_permutations() {
        let (n, num_samples) = (10u64, 25u64);
        let stream: Vec<u64> = RandomIndices::new(n, num_samples, false, 4).collect();
        let mut rng = Rng::from_seed(4);
        let mut expected = permutation(n, &mut rng);
        expected.extend(permutation(n, &mut rng));
        expected.extend(&permutation(n, &mut rng)[..5]);
        assert_eq!(stream, expected);
        assert_ne!(stream[..10], stream[10..20], "rounds must be fresh permutations");
    }

    #[test]
    fn random_indices_fewer_samples_than_items_are_a_prefix() {
        let stream: Vec<u64> = RandomIndices::new(1000, 7, false, 5).collect();
        assert_eq!(stream, permutation(1000, &mut Rng::from_seed(5))[..7]);
    }

    #[test]
    fn random_indices_with_replacement_are_independent_draws() {
        let stream: Vec<u64> = RandomIndices::new(10, 1000, true, 6).collect();
        let mut rng = Rng::from_seed(6);
        let expected: Vec<u64> = (0..1000).map(|_| rng.below(10)).collect();
        assert_eq!(stream, expected);
    }

    #[test]
    fn random_indices_report_exact_length() {
        let mut it = RandomIndices::new(10, 25, false, 0);
        assert_eq!(it.len(), 25);
        it.next();
        assert_eq!(it.len(), 24);
        assert_eq!(it.by_ref().count(), 24);
        assert_eq!(it.len(), 0);
        assert_eq!(it.next(), None);
    }
}
