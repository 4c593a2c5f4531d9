//! Sampling without replacement: the smallest exponential keys, in order.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::{validate, WeightError, WeightSummary};
use crate::rng::{exponential_of, Rng};

/// Weighted sampling without replacement: the `k` indices with the smallest
/// exponential keys `E_i / w_i` (`E_i ~ Exp(1)`), in increasing key order.
///
/// This is exactly successive weighted sampling without replacement
/// (Efraimidis–Spirakis): the minimum of independent exponentials with rates `w_i`
/// is index `i` with probability `w_i / sum(w)`, and by memorylessness the rest
/// are again independent exponentials, so the second smallest key is the second
/// pick among the remaining indices, and so on.
///
/// Zero weights get key +inf: they come after every positive weight, in index
/// order (torch also yields zero-weight categories last once positive ones are
/// exhausted).
///
/// Errors: `k > weights.len()` is `TooManySamples` (checked first, as torch does),
/// then the weights are validated as in [`super::AliasTable::new`]. `k == 0` with
/// valid weights returns an empty list.
///
/// # Keys (part of the stable order contract)
/// One [`Rng::next_exponential`] per weight, in index order, zero weights
/// included (unused for them). The key is `E_i / (w_i * s)` in `f64`, clamped to
/// `f64::MAX`, where the power of two `s` brings the largest weight into
/// `[1, 2)`: an exact rescaling that keeps keys finite for any weights (the clamp
/// keeps a positive weight over 1e308 times smaller than the largest ahead of
/// every zero weight). Ratio keys cost one logarithm per weight where log-space
/// keys `ln E_i - ln w_i` would cost two, for no precision that matters: both are
/// within an ulp or two. Equal keys fall back to index order.
///
/// # Cost
/// O(n) to draw keys, a few ns each (the logarithms in AVX2 where the CPU has
/// it: the same IEEE operations lane by lane, so the same bits). Then, if few of
/// the positive weights are wanted, a bounded selection as keys stream by (O(k)
/// memory); otherwise an LSD radix sort of the keys' bit patterns (non-negative
/// `f64`s order like them), three 10-bit passes over their top 30 bits, and one
/// insertion pass for the bits below.
pub fn weighted_without_replacement(
    weights: &[f64],
    k: u64,
    seed: u64,
) -> Result<Vec<u64>, WeightError> {
    if k > weights.len() as u64 {
        return Err(WeightError::TooManySamples);
    }
    let summary = validate(weights)?;
    if k == 0 {
        return Ok(Vec::new());
    }
    let k = k as usize;
    let keys = Keys::new(weights, summary.max, seed);
    let take = k.min(summary.positive);
    let mut picks = if summary.positive < 4096 || take <= summary.positive / 16 {
        keys.smallest_by_selection(take)
    } else {
        keys.smallest_by_radix_sort(take, &summary, k)
    };
    if picks.len() < k {
        let zero_weights = weights.iter().enumerate().filter(|&(_, &w)| w == 0.0);
        picks.extend(zero_weights.map(|(i, _)| i as u64).take(k - picks.len()));
    }
    Ok(picks)
}

/// Marks a zero weight, which has no key: +inf's bits, above every clamped key.
const ZERO_WEIGHT_KEY: u64 = 0x7FF0_0000_0000_0000;

/// Keys are drawn in blocks of this many: uniforms first, then the logarithms
/// and keys in a loop that vectorises.
const BLOCK: usize = 256;

/// The radix sort keeps the generator's state every this many weights, so that
/// replaying one weight's draw steps it at most this many times.
const SNAPSHOT_STRIDE: usize = 16 * BLOCK;

/// The keys of one call, drawn from a generator seeded with `seed`.
struct Keys<'a> {
    weights: &'a [f64],
    /// A power of two that brings the largest weight into `[1, 2)`.
    scale: f64,
    seed: u64,
    /// Whether the CPU has AVX2, for the block kernels.
    avx2: bool,
}

impl<'a> Keys<'a> {
    fn new(weights: &'a [f64], max_weight: f64, seed: u64) -> Self {
        // max_weight = 2^(e - 1023) * 1.m for biased exponent e (e = 0 for
        // subnormals, which act like e = 1 here); the scale 2^(1023 - e) has
        // biased exponent 2046 - e, or is the subnormal 2^-1023 when e = 2046.
        let biased_exponent = (max_weight.to_bits() >> 52) as i64;
        let scale_exponent = 2046 - biased_exponent;
        let scale = if scale_exponent >= 1 {
            f64::from_bits((scale_exponent as u64) << 52)
        } else {
            f64::from_bits(1 << 51)
        };
        Keys {
            weights,
            scale,
            seed,
            avx2: has_avx2(),
        }
    }

