//! Sampling without replacement: the smallest exponential keys, in order.

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
/// O(n) to draw keys, a few ns each. Then, if few of the positive weights are
/// wanted, a bounded selection as keys stream by (O(k) memory); otherwise an LSD
/// radix sort of the keys' bit patterns (non-negative `f64`s order like them),
/// three 10-bit passes.
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

/// The keys of one call, drawn from a generator seeded with `seed`.
struct Keys<'a> {
    weights: &'a [f64],
    /// A power of two that brings the largest weight into `[1, 2)`.
    scale: f64,
    seed: u64,
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
        }
    }

    /// The bit pattern of weight `w`'s key given its exponential draw:
    /// `E / (w * scale)`, that is `E / w` up to the exact power-of-two factor,
    /// computed without overflow for any weights, and clamped to `f64::MAX`.
    #[inline]
    fn key(&self, exponential: f64, w: f64) -> u64 {
        (exponential / (w * self.scale)).min(f64::MAX).to_bits()
    }

    /// Calls `visit(index, key)` for every positive weight, in index order.
    ///
    /// Works in blocks: draw a block's uniforms, then take their logarithms and
    /// form the keys in branch-free loops that vectorise. Every weight gets one
    /// draw and one logarithm, used or not.
    #[inline]
    fn for_each(&self, mut visit: impl FnMut(usize, u64)) {
        const BLOCK: usize = 256;
        let mut rng = Rng::from_seed(self.seed);
        let mut uniforms = [0.0; BLOCK];
        let mut keys = [0u64; BLOCK];
        for (block, weights) in self.weights.chunks(BLOCK).enumerate() {
            let uniforms = &mut uniforms[..weights.len()];
            let keys = &mut keys[..weights.len()];
            for u in uniforms.iter_mut() {
                *u = rng.next_f64_nonzero();
            }
            for ((key, &u), &w) in keys.iter_mut().zip(&*uniforms).zip(weights) {
                let positive_key = self.key(exponential_of(u), w);
                *key = if w > 0.0 {
                    positive_key
                } else {
                    ZERO_WEIGHT_KEY
                };
            }
            for (offset, &key) in keys.iter().enumerate() {
                if key != ZERO_WEIGHT_KEY {
                    visit(block * BLOCK + offset, key);
                }
            }
        }
    }

    /// The keys of `indices` (ascending, positive weights), replaying the draws:
    /// each weight consumes one output, so skipping an index is one `next_u64`.
    fn replay(&self, indices: &[u64]) -> Vec<u64> {
        let mut rng = Rng::from_seed(self.seed);
        let mut drawn = 0;
        let mut keys = Vec::with_capacity(indices.len());
        for &index in indices {
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
    ///
    /// Each positive weight's key is packed beside its index into one `u64` (see
    /// [`Packing`]) as the keys are drawn, and the digit counts of every pass are
    /// taken in the same loop. Words are packed in index order and LSD radix sort
    /// is stable, so only the key bits need passes: equal packed keys stay in
    /// index order. Keys that differ only in bits the packing dropped tie in the
    /// packed word; the draws are replayed for just those (few) indices and
    /// their runs re-sorted by full key, so the result is a sort by
    /// (full key, index). The sorted words then become the result in place.
    fn smallest_by_radix_sort(
        &self,
        take: usize,
        summary: &WeightSummary,
        capacity: usize,
    ) -> Vec<u64> {
        // 1024 buckets: 2048 fall off a cliff (TLB and L1 misses in the scatter).
        const DIGIT_BITS: u32 = 10;
        const BUCKETS: usize = 1 << DIGIT_BITS;
        const MAX_PASSES: usize = Packing::MAX_KEY_BITS.div_ceil(DIGIT_BITS) as usize;
        let packing = Packing::new(self.weights.len(), self.scale, summary.min_positive);
        let passes = packing.key_bits.div_ceil(DIGIT_BITS) as usize;
        let digit = |word: u64, pass: usize| {
            let shift = packing.index_bits + pass as u32 * DIGIT_BITS;
            (word.checked_shr(shift).unwrap_or(0) as usize) & (BUCKETS - 1)
        };

        let mut counts = [[0usize; BUCKETS]; MAX_PASSES];
        let mut words = crate::buffer::with_capacity(summary.positive.max(capacity));
        self.for_each(|index, key| {
            let word = packing.pack(index, key);
            for (pass, count) in counts[..passes].iter_mut().enumerate() {
                count[digit(word, pass)] += 1;
            }
            words.push(word);
        });

        // Same capacity as `words`: either may end up holding the result.
        let mut scratch = crate::buffer::with_capacity(words.capacity());
        scratch.resize(words.len(), 0);
        for (pass, count) in counts[..passes].iter().enumerate() {
            if count.contains(&words.len()) {
                continue; // one digit for every word: nothing to move
            }
            let mut next_slot = [0usize; BUCKETS];
            let mut sum = 0;
            for (slot, &c) in next_slot.iter_mut().zip(count) {
                *slot = sum;
                sum += c;
            }
            for &word in &words {
                let d = digit(word, pass);
                scratch[next_slot[d]] = word;
                next_slot[d] += 1;
            }
            std::mem::swap(&mut words, &mut scratch);
        }
        drop(scratch);

        self.resolve_ties(&mut words, take, &packing);
        words.truncate(take);
        for word in &mut words {
            *word = packing.index(*word);
        }
        words
    }

    /// Re-sorts by full key every run of equal packed keys that reaches into the
    /// first `take` words.
    fn resolve_ties(&self, words: &mut [u64], take: usize, packing: &Packing) {
        let mut runs = Vec::new();
        let mut start = 0;
        for end in 1..=words.len() {
            let run_ends =
                end == words.len() || packing.key(words[end]) != packing.key(words[start]);
            if run_ends {
                if end - start > 1 {
                    runs.push(start..end);
                }
                if end >= take {
                    break;
                }
                start = end;
            }
        }
        if runs.is_empty() {
            return;
        }
        let mut tied: Vec<u64> = runs
            .iter()
            .flat_map(|run| words[run.clone()].iter().map(|&word| packing.index(word)))
            .collect();
        tied.sort_unstable();
        let full_keys = self.replay(&tied);
        let full_key = |index: u64| full_keys[tied.binary_search(&index).unwrap()];
        let mut members = Vec::new();
        for run in runs {
            let run = &mut words[run];
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

/// How a key and its index share one `u64` for radix sorting: the index in the
/// low `index_bits`, and above it `key_bits` (at most [`Packing::MAX_KEY_BITS`])
/// of `key - LOWEST_KEY`, keeping the top bits of the range keys can take.
///
/// That range is known before any key is drawn: keys are at least
/// `E / 2 >= -ln(1 - 2^-53) / 2 > 5e-17` (or exactly 0, which saturates to the
/// bottom), and at most `36.8 / (min w * scale)`. Positive `f64` bit patterns
/// are close to a scaled log2, so 30 bits over a range of `b` binades resolve
/// keys to about `2^(-30 + log2 b)` of their value: three radix passes.
struct Packing {
    index_bits: u32,
    key_bits: u32,
    dropped_bits: u32,
}

impl Packing {
    const MAX_KEY_BITS: u32 = 30;
    /// `5e-17f64.to_bits()` (checked by a test; const `to_bits` needs Rust 1.83).
    const LOWEST_KEY: u64 = 0x3C8C_D2B2_97D8_89BC;

    fn new(len: usize, scale: f64, min_positive: f64) -> Self {
        let index_bits = u64::BITS - (len as u64 - 1).leading_zeros();
        let highest_key = (37.0 / (min_positive * scale)).min(f64::MAX).to_bits();
        let range_bits = u64::BITS - (highest_key - Self::LOWEST_KEY).leading_zeros();
        let key_bits = range_bits
            .min(Self::MAX_KEY_BITS)
            .min(u64::BITS - index_bits);
        Packing {
            index_bits,
            key_bits,
            dropped_bits: range_bits - key_bits,
        }
    }

    #[inline]
    fn pack(&self, index: usize, key: u64) -> u64 {
        let largest = (1u64 << self.key_bits) - 1;
        let offset = key.saturating_sub(Self::LOWEST_KEY);
        let truncated = offset
            .checked_shr(self.dropped_bits)
            .unwrap_or(0)
            .min(largest);
        truncated.checked_shl(self.index_bits).unwrap_or(0) | index as u64
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
        let packing = Packing::new(1000, 1.0, 1e-3);
        assert_eq!(packing.index_bits, 10);
        assert_eq!(packing.key_bits, Packing::MAX_KEY_BITS);
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
    fn lowest_key_is_5e_minus_17() {
        assert_eq!(Packing::LOWEST_KEY, 5e-17f64.to_bits());
    }

    #[test]
    fn packing_one_weight_needs_no_index_bits() {
        let packing = Packing::new(1, 1.0, 1.0);
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
        let replayed = keys.replay(&indices);
        assert!(drawn.iter().map(|&(_, key)| key).eq(replayed));
        assert_eq!(keys.replay(&[4]), [drawn[2].1]);
    }

    /// Selection and radix sort must agree with a comparison sort of the keys by
    /// (key, index), including for weights so extreme that many keys tie in
    /// their packed words.
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
        for weights in [&spread, &ties] {
            let keys = keys_of(weights, 8);
            let summary = validate(weights).unwrap();
            let expected = sorted_by_comparison(&keys);
            for take in [1, 100, 999, 1000, 1001, 15_000, 16_000] {
                assert_eq!(keys.smallest_by_selection(take), expected[..take]);
                let sorted = keys.smallest_by_radix_sort(take, &summary, take);
                assert_eq!(sorted, expected[..take]);
            }
        }
    }

    /// One tiny weight stretches the key range so far that the packed words keep
    /// ~20 bits of each key: among 50k keys some then tie, and only the replayed
    /// full keys can order them.
    #[test]
    fn radix_sort_orders_keys_that_tie_in_their_packed_words() {
        let mut weights = vec![1.0; 50_000];
        weights[0] = 1e-280;
        let keys = keys_of(&weights, 9);
        let summary = validate(&weights).unwrap();
        let packing = Packing::new(weights.len(), keys.scale, summary.min_positive);
        let mut packed_keys = Vec::new();
        keys.for_each(|index, key| packed_keys.push(packing.key(packing.pack(index, key))));
        packed_keys.sort_unstable();
        let ties = packed_keys.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(ties > 0, "the test needs ties to be meaningful");
        let n = weights.len();
        let sorted = keys.smallest_by_radix_sort(n, &summary, n);
        assert_eq!(sorted, sorted_by_comparison(&keys));
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
