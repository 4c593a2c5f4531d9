//! Uniform shuffles and `RandomSampler`'s index stream.
//!
//! Two algorithms, both producing uniformly random orders:
//!
//! * [`shuffle`] is the forward Fisher–Yates shuffle: for `i` in `0..len-1`, swap
//!   slot `i` with slot `j = i + below(len - i)`. One random access per element,
//!   which is cheap while the slice fits in cache and a cache miss per element
//!   (~100 ns on a server) once it does not. Which `j` each step draws depends only
//!   on the generator, so the element type does not change the order.
//!
//! * [`permutation`] of more than [`SCATTER_THRESHOLD`] indices uses the scatter
//!   shuffle of Rao (1961) and Sandelius (1962), so that the random accesses stay in
//!   cache. Each index `0..n`, in order, draws one of `2^b` buckets (`b` chosen so a
//!   bucket holds about [`BUCKET_TARGET`] indices); indices are laid out bucket after
//!   bucket, in index order within a bucket; then each bucket, in order, is
//!   Fisher–Yates shuffled. Uniformity: every assignment of indices to buckets has
//!   probability `2^-bn`, and for a given permutation and bucket sizes exactly one
//!   assignment produces its buckets' contents, each then ordered as the permutation
//!   says with probability `1 / size!`; neither factor depends on the permutation.
//!   Bucket draws take `b` bits at a time from the low end of each generator output
//!   (`floor(64 / b)` per output; `2^b` buckets make every `b`-bit value exact).
//!
//! Both are part of the stable order contract (see [`crate::rng`]).

use crate::compact::{self, CompactIndex};
use crate::rng::Rng;

/// Permutations of at most this many indices are a plain Fisher–Yates shuffle.
pub const SCATTER_THRESHOLD: u64 = 1 << 16;
/// The number of indices a scatter-shuffle bucket should hold: small enough that
/// shuffling it stays in a core's L2 cache (256 KiB at `u64`).
pub const BUCKET_TARGET: u64 = 1 << 15;
/// Slices larger than this many bytes are shuffled with prefetching.
const PREFETCH_MIN_BYTES: usize = 1 << 20;

/// Shuffles `items` uniformly in place (Fisher–Yates, `len - 1` draws).
pub fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    if std::mem::size_of_val(items) < PREFETCH_MIN_BYTES {
        let len = items.len();
        for i in 0..len.saturating_sub(1) {
            let j = i + rng.below((len - i) as u64) as usize;
            items.swap(i, j);
        }
    } else {
        shuffle_prefetching(items, rng);
    }
}

/// [`shuffle`] for slices beyond the cache: the draws for a block of steps are made
/// first and the slots they name prefetched, so that their cache misses overlap
/// instead of being paid one after another. The swaps then run in the usual
/// order, so the result is that of the plain loop.
fn shuffle_prefetching<T>(items: &mut [T], rng: &mut Rng) {
    const BLOCK: usize = 16;
    let len = items.len();
    let steps = len.saturating_sub(1);
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
        // SAFETY: a prefetch never faults and has no observable effect; the pointer
        // is in bounds anyway (the slice index above is checked).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(pointer) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (items, index);
    }
}

/// A uniformly random permutation of `0..n`.
pub fn permutation(n: u64, rng: &mut Rng) -> Vec<u64> {
    let mut slots = crate::buffer::filled(
        0u64,
        usize::try_from(n).expect("permutation exceeds memory"),
    );
    fill_permutation(&mut slots, rng);
    slots
}

/// Overwrites `slots` with a uniformly random permutation of `0..slots.len()`:
/// Fisher–Yates up to [`SCATTER_THRESHOLD`] slots, the scatter shuffle above.
/// `slots` may hold anything beforehand; every slot is written.
pub(crate) fn fill_permutation<T: CompactIndex>(slots: &mut [T], rng: &mut Rng) {
    let n = slots.len() as u64;
    if n <= SCATTER_THRESHOLD {
        compact::fill_identity(slots);
        shuffle(slots, rng);
    } else {
        let bucket_bits = (u64::BITS - (n / BUCKET_TARGET).leading_zeros()).min(16);
        scatter_shuffle(slots, bucket_bits, rng);
    }
}