    /// The bit pattern of weight `w`'s key given its exponential draw:
    /// `E / (w * scale)`, that is `E / w` up to the exact power-of-two factor,
    /// computed without overflow for any weights, and clamped to `f64::MAX`.
    #[inline]
    fn key(&self, exponential: f64, w: f64) -> u64 {
        (exponential / (w * self.scale)).min(f64::MAX).to_bits()
    }

    /// One block's keys: `keys[i]` for `weights[i]` and its uniform
    /// `uniforms[i]`, [`ZERO_WEIGHT_KEY`] for a zero weight; `uniforms` become
    /// the exponentials. Branch-free, so that it vectorises; `inline(always)` so
    /// that the AVX2 copy is AVX2 code.
    #[inline(always)]
    fn block_keys(&self, uniforms: &mut [f64], weights: &[f64], keys: &mut [u64]) {
        exponentials_in_place(uniforms);
        for ((key, &exponential), &w) in keys.iter_mut().zip(&*uniforms).zip(weights) {
            let positive_key = self.key(exponential, w);
            *key = if w > 0.0 {
                positive_key
            } else {
                ZERO_WEIGHT_KEY
            };
        }
    }

    /// One block's packed words, the block starting at index `first`: like
    /// [`Keys::block_keys`], packed, and meaningless for zero weights.
    #[inline(always)]
    fn block_words(
        &self,
        packing: &Packing,
        first: usize,
        uniforms: &mut [f64],
        weights: &[f64],
        words: &mut [u64],
    ) {
        exponentials_in_place(uniforms);
        let blocks = words.iter_mut().zip(&*uniforms).zip(weights).enumerate();
        for (offset, ((word, &exponential), &w)) in blocks {
            *word = packing.pack(first + offset, self.key(exponential, w));
        }
    }

