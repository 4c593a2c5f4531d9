//! Sampling without replacement: the smallest exponential keys, in order.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::{in_parallel, threads_for, validate, WeightError, WeightSummary};
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
/// memory); otherwise a radix sort of the keys' bit patterns (non-negative
/// `f64`s order like them): each key goes into a bucket by its top bits as it
/// is drawn, then each bucket gets a counting sort and an insertion pass; the
/// radix sort's draws and bucket sorts run on up to [`threads_for`] threads for
/// 2^16 weights or more, and the order does not depend on how many.
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
    fn for_each_block(&self, visit: impl FnMut(usize, &'a [f64], &mut [f64], &Rng)) {
        self.for_each_block_in(0..self.weights.len(), visit);
    }

    /// [`Keys::for_each_block`] for the weights in `range` only, which starts on
    /// a block boundary: the generator first steps past the earlier draws.
    #[inline]
    fn for_each_block_in(
        &self,
        range: Range<usize>,
        mut visit: impl FnMut(usize, &'a [f64], &mut [f64], &Rng),
    ) {
        debug_assert_eq!(range.start % BLOCK, 0);
        let mut rng = Rng::from_seed(self.seed);
        for _ in 0..range.start {
            rng.next_u64();
        }
        let mut uniforms = [0.0; BLOCK];
        let start = range.start;
        for (block, weights) in self.weights[range].chunks(BLOCK).enumerate() {
            // The generator before this block's draws, for snapshots.
            let before = rng.clone();
            let uniforms = &mut uniforms[..weights.len()];
            for u in uniforms.iter_mut() {
                *u = rng.next_f64_nonzero();
            }
            visit(start + block * BLOCK, weights, uniforms, &before);
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

    /// The `take` smallest (key, index) pairs, in order, by radix sort (see
    /// [`Keys::radix_sort_packed`]), in a vector with room for at least
    /// `capacity` indices, on up to [`threads_for`] threads.
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
        let threads = threads_for(self.weights.len());
        self.radix_sort_packed(take, summary, capacity, &packing, threads)
    }

    /// [`Keys::smallest_by_radix_sort`] with the given packing and number of
    /// threads (the result does not depend on it).
    ///
    /// Each positive weight's key is packed beside its index into one `u64` (see
    /// [`Packing`]), so that sorting the words sorts by (packed key, index). The
    /// words go into buckets small enough to sort in a core's caches as they are
    /// drawn:
    ///
    /// 1. Plan: consecutive fine digits ([`FineDigits`]) are grouped into buckets
    ///    of about `positive / 512` words, but no fewer than 64 or more than 4096,
    ///    as estimated from a sample of keys ([`Keys::sampled_digit_counts`]).
    /// 2. Draw: each thread draws the keys of one range of weights (its
    ///    generator first stepped past the ranges before it), packs them, and
    ///    appends each word to its bucket's chain of blocks in room of its own
    ///    ([`Drawn`]).
    /// 3. Count: the chains give each bucket's exact size, hence where its
    ///    words go in the result.
    /// 4. Sort: each thread sorts a run of buckets, about as many words as the
    ///    others, from the blocks of every range into the result
    ///    ([`sort_bucket`]), as far as the bucket that holds the `take`-th word,
    ///    and turns them into indices.
    ///
    /// The sample decides only how evenly the words spread over buckets, never
    /// the order: a bucket the sample misjudged is larger or smaller, and still
    /// sorted whole.
    ///
    /// Keys that differ only in bits the packing dropped tie in the packed word,
    /// and equal packed keys share a bucket; the draws are replayed for just
    /// those (very few) indices and their runs re-sorted by full key, so the
    /// result is a sort by (full key, index).
    ///
    /// Threads share nothing mutable but disjoint slices: each draws into its
    /// own [`Drawn`], and the sorting threads write disjoint runs of the result
    /// and only read the draws, after every drawing thread has been joined.
    fn radix_sort_packed(
        &self,
        take: usize,
        summary: &WeightSummary,
        capacity: usize,
        packing: &Packing,
        threads: usize,
    ) -> Vec<u64> {
        let n = self.weights.len();
        let positive = summary.positive;
        let digits = FineDigits::new(self, packing);
        // No call asks for more samples than weights.
        debug_assert!(take <= capacity && capacity <= n);

        // 1. Plan the buckets from a sample of keys.
        let target = positive.div_ceil(512).clamp(64, 4096);
        let sampled = self.sampled_digit_counts(&digits, packing);
        let sampled_total: usize = sampled.iter().sum();
        let sample_target = (sampled_total * target).div_ceil(positive).max(1);
        let (bucket_of, _) = plan_buckets(&sampled, sample_target);
        let buckets = usize::from(*bucket_of.last().expect("one digit at least")) + 1;

        // 2. Draw, each range of weights into blocks of its own.
        let ranges: Vec<Range<usize>> = split_points(n, threads)
            .windows(2)
            .map(|pair| pair[0]..pair[1])
            .collect();
        let drawn = in_parallel(ranges, |range: Range<usize>| {
            let mut drawn = Drawn::new(range.len(), buckets);
            let mut block_words = [0u64; BLOCK];
            self.for_each_block_in(range, |first, weights, uniforms, rng| {
                if first % SNAPSHOT_STRIDE == 0 {
                    drawn.snapshots.push(rng.clone());
                }
                let block_words = &mut block_words[..weights.len()];
                #[cfg(target_arch = "x86_64")]
                if self.avx2 {
                    // SAFETY: the CPU has AVX2 (`has_avx2`).
                    unsafe {
                        block_words_avx2(self, packing, first, uniforms, weights, block_words)
                    };
                } else {
                    self.block_words(packing, first, uniforms, weights, block_words);
                }
                #[cfg(not(target_arch = "x86_64"))]
                self.block_words(packing, first, uniforms, weights, block_words);
                for (&w, &word) in weights.iter().zip(&*block_words) {
                    if w > 0.0 {
                        drawn.push(usize::from(bucket_of[digits.digit(word)]), word);
                    }
                }
            });
            drawn
        });

        // 3. Count each bucket's words: bucket b's go to the result's places
        // bucket_starts[b]..bucket_starts[b + 1].
        let mut bucket_starts = Vec::with_capacity(buckets + 1);
        let mut total = 0;
        for b in 0..buckets {
            bucket_starts.push(total);
            total += drawn.iter().map(|d| d.len_of(b)).sum::<usize>();
        }
        bucket_starts.push(total);
        assert_eq!(total, positive);

        // 4. Sort the buckets up to the one holding the `take`-th word, in runs of
        // buckets about equal in words, one run per thread, and make them indices.
        let last = bucket_starts.partition_point(|&start| start < take);
        let sorted_end = bucket_starts[last];
        let mut words: Vec<u64> = crate::buffer::with_capacity(sorted_end.max(capacity));
        let mut runs = Vec::with_capacity(threads);
        let mut rest = &mut words.spare_capacity_mut()[..sorted_end];
        let mut first_bucket = 0;
        for t in 1..=threads {
            let end_bucket = if t == threads {
                last
            } else {
                let end_word = sorted_end * t / threads;
                bucket_starts
                    .partition_point(|&start| start < end_word)
                    .min(last)
            };
            let len = bucket_starts[end_bucket] - bucket_starts[first_bucket];
            let (run, tail) = rest.split_at_mut(len);
            runs.push((first_bucket..end_bucket, run));
            rest = tail;
            first_bucket = end_bucket;
        }
        let snapshots: Vec<Rng> = drawn.iter().flat_map(|d| d.snapshots.clone()).collect();
        let (bucket_starts, drawn, snapshots) = (&bucket_starts, &drawn, &snapshots);
        in_parallel(
            runs,
            |(range, run): (Range<usize>, &mut [MaybeUninit<u64>])| {
                let origin = bucket_starts[range.start];
                let mut counts = Box::new([0u32; 1 << SUB_DIGIT_BITS]);
                let untie = |sorted: &mut [u64], start: usize| {
                    if packing.dropped_bits > 0 && has_packed_ties(sorted, packing) {
                        let ties = packed_ties(sorted, packing, take.saturating_sub(start));
                        if !ties.is_empty() {
                            self.resolve_ties(sorted, &ties, packing, snapshots);
                        }
                    }
                };
                // Buckets are sorted in here, in cache, and copied out in order:
                // scattered stores straight into `run` each missed the cache.
                let widest = range
                    .clone()
                    .map(|b| bucket_starts[b + 1] - bucket_starts[b])
                    .filter(|&len| len <= HOT_BUCKET_WORDS)
                    .max()
                    .unwrap_or(0);
                let mut hot: Vec<u64> = Vec::with_capacity(widest);
                let mut chunks: Vec<&[u64]> = Vec::new();
                for b in range {
                    let bucket = bucket_starts[b]..bucket_starts[b + 1];
                    chunks.clear();
                    for d in drawn {
                        d.chunks_of(b, &mut chunks);
                    }
                    let out = &mut run[bucket.start - origin..bucket.end - origin];
                    if bucket.len() <= HOT_BUCKET_WORDS {
                        let hot = &mut hot.spare_capacity_mut()[..bucket.len()];
                        let sorted = sort_bucket(&chunks, hot, &mut counts);
                        untie(sorted, bucket.start);
                        for (place, &word) in out.iter_mut().zip(&*sorted) {
                            place.write(packing.index(word));
                        }
                    } else {
                        let sorted = sort_bucket(&chunks, out, &mut counts);
                        untie(sorted, bucket.start);
                        for word in sorted.iter_mut() {
                            *word = packing.index(*word);
                        }
                    }
                }
            },
        );
        // SAFETY: the runs cover `0..sorted_end`, and each sorted bucket wrote
        // all its places (`sort_bucket`).
        unsafe { words.set_len(sorted_end) };
        words.truncate(take);
        if words.capacity() > 2 * capacity {
            words.shrink_to(capacity);
        }
        words
    }

    /// How many of [`PLAN_DRAWS`] keys for each weight of an evenly spaced
    /// sample fall in each fine digit: an estimate, up to scale, of how the
    /// keys will spread. Its draws come from a generator of their own and
    /// decide no order (only how [`Keys::radix_sort_packed`] groups digits).
    fn sampled_digit_counts(&self, digits: &FineDigits, packing: &Packing) -> Vec<usize> {
        let stride = (self.weights.len() / RANGE_SAMPLE).max(1);
        let mut rng = Rng::from_seed(self.seed ^ PLAN_SEED);
        // At most one key per 8 weights: the sample must stay cheap beside the sort it plans.
        let draws = PLAN_DRAWS.min((self.weights.len() / (8 * RANGE_SAMPLE)).max(1));
        let mut counts = vec![0; digits.count()];
        for &w in self.weights.iter().step_by(stride) {
            if w > 0.0 {
                for _ in 0..draws {
                    let key = self.key(exponential_of(rng.next_f64_nonzero()), w);
                    counts[digits.digit(packing.pack(0, key))] += 1;
                }
            }
        }
        counts
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
/// overlap than in one fused loop.
#[inline(always)]
fn exponentials_in_place(uniforms: &mut [f64]) {
    for u in uniforms {
        *u = exponential_of(*u);
    }
}

/// The radix sort's first digit has this many bits (see [`FineDigits`]).
const FINE_BITS: u32 = 14;

/// How many weights [`FineDigits::new`] and [`Keys::sampled_digit_counts`]
/// sample, evenly spaced.
const RANGE_SAMPLE: usize = 1024;

/// The radix sort's first digit of a packed word: where its key lies, in 2^14
/// steps, between bounds that all but a few keys fall within. Keys below or
/// above the bounds count as the first or the last digit.
///
/// Keys' bit patterns are close to a scaled log2; the keys of weight `w` lie in
/// `[1.1e-16, 36.8] / (w * scale)`, so the bounds come from the second smallest
/// and second largest of a sample of the weights. With the bounds of all the weights, one
/// tiny weight among 4M equal ones stretched the range so far that a digit held
/// 160k words; over the ~60 binades that keys from moderate weights span, a
/// step is about 1/256 of a binade (of 1M keys from equal weights, no digit
/// holds more than ~1%).
///
/// The digit depends on the key bits only (the low bound's index bits are 0,
/// the high bound's all 1, and the shift drops at least the index bits), so
/// equal packed keys share a digit, and it never decreases as the word grows.
struct FineDigits {
    low: u64,
    high: u64,
    shift: u32,
}

impl FineDigits {
    fn new(keys: &Keys<'_>, packing: &Packing) -> Self {
        let stride = (keys.weights.len() / RANGE_SAMPLE).max(1);
        let mut sample: Vec<f64> = keys
            .weights
            .iter()
            .step_by(stride)
            .copied()
            .filter(|&w| w > 0.0)
            .collect();
        sample.sort_unstable_by(f64::total_cmp);
        // The second smallest and second largest, so that one outlier that the
        // sample caught does not stretch the bounds either.
        let inner = usize::from(sample.len() >= 4);
        let (smallest, largest) = match sample.len() {
            0 => (f64::INFINITY, 0.0),
            len => (sample[inner], sample[len - 1 - inner]),
        };
        let word = |key: f64, index: u64| {
            let key = key.min(f64::MAX).to_bits();
            packing.pack(0, key) | index
        };
        let all_index_bits = u64::MAX
            .checked_shr(u64::BITS - packing.index_bits)
            .unwrap_or(0);
        let (low, high) = if largest > 0.0 {
            (
                word(1.1e-16 / (largest * keys.scale), 0),
                word(37.0 / (smallest * keys.scale), all_index_bits),
            )
        } else {
            (0, u64::MAX)
        };
        let range_bits = u64::BITS - (high - low).leading_zeros();
        FineDigits {
            low,
            high,
            shift: range_bits.saturating_sub(FINE_BITS).max(packing.index_bits),
        }
    }

    /// How many digits there are.
    fn count(&self) -> usize {
        self.digit(self.high) + 1
    }

    #[inline]
    fn digit(&self, word: u64) -> usize {
        ((word.clamp(self.low, self.high) - self.low) >> self.shift) as usize
    }
}

/// Each bucket's words are kept in blocks of this many (4 KiB): the bucket sorts
/// read their words back in runs long enough to stream from memory.
const CHAIN_BLOCK: usize = 512;

/// Keys [`Keys::sampled_digit_counts`] draws for each sampled weight: 16 for
/// each of ~1,024 weights, about 30 a bucket when there are 512 buckets (fewer
/// below 128K weights, at most one per 8 weights).
const PLAN_DRAWS: usize = 16;

/// Mixed into the seed of the sample's own generator (any constant would do).
const PLAN_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// What one thread drew in phase 2 of [`Keys::radix_sort_packed`]: its words,
/// each bucket's a chain of blocks of [`CHAIN_BLOCK`] words in `room`.
///
/// Block `i` is `room`'s places `i * CHAIN_BLOCK..(i + 1) * CHAIN_BLOCK`.
/// Bucket `b`'s chain starts at block `b`, and `next[i]` is the block after
/// block `i`. Every block of a chain but its last is full, and `cursor[b]`,
/// the place of bucket `b`'s next word, lies in its last block. A block is
/// taken each time one fills, so `len` words need at most `buckets + len /
/// CHAIN_BLOCK` blocks.
struct Drawn {
    /// Room for the blocks, from place `offset` on: its written places are the
    /// words (its length stays 0).
    room: Vec<u64>,
    offset: usize,
    next: Vec<usize>,
    cursor: Vec<usize>,
    /// The first block no chain has taken.
    free: usize,
    /// The generator before each draw of an index that is a multiple of
    /// [`SNAPSHOT_STRIDE`] in its range.
    snapshots: Vec<Rng>,
}

impl Drawn {
    /// Room for up to `len` words in `buckets` buckets.
    fn new(len: usize, buckets: usize) -> Self {
        let blocks = buckets + len / CHAIN_BLOCK + 1;
        // Only whole huge pages back the room (`aligned_scratch`).
        let (room, offset) = crate::buffer::aligned_scratch(blocks * CHAIN_BLOCK);
        Drawn {
            room,
            offset,
            next: vec![usize::MAX; blocks],
            cursor: (0..buckets).map(|b| b * CHAIN_BLOCK).collect(),
            free: buckets,
            snapshots: Vec::new(),
        }
    }

    /// Appends `word` to `bucket`'s chain.
    #[inline]
    fn push(&mut self, bucket: usize, word: u64) {
        let at = self.cursor[bucket];
        self.room.spare_capacity_mut()[self.offset + at].write(word);
        if (at + 1) % CHAIN_BLOCK != 0 {
            self.cursor[bucket] = at + 1;
        } else {
            self.next[at / CHAIN_BLOCK] = self.free;
            self.cursor[bucket] = self.free * CHAIN_BLOCK;
            self.free += 1;
        }
    }

    /// Appends `bucket`'s words to `chunks`, a block at a time.
    fn chunks_of<'s>(&'s self, bucket: usize, chunks: &mut Vec<&'s [u64]>) {
        let last = self.cursor[bucket] / CHAIN_BLOCK;
        let mut block = bucket;
        loop {
            let len = if block == last {
                self.cursor[bucket] % CHAIN_BLOCK
            } else {
                CHAIN_BLOCK
            };
            if len > 0 {
                // SAFETY: `push` wrote every place of a chain's blocks before its
                // last, and of its last block those before the cursor.
                let words = unsafe {
                    let first = self.offset + block * CHAIN_BLOCK;
                    std::slice::from_raw_parts(self.room.as_ptr().add(first), len)
                };
                chunks.push(words);
            }
            if block == last {
                return;
            }
            block = self.next[block];
        }
    }

    /// How many words `bucket` holds.
    fn len_of(&self, bucket: usize) -> usize {
        let last = self.cursor[bucket] / CHAIN_BLOCK;
        let mut block = bucket;
        let mut len = self.cursor[bucket] % CHAIN_BLOCK;
        while block != last {
            len += CHAIN_BLOCK;
            block = self.next[block];
        }
        len
    }
}

/// `parts + 1` increasing bounds from 0 to `n` that split it into ranges that
/// take about equally long to draw, inner bounds on multiples of
/// [`SNAPSHOT_STRIDE`]: a range's generator first steps past the draws before
/// it, each step about 1/16 of a draw, so each range is 15/16 as long as the
/// one before.
fn split_points(n: usize, parts: usize) -> Vec<usize> {
    let shares: Vec<f64> = (0..parts)
        .map(|p| (15.0f64 / 16.0).powi(p as i32))
        .collect();
    let total: f64 = shares.iter().sum();
    let mut bounds = vec![0];
    let mut sum = 0.0;
    for share in &shares[..parts - 1] {
        sum += share;
        let bound = (n as f64 * sum / total) as usize / SNAPSHOT_STRIDE * SNAPSHOT_STRIDE;
        bounds.push(bound.min(n));
    }
    bounds.push(n);
    bounds
}

/// Groups consecutive fine digits into buckets of at most `target` words, or
/// of one digit where that digit holds more. Returns each digit's bucket and
/// the buckets' starts, with the total count at the end.
fn plan_buckets(counts: &[usize], target: usize) -> (Vec<u16>, Vec<usize>) {
    let mut bucket_of = Vec::with_capacity(counts.len());
    let mut starts = vec![0];
    let mut filled = 0;
    let mut total = 0;
    for &count in counts {
        if filled > 0 && filled + count > target {
            starts.push(total);
            filled = 0;
        }
        bucket_of.push((starts.len() - 1) as u16);
        filled += count;
        total += count;
    }
    starts.push(total);
    (bucket_of, starts)
}

/// Phase 4 of [`Keys::radix_sort_packed`] sorts buckets of up to this many
/// words in a buffer of its own, and larger ones (rare: a fine digit holding
/// more than 2^16 words) in place, without another buffer as large. Tests
/// lower the bound so that their draws, of up to 1M weights, take both paths.
const HOT_BUCKET_WORDS: usize = if cfg!(test) { 1 << 10 } else { 1 << 16 };

/// The most digits [`sort_bucket`] spreads a bucket over.
const SUB_DIGIT_BITS: u32 = 13;

/// Writes the words of `chunks` to `out` (as long), sorted, and returns `out`
/// as words; `counts` is room to count in.
///
/// One counting sort spreads the words over 2 to 4 times as many digits as
/// there are words (at most 2^[`SUB_DIGIT_BITS`]), by their place between the
/// smallest and the largest, so most digits hold one word or none. An
/// insertion pass then sorts by whole word: words only move within a digit.
/// Past a budget of moves (the words crowd into few digits), the bucket is
/// sorted by comparison instead.
fn sort_bucket<'a>(
    chunks: &[&[u64]],
    out: &'a mut [MaybeUninit<u64>],
    counts: &mut [u32; 1 << SUB_DIGIT_BITS],
) -> &'a mut [u64] {
    let len: usize = chunks.iter().map(|chunk| chunk.len()).sum();
    assert_eq!(len, out.len());
    if len <= 32 || u32::try_from(len).is_err() {
        let mut places = out.iter_mut();
        for &word in chunks.iter().flat_map(|chunk| chunk.iter()) {
            places.next().expect("as many places as words").write(word);
        }
        // SAFETY: every place was written just above.
        let out = unsafe { assume_init_mut(out) };
        if !insertion_sort(out, 2 * len + 64) {
            out.sort_unstable();
        }
        return out;
    }
    let (mut min, mut max) = (u64::MAX, 0);
    for chunk in chunks {
        for &word in *chunk {
            min = min.min(word);
            max = max.max(word);
        }
    }
    let digit_bits = (usize::BITS - len.leading_zeros() + 1).min(SUB_DIGIT_BITS);
    let span_bits = u64::BITS - (max - min).leading_zeros();
    let shift = span_bits.saturating_sub(digit_bits);
    let digit = |word: u64| ((word - min) >> shift) as usize;
    let next = &mut counts[..1 << digit_bits];
    next.fill(0);
    for chunk in chunks {
        for &word in *chunk {
            next[digit(word)] += 1;
        }
    }
    let mut sum = 0;
    for slot in next.iter_mut() {
        let count = *slot;
        *slot = sum;
        sum += count;
    }
    for chunk in chunks {
        for &word in *chunk {
            let slot = &mut next[digit(word)];
            out[*slot as usize].write(word);
            *slot += 1;
        }
    }
    // SAFETY: the slots started at the prefix sums of the digits' counts, so
    // each place in `0..len` was written once.
    let out = unsafe { assume_init_mut(out) };
    if !insertion_sort(out, 2 * len + 64) {
        out.sort_unstable();
    }
    out
}

/// `slice` as initialised words.
///
/// # Safety
/// Every element of `slice` must be initialised.
unsafe fn assume_init_mut(slice: &mut [MaybeUninit<u64>]) -> &mut [u64] {
    // SAFETY: `MaybeUninit<u64>` has the layout of `u64`, and the caller
    // promises that every element is initialised.
    unsafe { &mut *(slice as *mut [MaybeUninit<u64>] as *mut [u64]) }
}

/// Insertion sort that gives up (returning false, `words` permuted) once it
/// has moved words more than `budget` places in all.
fn insertion_sort(words: &mut [u64], budget: usize) -> bool {
    let mut moves = 0;
    for i in 1..words.len() {
        let word = words[i];
        if word < words[i - 1] {
            let mut j = i - 1;
            while j > 0 && words[j - 1] > word {
                j -= 1;
            }
            words.copy_within(j..i, j + 1);
            words[j] = word;
            moves += i - j;
            if moves > budget {
                return false;
            }
        }
    }
    true
}

/// Whether two neighbours in the sorted `words` have equal packed keys: a
/// branch-free scan, so that it vectorises.
fn has_packed_ties(words: &[u64], packing: &Packing) -> bool {
    let limit = 1u64.checked_shl(packing.index_bits).unwrap_or(u64::MAX);
    words
        .windows(2)
        .fold(false, |tie, pair| tie | ((pair[0] ^ pair[1]) < limit))
}

/// The runs of equal packed keys in the sorted `words` that begin before `take`.
fn packed_ties(words: &[u64], packing: &Packing, take: usize) -> Vec<Range<usize>> {
    let mut ties = Vec::new();
    let mut start = 0;
    for i in 1..=words.len() {
        if i == words.len() || packing.key(words[i]) != packing.key(words[start]) {
            if i - start > 1 && start < take {
                ties.push(start..i);
            }
            start = i;
        }
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

    /// `sort_bucket` on words in index order, with keys spread wide, crowded
    /// into few bits (runs past the insertion budget) and all equal, against a
    /// plain sort; and `packed_ties` against a scan of the expected order.
    #[test]
    fn sort_bucket_sorts_by_whole_word_and_packed_ties_are_found() {
        let packing = Packing {
            index_bits: 16,
            key_bits: 40,
            dropped_bits: 1,
        };
        let mut rng = Rng::from_seed(11);
        for crowd in [1u64 << 40, 1 << 20, 1 << 12, 1 << 4, 1] {
            for len in [0, 1, 2, 31, 33, 1000, 50_000] {
                let words: Vec<u64> = (0..len as u64)
                    .map(|index| (rng.below(crowd) << 16) | index)
                    .collect();
                let mut expected = words.clone();
                expected.sort_unstable();
                // Whole, and in chunks as the blocks of a chain give them.
                let chunked: Vec<&[u64]> = words.chunks(CHAIN_BLOCK).collect();
                for chunks in [vec![&words[..]], chunked] {
                    let mut out = vec![MaybeUninit::uninit(); len];
                    let mut counts = Box::new([0; 1 << SUB_DIGIT_BITS]);
                    let sorted = sort_bucket(&chunks, &mut out, &mut counts);
                    assert_eq!(sorted, expected, "crowd {crowd} len {len}");
                }
                let sorted = expected.clone();
                for take in [len, len / 2, 1, 0] {
                    let mut expected_ties = Vec::new();
                    let mut start = 0;
                    for i in 1..=len {
                        if i == len || packing.key(expected[i]) != packing.key(expected[start]) {
                            if i - start > 1 && start < take {
                                expected_ties.push(start..i);
                            }
                            start = i;
                        }
                    }
                    let ties = packed_ties(&sorted, &packing, take);
                    assert_eq!(ties, expected_ties, "crowd {crowd} len {len} take {take}");
                }
            }
        }
    }

    #[test]
    fn plan_buckets_groups_digits_up_to_the_target() {
        let (bucket_of, starts) = plan_buckets(&[3, 0, 2, 9, 1, 1, 0, 4], 4);
        assert_eq!(bucket_of, [0, 0, 1, 2, 3, 3, 3, 4]);
        assert_eq!(starts, [0, 3, 5, 14, 16, 20]);
        let (bucket_of, starts) = plan_buckets(&[0, 0], 4);
        assert_eq!((bucket_of, starts), (vec![0, 0], vec![0, 0]));
    }

    #[test]
    fn split_points_cover_the_weights_on_snapshot_bounds() {
        assert_eq!(split_points(10_000, 1), [0, 10_000]);
        assert_eq!(split_points(100, 2), [0, 0, 100]);
        let n = 1_000_000;
        let bounds = split_points(n, 2);
        assert_eq!(bounds.len(), 3);
        assert_eq!(bounds[1] % SNAPSHOT_STRIDE, 0);
        // 16/31 of the weights, rounded down to a snapshot bound.
        assert_eq!(bounds[1], n * 16 / 31 / SNAPSHOT_STRIDE * SNAPSHOT_STRIDE);
        for parts in [3, 8] {
            let bounds = split_points(n, parts);
            assert_eq!((bounds[0], bounds[parts]), (0, n));
            assert!(bounds.windows(2).all(|pair| pair[0] <= pair[1]));
            assert!(bounds[1..parts].iter().all(|b| b % SNAPSHOT_STRIDE == 0));
        }
    }

    #[test]
    fn has_packed_ties_matches_a_scan() {
        let packing = Packing {
            index_bits: 4,
            key_bits: 20,
            dropped_bits: 3,
        };
        assert!(!has_packed_ties(&[], &packing));
        assert!(!has_packed_ties(&[0x10, 0x21, 0x32], &packing));
        assert!(has_packed_ties(&[0x10, 0x21, 0x2f], &packing));
        let whole = Packing {
            index_bits: 0,
            key_bits: 64,
            dropped_bits: 0,
        };
        assert!(!has_packed_ties(&[1, 2, 3], &whole));
        assert!(has_packed_ties(&[1, 2, 2], &whole));
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
                    for threads in [1, 2, 3] {
                        let sorted =
                            keys.radix_sort_packed(take, &summary, take, &packing, threads);
                        assert_eq!(
                            sorted,
                            expected[..take],
                            "{max_key_bits} key bits, {threads} threads"
                        );
                    }
                }
            }
        }
    }

    /// 2^17 weights take the threaded path of `weighted_without_replacement`
    /// (on a machine with more than one core), in every shape of result.
    #[test]
    fn large_draws_agree_with_a_comparison_sort() {
        let mut rng = Rng::from_seed(12);
        let weights: Vec<f64> = (0..1 << 17)
            .map(|i| {
                if i % 7 == 0 {
                    0.0
                } else {
                    rng.next_f64() * 100.0
                }
            })
            .collect();
        let expected = sorted_by_comparison(&keys_of(&weights, 13));
        let positive = expected.len();
        for k in [positive / 2, positive, weights.len()] {
            let picks = weighted_without_replacement(&weights, k as u64, 13).unwrap();
            let sorted_part = k.min(positive);
            assert_eq!(picks[..sorted_part], expected[..sorted_part], "k {k}");
            assert_eq!(picks.len(), k);
        }
    }

    /// `radix_sort_packed` of all of `weights`, on 1 and 2 threads, against a
    /// comparison sort of the keys.
    fn assert_whole_radix_sort_is_a_comparison_sort(weights: &[f64], seed: u64) {
        let expected = sorted_by_comparison(&keys_of(weights, seed));
        let keys = keys_of(weights, seed);
        let summary = validate(weights).unwrap();
        let packing = Packing::new(weights.len(), keys.scale, summary.min_positive, 64);
        for threads in [1, 2] {
            let picks =
                keys.radix_sort_packed(weights.len(), &summary, weights.len(), &packing, threads);
            assert!(picks == expected, "{threads} threads");
        }
    }

    /// 600k weights make buckets of up to ~1.2k words, on both sides of the
    /// tests' `HOT_BUCKET_WORDS`: sorted in their own buffer or in place.
    #[test]
    fn buckets_sorted_in_a_buffer_or_in_place_agree_with_a_comparison_sort() {
        let mut rng = Rng::from_seed(21);
        let weights: Vec<f64> = (0..600_000).map(|_| rng.next_f64() + 0.5).collect();
        assert_whole_radix_sort_is_a_comparison_sort(&weights, 22);
    }

    /// The plan's sample sees only weights of 1, but half the weights are
    /// 1e-200: their keys all land in the last buckets, far over the planned
    /// size, and are sorted all the same.
    #[test]
    fn a_sample_that_misses_half_the_weights_still_sorts() {
        let stride = 200_000 / RANGE_SAMPLE;
        let weights: Vec<f64> = (0..200_000)
            .map(|i| {
                if i % stride != 0 && i % 2 == 0 {
                    1e-200
                } else {
                    1.0
                }
            })
            .collect();
        assert_whole_radix_sort_is_a_comparison_sort(&weights, 23);
    }

    /// One tiny weight stretches the whole key range by ~1000 binades; the fine
    /// digits still spread the other keys (they took a sixth of 1M keys into
    /// one digit when they spanned the whole range).
    #[test]
    fn fine_digits_spread_keys_despite_an_outlier_weight() {
        // 12_345 is not one of the sampled indices, 0 and 195 * 64 are.
        for (outlier, at) in [
            (1e-300, 12_345),
            (1e300, 12_345),
            (1e-300, 0),
            (1e300, 195 * 64),
        ] {
            let mut weights = vec![1.0; 200_000];
            weights[at] = outlier;
            let keys = keys_of(&weights, 14);
            let summary = validate(&weights).unwrap();
            let packing = Packing::new(weights.len(), keys.scale, summary.min_positive, 64);
            let digits = FineDigits::new(&keys, &packing);
            let mut counts = vec![0usize; digits.count()];
            let mut previous = 0;
            let mut words = Vec::new();
            keys.for_each(|index, key| words.push(packing.pack(index, key)));
            words.sort_unstable();
            for word in words {
                let digit = digits.digit(word);
                assert!(digit >= previous, "digits must not decrease as words grow");
                previous = digit;
                counts[digit] += 1;
            }
            let largest = counts.iter().max().unwrap();
            assert!(
                *largest < 2_000,
                "{outlier:e}: a digit holds {largest} of 200k words"
            );
        }
    }

    /// Zero weights leave gaps in the draw ranges of all threads but the last.
    #[test]
    fn ranges_with_zero_weights_sort_like_a_comparison_sort() {
        let weights: Vec<f64> = (0..70_000)
            .map(|i| {
                if i % 2 == 0 || i < 20_000 {
                    0.0
                } else {
                    (i % 13) as f64
                }
            })
            .collect();
        let keys = keys_of(&weights, 15);
        let summary = validate(&weights).unwrap();
        let expected = sorted_by_comparison(&keys);
        let packing = Packing::new(weights.len(), keys.scale, summary.min_positive, 64);
        for threads in 1..=4 {
            for take in [1, expected.len() / 3, expected.len()] {
                let sorted = keys.radix_sort_packed(take, &summary, take, &packing, threads);
                assert_eq!(sorted, expected[..take], "{threads} threads, take {take}");
            }
        }
    }

    #[test]
    fn a_short_result_of_many_weights_keeps_little_room() {
        let mut weights = vec![0.0; 1 << 18];
        for w in weights.iter_mut().step_by(64) {
            *w = 1.0;
        }
        let picks = weighted_without_replacement(&weights, 2000, 16).unwrap();
        assert_eq!(picks.len(), 2000);
        assert!(picks.capacity() < 8000, "capacity {}", picks.capacity());
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
        for threads in [1, 2] {
            let sorted = keys.radix_sort_packed(n, &summary, n, &packing, threads);
            assert_eq!(sorted, expected, "{threads} threads");
        }
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