/// The scatter shuffle with `2^bucket_bits` buckets (see the module docs).
///
/// Two passes over the same bucket draws: the first, from a copy of the
/// generator, counts each bucket's size; the second places each index at its
/// bucket's next free slot.
fn scatter_shuffle<T: CompactIndex>(slots: &mut [T], bucket_bits: u32, rng: &mut Rng) {
    let buckets = 1usize << bucket_bits;
    let n = slots.len() as u64;

    let mut bounds = vec![0usize; buckets + 1];
    for_each_bucket_draw(n, bucket_bits, &mut rng.clone(), |_, bucket| {
        bounds[bucket + 1] += 1;
    });
    for b in 0..buckets {
        bounds[b + 1] += bounds[b];
    }

    let mut next_free = bounds[..buckets].to_vec();
    for_each_bucket_draw(n, bucket_bits, rng, |index, bucket| {
        slots[next_free[bucket]] = T::from_u64(index);
        next_free[bucket] += 1;
    });

    for bucket in bounds.windows(2) {
        shuffle(&mut slots[bucket[0]..bucket[1]], rng);
    }
}

/// Calls `place(index, bucket)` for each index in `0..n`, in order, with a bucket
/// in `0..2^bucket_bits` made of the next `bucket_bits` bits of `rng`'s output.
#[inline(always)]
fn for_each_bucket_draw(
    n: u64,
    bucket_bits: u32,
    rng: &mut Rng,
    mut place: impl FnMut(u64, usize),
) {
    let per_output = u64::from(u64::BITS / bucket_bits);
    let mask = (1u64 << bucket_bits) - 1;
    let mut index = 0;
    while index < n {
        let mut bits = rng.next_u64();
        let end = n.min(index + per_output);
        while index < end {
            place(index, (bits & mask) as usize);
            bits >>= bucket_bits;
            index += 1;
        }
    }
}

/// `RandomSampler`'s index stream.
///
/// Without replacement: `num_samples / n` full fresh permutations of `0..n`, then
/// the first `num_samples % n` entries of one more (all from [`permutation`]'s
/// algorithm). With replacement: `num_samples` independent `below(n)` draws.
/// Everything comes from one [`Rng`] seeded with `seed`, in stream order.
/// `n == 0` yields nothing.
///
/// Only one permutation is held at a time, in `u32` words when `n <= 2^32`,
/// refilled in place when the next round starts.
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

/// One round of sampling without replacement: `slots` is this round's
/// permutation and `slots[next..]` is not yet yielded.
struct Round<T> {
    slots: Vec<T>,
    next: usize,
}

impl<T: CompactIndex> Round<T> {
    fn empty() -> Self {
        Round {
            slots: Vec::new(),
            next: 0,
        }
    }

    #[inline]
    fn next(&mut self, n: u64, rng: &mut Rng) -> u64 {
        if self.next == self.slots.len() {
            self.start(n, rng);
        }
        let value = self.slots[self.next];
        self.next += 1;
        value.to_u64()
    }