    /// Calls `visit(first, weights, uniforms)` for each block of weights in
    /// order, `first` being the block's first index and `uniforms` its draws.
    /// Every weight gets one draw, used or not.
    #[inline]
    fn for_each_block(&self, mut visit: impl FnMut(usize, &'a [f64], &mut [f64], &Rng)) {
        let mut rng = Rng::from_seed(self.seed);
        let mut uniforms = [0.0; BLOCK];
        for (block, weights) in self.weights.chunks(BLOCK).enumerate() {
            // The generator before this block's draws, for snapshots.
            let before = rng.clone();
            let uniforms = &mut uniforms[..weights.len()];
            for u in uniforms.iter_mut() {
                *u = rng.next_f64_nonzero();
            }
            visit(block * BLOCK, weights, uniforms, &before);
        }
    }

    /// Calls `visit(index, key)` for every positive weight, in index order.
    #[inline]
    fn for_each(&self, mut visit: impl FnMut(usize, u64)) {
        let mut keys = [0u64; BLOCK];
        self.for_each_block(|first, weights, uniforms, _| {
            let keys = &mut keys[..weights.len()];
            #[cfg(target_arch = "x86_64")]
            if self.avx2 {
                // SAFETY: the CPU has AVX2 (`has_avx2`).
                unsafe { block_keys_avx2(self, uniforms, weights, keys) };
            } else {
                self.block_keys(uniforms, weights, keys);
            }
            #[cfg(not(target_arch = "x86_64"))]
            self.block_keys(uniforms, weights, keys);
            for (offset, &key) in keys.iter().enumerate() {
                if key != ZERO_WEIGHT_KEY {
                    visit(first + offset, key);
                }
            }
        });
    }

    /// The keys of `indices` (ascending, positive weights), replaying the draws:
    /// each weight consumes one output, so skipping an index is one `next_u64`.
    /// `snapshots[j]`, where given, is the generator before the draw of index
    /// `j * SNAPSHOT_STRIDE`, and saves the steps up to there.
    fn replay(&self, indices: &[u64], snapshots: &[Rng]) -> Vec<u64> {
        let mut rng = Rng::from_seed(self.seed);
        let mut drawn = 0;
        let mut keys = Vec::with_capacity(indices.len());
        for &index in indices {
            let snapshot = (index / SNAPSHOT_STRIDE as u64) as usize;
            let snapshot_index = (snapshot * SNAPSHOT_STRIDE) as u64;
            if snapshot_index > drawn && snapshot < snapshots.len() {
                rng = snapshots[snapshot].clone();
                drawn = snapshot_index;
            }
            while drawn < index {
                rng.next_u64();
                drawn += 1;
            }
            let exponential = exponential_of(rng.next_f64_nonzero());
            keys.push(self.key(exponential, self.weights[index as usize]));
            drawn += 1;
        }
        keys
    }

    /// The `take` smallest (key, index) pairs, in order, keeping at most
    /// `2 * take` candidates: whenever the buffer fills, select the `take`
    /// smallest and admit from then on only pairs below the largest of them.
    fn smallest_by_selection(&self, take: usize) -> Vec<u64> {
        if take == 0 {
            return Vec::new();
        }
        let mut candidates: Vec<(u64, u64)> = Vec::with_capacity(2 * take);
        let mut bound = (u64::MAX, u64::MAX);
        self.for_each(|index, key| {
            let pair = (key, index as u64);
            if pair < bound {
                candidates.push(pair);
                if candidates.len() == 2 * take {
                    candidates.select_nth_unstable(take - 1);
                    bound = candidates[take - 1];
                    candidates.truncate(take);
                }
            }
        });
        candidates.sort_unstable();
        candidates.truncate(take);
        candidates.into_iter().map(|(_, index)| index).collect()
    }

    /// The `take` smallest (key, index) pairs, in order, by LSD radix sort, in a
    /// vector with room for `capacity` indices.
    fn smallest_by_radix_sort(
        &self,
        take: usize,
        summary: &WeightSummary,
        capacity: usize,
    ) -> Vec<u64> {
        let packing = Packing::new(
            self.weights.len(),
            self.scale,
            summary.min_positive,
            u64::BITS,
        );
        self.radix_sort_packed(take, summary, capacity, &packing)
    }

    /// [`Keys::smallest_by_radix_sort`] with the given packing.
    ///
    /// Each positive weight's key is packed beside its index into one `u64` (see
    /// [`Packing`]) as the keys are drawn, with all the bits the index leaves
    /// free. Words are packed in index order and LSD radix sort is stable, so
    /// only key bits need passes: three 10-bit passes over the top 30 bits of
    /// the key leave the words sorted by (top 30 bits, index). Counts for each
    /// pass are taken as the words are drawn (the first) or moved by the pass
    /// before (the others), and a pass whose digit is the same for every word
    /// is skipped. The words are drawn into scratch space that starts on a huge
    /// page boundary ([`crate::buffer::aligned_scratch`]), so that its first
    /// touch faults in 2 MiB pages only, and three passes leave them in the
    /// result vector.
    ///
    /// A single insertion pass then sorts by whole word, that is by (packed
    /// key, index): words only ever move within a run of equal top bits, rare
    /// and short unless the keys crowd together (then runs are sorted one by
    /// one instead). Keys that differ only in bits the packing dropped tie in
    /// the packed word; the draws are replayed for just those (very few)
    /// indices and their runs re-sorted by full key, so the result is a sort by
    /// (full key, index). The sorted words then become the result in place.
    fn radix_sort_packed(
        &self,
        take: usize,
        summary: &WeightSummary,
        capacity: usize,
        packing: &Packing,
    ) -> Vec<u64> {
        // 1024 buckets: 2048 fall off a cliff (TLB and L1 misses in the scatter).
        const DIGIT_BITS: u32 = 10;
        const BUCKETS: usize = 1 << DIGIT_BITS;
        const SORTED_BITS: u32 = 30;
        const MAX_PASSES: usize = SORTED_BITS.div_ceil(DIGIT_BITS) as usize;
        let sorted_bits = packing.key_bits.min(SORTED_BITS);
        let passes = sorted_bits.div_ceil(DIGIT_BITS) as usize;
        // The sorted bits are the top `sorted_bits` of the key, bits `low` and up
        // of the word (the bits above the key are zero).
        let low = packing.index_bits + packing.key_bits - sorted_bits;
        // Below 64 for every pass that runs: `low + sorted_bits <= 64`.
        let shifts: [u32; MAX_PASSES] =
            std::array::from_fn(|pass| (low + pass as u32 * DIGIT_BITS).min(u64::BITS - 1));
        let digit = |word: u64, pass: usize| (word >> shifts[pass]) as usize & (BUCKETS - 1);

        let positive = summary.positive;
        let mut counts = [[0usize; BUCKETS]; MAX_PASSES];
        let mut snapshots = Vec::with_capacity(self.weights.len().div_ceil(SNAPSHOT_STRIDE));
        // The words are drawn into scratch space that huge pages back in full,
        // so that the passes end in `words`, the result, after three moves.
        let (mut scratch_buffer, offset) = crate::buffer::aligned_scratch::<u64>(positive);
        let drawn = &mut scratch_buffer.spare_capacity_mut()[offset..offset + positive];
        let mut len = 0;
        let mut block_words = [0u64; BLOCK];
        self.for_each_block(|first, weights, uniforms, rng| {
            if first % SNAPSHOT_STRIDE == 0 {
                snapshots.push(rng.clone());
            }
            let block_words = &mut block_words[..weights.len()];
            #[cfg(target_arch = "x86_64")]
            if self.avx2 {
                // SAFETY: the CPU has AVX2 (`has_avx2`).
                unsafe { block_words_avx2(self, packing, first, uniforms, weights, block_words) };
            } else {
                self.block_words(packing, first, uniforms, weights, block_words);
            }
            #[cfg(not(target_arch = "x86_64"))]
            self.block_words(packing, first, uniforms, weights, block_words);
            for (&w, &word) in weights.iter().zip(&*block_words) {
                if w > 0.0 {
                    if passes > 0 {
                        counts[0][digit(word, 0)] += 1;
                    }
                    drawn[len].write(word);
                    len += 1;
                }
            }
        });
        assert_eq!(len, positive);
        // SAFETY: the loop above initialised all `positive` elements, and
        // `MaybeUninit<u64>` has the layout of `u64`.
        let scratch = unsafe { &mut *(drawn as *mut [MaybeUninit<u64>] as *mut [u64]) };

        let mut words: Vec<u64> = crate::buffer::with_capacity(positive.max(capacity));
        let mut in_scratch = true;
        for pass in 0..passes {
            let count_next = pass + 1 < passes;
            if counts[pass].contains(&positive) {
                // One digit for every word: nothing to move.
                if count_next {
                    let source = if in_scratch { &*scratch } else { &words[..] };
                    for &word in source {
                        counts[pass + 1][digit(word, pass + 1)] += 1;
                    }
                }
                continue;
            }
            let mut next_slot = [0usize; BUCKETS];
            let mut sum = 0;
            for (slot, &c) in next_slot.iter_mut().zip(&counts[pass]) {
                *slot = sum;
                sum += c;
            }
            if count_next {
                let next_count = &mut counts[pass + 1];
                let digits = |word| {
                    next_count[digit(word, pass + 1)] += 1;
                    digit(word, pass)
                };
                radix_pass(in_scratch, scratch, &mut words, &mut next_slot, digits);
            } else {
                let digits = |word| digit(word, pass);
                radix_pass(in_scratch, scratch, &mut words, &mut next_slot, digits);
            }
            in_scratch = !in_scratch;
        }
        if in_scratch {
            words.clear();
            words.extend_from_slice(scratch);
        }
        drop(scratch_buffer);

        let ties = finish_sort(&mut words, take, low, packing);
        if !ties.is_empty() {
            self.resolve_ties(&mut words, &ties, packing, &snapshots);
        }
        words.truncate(take);
        for word in &mut words {
            *word = packing.index(*word);
        }
        words
    }

    /// Re-sorts the given runs of equal packed keys by full key.
    fn resolve_ties(
        &self,
        words: &mut [u64],
        runs: &[Range<usize>],
        packing: &Packing,
        snapshots: &[Rng],
    ) {
        let mut tied: Vec<u64> = runs
            .iter()
            .flat_map(|run| words[run.clone()].iter().map(|&word| packing.index(word)))
            .collect();
        tied.sort_unstable();
        let full_keys = self.replay(&tied, snapshots);
        let full_key = |index: u64| full_keys[tied.binary_search(&index).unwrap()];
        let mut members = Vec::new();
        for run in runs {
            let run = &mut words[run.clone()];
            members.clear();
            members.extend(run.iter().map(|&word| {
                let index = packing.index(word);
                (full_key(index), index, word)
            }));
            members.sort_unstable();
            for (slot, &(_, _, word)) in run.iter_mut().zip(&members) {
                *slot = word;
            }
        }
    }
}

/// Replaces uniforms by their exponentials, in a loop of its own: with the
/// logarithm's dependency chain apart from the key's division, more iterations
/// overlap (0.7 ms less per 1M keys than one fused loop, with AVX2).
#[inline(always)]
fn exponentials_in_place(uniforms: &mut [f64]) {
    for u in uniforms {
        *u = exponential_of(*u);
    }
}

/// One LSD radix pass between the scratch space and `words`, either way; the
/// words fill all of `scratch` and, once moved there, `words`.
#[inline(always)]
fn radix_pass(
    to_words: bool,
    scratch: &mut [u64],
    words: &mut Vec<u64>,
    next_slot: &mut [usize],
    digit: impl FnMut(u64) -> usize,
) {
    if to_words {
        let len = scratch.len();
        words.clear();
        scatter(
            scratch,
            &mut words.spare_capacity_mut()[..len],
            next_slot,
            digit,
        );
        // SAFETY: `next_slot` started at the bucket starts of a count of these
        // very words' digits, so the scatter wrote every one of the `len` slots.
        unsafe { words.set_len(len) };
    } else {
        scatter(words, scratch, next_slot, digit);
    }
}

/// One LSD radix pass: each word to `target[next_slot[digit(word)]]`, in order.
#[inline(always)]
fn scatter<T: Slot>(
    words: &[u64],
    target: &mut [T],
    next_slot: &mut [usize],
    mut digit: impl FnMut(u64) -> usize,
) {
    for &word in words {
        let d = digit(word);
        target[next_slot[d]].set(word);
        next_slot[d] += 1;
    }
}

/// Where [`scatter`] can write a word: initialised or not.
trait Slot {
    fn set(&mut self, word: u64);
}

impl Slot for u64 {
    #[inline(always)]
    fn set(&mut self, word: u64) {
        *self = word;
    }
}

impl Slot for MaybeUninit<u64> {
    #[inline(always)]
    fn set(&mut self, word: u64) {
        self.write(word);
    }
}

/// Given `words` sorted by (bits `low` and up, index), sorts by whole word the
/// prefix that holds the smallest `take` words, and returns the runs of equal
/// packed keys that reach into the first `take`.
///
/// Insertion sort: words only move within runs of equal top bits, which are
/// short unless the keys crowd together; past a budget of moves, the runs are
/// sorted one by one instead.
fn finish_sort(words: &mut [u64], take: usize, low: u32, packing: &Packing) -> Vec<Range<usize>> {
    let top = |word: u64| word.checked_shr(low).unwrap_or(0);
    let mut end = take;
    while end < words.len() && top(words[end]) == top(words[end - 1]) {
        end += 1;
    }
    let prefix = &mut words[..end];
    let key = |word: u64| packing.key(word);
    let mut tied_keys = Vec::new();
    let mut moves = 0;
    let budget = 4 * end + 1024;
    for i in 1..end {
        let word = prefix[i];
        if word < prefix[i - 1] {
            let mut j = i - 1;
            while j > 0 && prefix[j - 1] > word {
                j -= 1;
            }
            prefix.copy_within(j..i, j + 1);
            prefix[j] = word;
            moves += i - j;
            if moves > budget {
                return finish_sort_by_runs(prefix, take, low, packing);
            }
            if key(prefix[j + 1]) == key(word) || (j > 0 && key(prefix[j - 1]) == key(word)) {
                tied_keys.push(key(word));
            }
        } else if key(prefix[i - 1]) == key(word) {
            tied_keys.push(key(word));
        }
    }
    tied_keys.sort_unstable();
    tied_keys.dedup();
    tied_keys
        .into_iter()
        .map(|tied| {
            let start = prefix.partition_point(|&word| key(word) < tied);
            start..prefix.partition_point(|&word| key(word) <= tied)
        })
        .filter(|run| run.start < take)
        .collect()
}

/// [`finish_sort`] for the prefix it found, one run of equal top bits at a time.
fn finish_sort_by_runs(
    prefix: &mut [u64],
    take: usize,
    low: u32,
    packing: &Packing,
) -> Vec<Range<usize>> {
    let top = |word: u64| word.checked_shr(low).unwrap_or(0);
    let mut ties = Vec::new();
    let mut start = 0;
    while start < prefix.len() {
        let run_top = top(prefix[start]);
        let len = prefix[start..].partition_point(|&word| top(word) == run_top);
        let run = &mut prefix[start..start + len];
        run.sort_unstable();
        let mut tie_start = 0;
        for j in 1..=len {
            if j == len || packing.key(run[j]) != packing.key(run[tie_start]) {
                if j - tie_start > 1 && start + tie_start < take {
                    ties.push(start + tie_start..start + j);
                }
                tie_start = j;
            }
        }
        start += len;
    }
    ties
}

/// Whether the block kernels may use AVX2.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`Keys::block_keys`] compiled for AVX2: 4 lanes where SSE2 has 2. Rust never
/// fuses a multiply and an add, so every lane computes the same bits.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_keys_avx2(keys: &Keys<'_>, uniforms: &mut [f64], weights: &[f64], out: &mut [u64]) {
    keys.block_keys(uniforms, weights, out)
}

/// [`Keys::block_words`] compiled for AVX2, as [`block_keys_avx2`].
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_words_avx2(
    keys: &Keys<'_>,
    packing: &Packing,
    first: usize,
    uniforms: &mut [f64],
    weights: &[f64],
    out: &mut [u64],
) {
    keys.block_words(packing, first, uniforms, weights, out)
}

/// How a key and its index share one `u64` for radix sorting: the index in the
/// low `index_bits`, and above it `key_bits` of `key - LOWEST_KEY`, keeping the
/// top bits of the range keys can take.
///
/// That range is known before any key is drawn: keys are at least
/// `E / 2 >= -ln(1 - 2^-53) / 2 > 5e-17` (or exactly 0, which saturates to the
/// bottom), and at most `36.8 / (min w * scale)`. Positive `f64` bit patterns
/// are close to a scaled log2, so `m` bits over a range of `b` binades resolve
/// keys to about `2^(-m + log2 b)` of their value; with the 44 bits that 1M
/// indices leave, equal packed keys of different full keys are very rare.
struct Packing {
    index_bits: u32,
    key_bits: u32,
    dropped_bits: u32,
}

impl Packing {
    /// `5e-17f64.to_bits()` (checked by a test; const `to_bits` needs Rust 1.83).
    const LOWEST_KEY: u64 = 0x3C8C_D2B2_97D8_89BC;