    /// Starts a fresh round, reusing the buffer of the last one.
    #[cold]
    fn start(&mut self, n: u64, rng: &mut Rng) {
        if self.slots.is_empty() {
            let len = usize::try_from(n).expect("permutation exceeds memory");
            self.slots = crate::buffer::filled(T::from_u64(0), len);
        }
        fill_permutation(&mut self.slots, rng);
        self.next = 0;
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
            Rounds::Narrow(round) => round.next(self.n, &mut self.rng),
            Rounds::Wide(round) => round.next(self.n, &mut self.rng),
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
    fn prefetching_shuffle_matches_the_plain_loop() {
        let mut plain: Vec<u64> = (0..100).collect();
        let mut prefetching = plain.clone();
        shuffle(&mut plain, &mut Rng::from_seed(5));
        shuffle_prefetching(&mut prefetching, &mut Rng::from_seed(5));
        assert_eq!(plain, prefetching);
        let mut big: Vec<u64> = (0..(PREFETCH_MIN_BYTES as u64 / 8 + 3)).collect();
        shuffle(&mut big, &mut Rng::from_seed(6));
        assert!(is_permutation(&big, big.len() as u64));
    }

    #[test]
    fn scatter_shuffle_is_a_permutation_for_every_bucket_count() {
        for bucket_bits in [1, 2, 7, 16] {
            let mut slots = vec![0u32; 1000];
            scatter_shuffle(&mut slots, bucket_bits, &mut Rng::from_seed(7));
            let wide: Vec<u64> = slots.iter().map(|&x| u64::from(x)).collect();
            assert!(is_permutation(&wide, 1000), "bucket_bits = {bucket_bits}");
        }
        let n = SCATTER_THRESHOLD + 1;
        assert!(is_permutation(&permutation(n, &mut Rng::from_seed(8)), n));
    }

    #[test]
    fn scatter_shuffle_of_u32_and_u64_words_agree() {
        let n = SCATTER_THRESHOLD * 2 + 5;
        let mut narrow = vec![0u32; n as usize];
        fill_permutation(&mut narrow, &mut Rng::from_seed(9));
        assert!(narrow
            .iter()
            .map(|&x| u64::from(x))
            .eq(permutation(n, &mut Rng::from_seed(9))));
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

    /// Counts how often each of the 24 orderings of 0..4 comes out of `fill`.
    fn orderings_of_four(mut fill: impl FnMut(&mut [u32])) -> Vec<u64> {
        let mut counts = [0u64; 256];
        let mut slots = [0u32; 4];
        for _ in 0..120_000 {
            fill(&mut slots);
            let code = slots.iter().fold(0, |code, &x| code * 4 + x as usize);
            counts[code] += 1;
        }
        counts.iter().copied().filter(|&c| c > 0).collect()
    }

    /// All 24 orderings of 4 elements must be equally likely (the naive shuffle's
    /// 4^4 = 256 equally likely paths cannot spread evenly over 24 outcomes).
    #[test]
    fn fisher_yates_orderings_of_four_are_equally_likely() {
        let mut rng = Rng::from_seed(12);
        let observed = orderings_of_four(|slots| fill_permutation(slots, &mut rng));
        assert_eq!(observed.len(), 24);
        assert_chi_square_fits(&observed, &[1.0 / 24.0; 24]);
    }

    /// The same for the scatter shuffle with 2 and 4 buckets, small enough that
    /// empty and overfull buckets are common.
    #[test]
    fn scatter_orderings_of_four_are_equally_likely() {
        for bucket_bits in [1, 2] {
            let mut rng = Rng::from_seed(13);
            let observed = orderings_of_four(|slots| scatter_shuffle(slots, bucket_bits, &mut rng));
            assert_eq!(observed.len(), 24);
            assert_chi_square_fits(&observed, &[1.0 / 24.0; 24]);
        }
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
        assert_eq!(
            RandomIndices::new(1, 3, false, 0).collect::<Vec<_>>(),
            [0, 0, 0]
        );
        assert_eq!(
            RandomIndices::new(1, 3, true, 0).collect::<Vec<_>>(),
            [0, 0, 0]
        );
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
        assert_ne!(
            stream[..10],
            stream[10..20],
            "rounds must be fresh permutations"
        );
    }

    #[test]
    fn random_indices_fewer_samples_than_items_are_a_prefix() {
        let stream: Vec<u64> = RandomIndices::new(1000, 7, false, 5).collect();
        assert_eq!(stream, permutation(1000, &mut Rng::from_seed(5))[..7]);
        let n = SCATTER_THRESHOLD + 10;
        let stream: Vec<u64> = RandomIndices::new(n, n + 7, false, 5).collect();
        let mut rng = Rng::from_seed(5);
        let mut expected = permutation(n, &mut rng);
        expected.extend(&permutation(n, &mut rng)[..7]);
        assert_eq!(stream, expected);
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