    /// The packing for `len` weights, keeping at most `max_key_bits` of a key.
    fn new(len: usize, scale: f64, min_positive: f64, max_key_bits: u32) -> Self {
        let index_bits = u64::BITS - (len as u64 - 1).leading_zeros();
        let highest_key = (37.0 / (min_positive * scale)).min(f64::MAX).to_bits();
        let range_bits = u64::BITS - (highest_key - Self::LOWEST_KEY).leading_zeros();
        let key_bits = range_bits.min(max_key_bits).min(u64::BITS - index_bits);
        Packing {
            index_bits,
            key_bits,
            dropped_bits: range_bits - key_bits,
        }
    }

    #[inline]
    fn pack(&self, index: usize, key: u64) -> u64 {
        let largest = u64::MAX.checked_shr(u64::BITS - self.key_bits).unwrap_or(0);
        let offset = key.saturating_sub(Self::LOWEST_KEY);
        // `dropped_bits < 64` (keys are below 2^63), and `index_bits < 64`
        // (slices are shorter than 2^63).
        let truncated = (offset >> self.dropped_bits).min(largest);
        (truncated << self.index_bits) | index as u64
    }

    #[inline]
    fn key(&self, word: u64) -> u64 {
        word.checked_shr(self.index_bits).unwrap_or(0)
    }

    #[inline]
    fn index(&self, word: u64) -> u64 {
        word & u64::MAX
            .checked_shr(u64::BITS - self.index_bits)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_stats::assert_chi_square_fits;
    use crate::weighted::AliasTable;

    fn proportions(weights: &[f64]) -> Vec<f64> {
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
    }

    fn keys_of(weights: &[f64], seed: u64) -> Keys<'_> {
        Keys::new(weights, validate(weights).unwrap().max, seed)
    }

    #[test]
    fn scale_brings_the_largest_weight_into_one_two() {
        for max in [
            1.0,
            1.5,
            3.0,
            1e-300,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
        ] {
            let scaled = max * Keys::new(&[], max, 0).scale;
            if max.is_normal() {
                assert!((1.0..2.0).contains(&scaled), "{max:e} -> {scaled}");
            } else {
                assert!(scaled > 0.0 && scaled < 2.0, "{max:e} -> {scaled}");
            }
        }
    }

    /// Every positive weight's (key, index), sorted: the definition of the order.
    fn sorted_by_comparison(keys: &Keys<'_>) -> Vec<u64> {
        let mut pairs = Vec::new();
        keys.for_each(|index, key| pairs.push((key, index as u64)));
        pairs.sort_unstable();
        pairs.into_iter().map(|(_, index)| index).collect()
    }

    #[test]
    fn packing_round_trips_the_index_and_keeps_key_order() {
        let packing = Packing::new(1000, 1.0, 1e-3, 30);
        assert_eq!(packing.index_bits, 10);
        assert_eq!(packing.key_bits, 30);
        let small = packing.pack(999, 0.5f64.to_bits());
        let large = packing.pack(3, 2.0f64.to_bits());
        assert_eq!((packing.index(small), packing.index(large)), (999, 3));
        assert!(packing.key(small) < packing.key(large));
        assert_eq!(packing.key(packing.pack(7, 0)), 0);
        assert_eq!(
            packing.key(packing.pack(7, f64::MAX.to_bits())),
            (1 << 30) - 1
        );
    }

    #[test]
    fn packing_keeps_every_bit_the_index_leaves() {
        // Keys in [5e-17, 37000]: a range of 59 bits, of which 54 fit.
        let packing = Packing::new(1000, 1.0, 1e-3, u64::BITS);
        assert_eq!(packing.key_bits, 54);
        assert_eq!(packing.dropped_bits, 5);
        let highest = (37.0f64 / 1e-3).to_bits();
        assert_eq!(
            packing.key(packing.pack(0, highest)),
            (highest - Packing::LOWEST_KEY) >> 5
        );
        assert_eq!(packing.index(packing.pack(999, highest)), 999);
        // Few keys: nothing dropped.
        let packing = Packing::new(4, 1.0, 1.0, u64::BITS);
        assert_eq!((packing.index_bits, packing.dropped_bits), (2, 0));
    }

    #[test]
    fn lowest_key_is_5e_minus_17() {
        assert_eq!(Packing::LOWEST_KEY, 5e-17f64.to_bits());
    }

    #[test]
    fn packing_one_weight_needs_no_index_bits() {
        let packing = Packing::new(1, 1.0, 1.0, u64::BITS);
        assert_eq!(packing.index_bits, 0);
        assert_eq!(packing.index(packing.pack(0, 1.0f64.to_bits())), 0);
    }

    #[test]
    fn replay_reproduces_the_drawn_keys() {
        let weights = [0.0, 1.0, 2.0, 0.0, 3.0, 4.0];
        let keys = keys_of(&weights, 5);
        let mut drawn = Vec::new();
        keys.for_each(|index, key| drawn.push((index as u64, key)));
        let indices: Vec<u64> = drawn.iter().map(|&(i, _)| i).collect();
        let replayed = keys.replay(&indices, &[]);
        assert!(drawn.iter().map(|&(_, key)| key).eq(replayed));
        assert_eq!(keys.replay(&[4], &[]), [drawn[2].1]);
    }

    #[test]
    fn replay_from_snapshots_reproduces_the_drawn_keys() {
        let n = 5 * SNAPSHOT_STRIDE + 17;
        let weights: Vec<f64> = (0..n).map(|i| (i % 5) as f64).collect();
        let keys = keys_of(&weights, 6);
        let mut drawn = vec![None; n];
        keys.for_each(|index, key| drawn[index] = Some(key));
        let mut snapshots = Vec::new();
        keys.for_each_block(|first, _, _, rng| {
            if first % SNAPSHOT_STRIDE == 0 {
                snapshots.push(rng.clone());
            }
        });
        assert_eq!(snapshots.len(), 6);
        let indices: Vec<u64> = [1, 2, 4097, 4099, 3 * 4096 - 1, 3 * 4096 + 1, n - 1]
            .into_iter()
            .filter(|&i| weights[i] > 0.0)
            .map(|i| i as u64)
            .collect();
        let expected: Vec<u64> = indices
            .iter()
            .map(|&i| drawn[i as usize].unwrap())
            .collect();
        assert_eq!(keys.replay(&indices, &snapshots), expected);
        assert_eq!(keys.replay(&indices, &snapshots[..2]), expected);
        assert_eq!(keys.replay(&indices, &[]), expected);
    }

    /// `finish_sort` on words sorted by (top bits, index), with runs short and
    /// long (past the insertion budget), against a plain sort.
    #[test]
    fn finish_sort_sorts_by_whole_word_and_finds_packed_ties() {
        let packing = Packing {
            index_bits: 16,
            key_bits: 40,
            dropped_bits: 0,
        };
        let low = 16 + 40 - 30;
        let mut rng = Rng::from_seed(11);
        for crowd in [1u64 << 40, 1 << 12, 1 << 4] {
            let mut words: Vec<u64> = (0..50_000u64)
                .map(|index| (rng.below(crowd) << 16) | index)
                .collect();
            words.sort_by_key(|&word| (word >> low, packing.index(word)));
            let mut expected = words.clone();
            expected.sort_unstable();
            for take in [1, 1000, 50_000] {
                let mut sorted = words.clone();
                let ties = finish_sort(&mut sorted, take, low, &packing);
                assert_eq!(
                    sorted[..take],
                    expected[..take],
                    "crowd {crowd} take {take}"
                );
                let mut expected_ties = Vec::new();
                let mut start = 0;
                for i in 1..=expected.len() {
                    if i == expected.len()
                        || packing.key(expected[i]) != packing.key(expected[start])
                    {
                        if i - start > 1 && start < take {
                            expected_ties.push(start..i);
                        }
                        start = i;
                    }
                }
                assert_eq!(ties, expected_ties, "crowd {crowd} take {take}");
            }
        }
    }

    /// Selection and radix sort must agree with a comparison sort of the keys by
    /// (key, index), including for weights so extreme that many keys tie in
    /// their packed words, and for packings that keep fewer key bits than the
    /// sort has passes for or many more.
    #[test]
    fn selection_and_radix_sort_agree_with_a_comparison_sort() {
        let spread: Vec<f64> = (0..20_000)
            .map(|i| match i % 5 {
                0 => 0.0,
                1 => 1e-200,
                _ => (i % 97) as f64 + 0.5,
            })
            .collect();
        let ties: Vec<f64> = (0..20_000)
            .map(|i| if i == 0 { 1e300 } else { 1e-300 })
            .collect();
        let even: Vec<f64> = (0..20_000).map(|i| 1.0 + (i % 3) as f64).collect();
        for weights in [&spread, &ties, &even] {
            let keys = keys_of(weights, 8);
            let summary = validate(weights).unwrap();
            let expected = sorted_by_comparison(&keys);
            for take in [1, 100, 999, 1000, 1001, 15_000, 16_000] {
                assert_eq!(keys.smallest_by_selection(take), expected[..take]);
                let sorted = keys.smallest_by_radix_sort(take, &summary, take);
                assert_eq!(sorted, expected[..take]);
                for max_key_bits in [8, 20, 30, 36] {
                    let packing = Packing::new(
                        weights.len(),
                        keys.scale,
                        summary.min_positive,
                        max_key_bits,
                    );
                    let sorted = keys.radix_sort_packed(take, &summary, take, &packing);
                    assert_eq!(sorted, expected[..take], "{max_key_bits} key bits");
                }
            }
        }
    }

    /// One tiny weight stretches the key range so far that packed words with
    /// 30 key bits keep ~20 bits of each key: among 50k keys some then tie, and
    /// only the replayed full keys can order them.
    #[test]
    fn radix_sort_orders_keys_that_tie_in_their_packed_words() {
        let mut weights = vec![1.0; 50_000];
        weights[0] = 1e-280;
        let keys = keys_of(&weights, 9);
        let summary = validate(&weights).unwrap();
        let packing = Packing::new(weights.len(), keys.scale, summary.min_positive, 30);
        let mut packed_keys = Vec::new();
        keys.for_each(|index, key| packed_keys.push(packing.key(packing.pack(index, key))));
        packed_keys.sort_unstable();
        let ties = packed_keys.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(ties > 0, "the test needs ties to be meaningful");
        let n = weights.len();
        let expected = sorted_by_comparison(&keys);
        assert_eq!(keys.radix_sort_packed(n, &summary, n, &packing), expected);
        assert_eq!(keys.smallest_by_radix_sort(n, &summary, n), expected);
    }

    #[test]
    fn zero_weights_come_last_in_index_order_on_both_paths() {
        let mut weights = vec![1.0; 10_000];
        for w in weights.iter_mut().step_by(3) {
            *w = 0.0;
        }
        let n = weights.len() as u64;
        let all = weighted_without_replacement(&weights, n, 3).unwrap();
        let positive = weights.iter().filter(|&&w| w > 0.0).count();
        let zeros: Vec<u64> = (0..n).step_by(3).collect();
        assert_eq!(all[positive..], zeros);
        let mut sorted = all.clone();
        sorted.sort_unstable();
        assert!(sorted.into_iter().eq(0..n));
    }

    #[test]
    fn too_many_samples_is_checked_before_the_weights() {
        let err = weighted_without_replacement(&[1.0, 2.0], 3, 0);
        assert_eq!(err, Err(WeightError::TooManySamples));
        let err = weighted_without_replacement(&[f64::NAN], 2, 0);
        assert_eq!(err, Err(WeightError::TooManySamples));
        let err = weighted_without_replacement(&[], 1, 0);
        assert_eq!(err, Err(WeightError::TooManySamples));
    }

    #[test]
    fn zero_samples_without_replacement_is_empty() {
        assert_eq!(weighted_without_replacement(&[1.0, 2.0], 0, 0), Ok(vec![]));
    }

    #[test]
    fn without_replacement_takes_everything_once() {
        let weights = [5.0, 0.0, 1.0, 2.0, 0.0, 0.25];
        let picks = weighted_without_replacement(&weights, 6, 3).unwrap();
        let mut sorted = picks.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4, 5]);
        // Zero weights come last, in index order.
        assert_eq!(picks[4..], [1, 4]);
    }

    #[test]
    fn without_replacement_of_one_category() {
        assert_eq!(weighted_without_replacement(&[2.0], 1, 0), Ok(vec![0]));
    }

    #[test]
    fn first_pick_follows_the_weights() {
        let weights = [1.0, 2.0, 3.0, 0.0, 6.0, 0.5];
        let mut counts = [0u64; 6];
        for seed in 0..40_000 {
            let picks = weighted_without_replacement(&weights, 1, seed).unwrap();
            counts[picks[0] as usize] += 1;
        }
        assert_chi_square_fits(&counts, &proportions(&weights));
    }

    /// Successive sampling: P(first = i, second = j) = w_i / W * w_j / (W - w_i).
    /// Independent draws ordered by weight, or any other shortcut, fail this.
    #[test]
    fn first_two_picks_are_successive_draws() {
        let weights = [1.0, 2.0, 5.0];
        let total: f64 = weights.iter().sum();
        let mut counts = [0u64; 9];
        let mut probabilities = [0.0; 9];
        for (i, wi) in weights.iter().enumerate() {
            for (j, wj) in weights.iter().enumerate() {
                if i != j {
                    probabilities[i * 3 + j] = wi / total * wj / (total - wi);
                }
            }
        }
        for seed in 0..40_000 {
            let picks = weighted_without_replacement(&weights, 2, seed).unwrap();
            counts[(picks[0] * 3 + picks[1]) as usize] += 1;
        }
        assert_chi_square_fits(&counts, &probabilities);
    }

    /// torch stops at 2^24 categories; rloader must not. The heavy weight sits
    /// past 2^24 so that truncation to 2^24 or f32 index arithmetic would show.
    #[test]
    fn more_categories_than_torch_allows() {
        let n = (1usize << 24) + 10;
        let heavy = n - 3;
        // Mostly zeros, which keeps this test quick in debug builds.
        let mut weights = vec![0.0; n];
        for w in weights.iter_mut().step_by(4096) {
            *w = 1e-9;
        }
        weights[heavy] = 1.0;
        weights[n - 1] = 0.0;

        let table = AliasTable::new(&weights).unwrap();
        assert_eq!(table.len(), n);
        let mut rng = Rng::from_seed(0);
        let hits = (0..1000)
            .filter(|_| table.sample(&mut rng) == heavy as u64)
            .count();
        assert!(hits > 900, "heavy index drawn {hits} times in 1000");

        let picks = weighted_without_replacement(&weights, 3, 0).unwrap();
        assert_eq!(picks[0], heavy as u64);
        assert!(picks[1..].iter().all(|&i| i % 4096 == 0));
    }
}
