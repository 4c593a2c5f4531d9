//! `WeightedRandomSampler`: sampling indices in proportion to `f64` weights.
//!
//! With replacement, draws come from an [`AliasTable`] (O(n) to build, O(1) per
//! draw). Without replacement, [`weighted_without_replacement`] sorts exponential
//! keys. Neither caps the number of categories (torch stops at 2^24).
//!
//! Weights are validated as torch validates them, with torch's messages
//! ([`WeightError`]), and then divided by their maximum, so that no sum or key
//! overflows however large or small the weights are.

use std::fmt;
use std::sync::Arc;

use crate::compact::{self, CompactIndex};
use crate::rng::Rng;

/// Why a list of weights cannot be sampled. `Display` gives torch's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightError {
    /// A weight is infinite, NaN or negative.
    NotFiniteOrNegative,
    /// Every weight is zero.
    ZeroSum,
    /// There are no weights.
    Empty,
    /// More samples without replacement than there are weights.
    TooManySamples,
}

impl fmt::Display for WeightError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightError::NotFiniteOrNegative => {
                "probability tensor contains either `inf`, `nan` or element < 0"
            }
            WeightError::ZeroSum => "invalid multinomial distribution (sum of probabilities <= 0)",
            WeightError::Empty => "cannot sample from an empty list of weights",
            WeightError::TooManySamples => {
                "cannot sample n_sample > prob_dist.size(-1) samples without replacement"
            }
        })
    }
}

impl std::error::Error for WeightError {}

/// Checks `weights` in torch's order and returns the largest weight (> 0).
fn validate(weights: &[f64]) -> Result<f64, WeightError> {
    if weights.is_empty() {
        return Err(WeightError::Empty);
    }
    let mut all_valid = true;
    let mut max = 0.0f64;
    for &w in weights {
        // `w >= 0.0` is false for NaN.
        all_valid &= w >= 0.0 && w < f64::INFINITY;
        max = max.max(w);
    }
    if !all_valid {
        Err(WeightError::NotFiniteOrNegative)
    } else if max == 0.0 {
        Err(WeightError::ZeroSum)
    } else {
        Ok(max)
    }
}

/// Vose's alias method: O(n) build, O(1) per draw.
///
/// Scale the weights so they average 1 and cut the interval `[0, n)` into `n`
/// columns of height 1. Column `i` keeps `keep[i]` of its own mass and is topped
/// up from one other index, `alias[i]`. A draw picks a column uniformly and a coin
/// `u` in `[0, 1)`: it returns `i` if `u < keep[i]`, else `alias[i]`.
///
/// The build pairs any index still below 1 ("small") with one still at or above 1
/// ("large"): the small one's column is finished with the large one as its alias,
/// and the large one gives up `1 - keep[small]`, possibly becoming small itself.
/// Indices left unpaired when a list runs dry are 1 up to rounding and keep their
/// whole column.
///
/// Invariant: an index of weight 0 is never returned. It is small from the start
/// with `keep = 0`, and aliases are only ever indices of positive weight.
pub struct AliasTable {
    keep: Vec<f64>,
    aliases: Aliases,
}

/// The alias column, in the narrowest word that holds every index.
enum Aliases {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl AliasTable {
    pub fn new(weights: &[f64]) -> Result<AliasTable, WeightError> {
        if compact::fits_u32(weights.len() as u64) {
            let (keep, aliases) = build_alias_columns::<u32>(weights)?;
            Ok(AliasTable {
                keep,
                aliases: Aliases::Narrow(aliases),
            })
        } else {
            let (keep, aliases) = build_alias_columns::<u64>(weights)?;
            Ok(AliasTable {
                keep,
                aliases: Aliases::Wide(aliases),
            })
        }
    }

    /// The number of categories (weights), zero-weight ones included.
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    /// Always false: a table is never built from an empty list.
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// One index, with probability proportional to its weight (two generator draws).
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let column = rng.below(self.keep.len() as u64) as usize;
        let coin = rng.next_f64();
        if coin < self.keep[column] {
            column as u64
        } else {
            match &self.aliases {
                Aliases::Narrow(aliases) => u64::from(aliases[column]),
                Aliases::Wide(aliases) => aliases[column],
            }
        }
    }
}

/// Builds the `keep` and `alias` columns of an [`AliasTable`].
fn build_alias_columns<T: CompactIndex>(
    weights: &[f64],
) -> Result<(Vec<f64>, Vec<T>), WeightError> {
    let max = validate(weights)?;
    let n = weights.len();

    // Relative weights in (0, 1] sum to at most n: no overflow. Summed in chunks so
    // that the rounding error grows with sqrt-like chunk counts, not with n.
    let mut keep: Vec<f64> = weights.iter().map(|&w| w / max).collect();
    let total: f64 = keep.chunks(4096).map(|c| c.iter().sum::<f64>()).sum();
    let to_mean_one = n as f64 / total;
    for k in &mut keep {
        *k *= to_mean_one;
    }

    // Two stacks in one buffer: small indices grow up from the front, large ones
    // down from the back. Together they never hold more than n entries.
    let mut work = vec![T::from_u64(0); n];
    let (mut small_end, mut large_start) = (0, n);
    for (i, &k) in keep.iter().enumerate() {
        if k < 1.0 {
            work[small_end] = T::from_u64(i as u64);
            small_end += 1;
        } else {
            large_start -= 1;
            work[large_start] = T::from_u64(i as u64);
        }
    }

    let mut aliases = vec![T::from_u64(0); n];
    while small_end > 0 && large_start < n {
        small_end -= 1;
        let small = work[small_end].to_u64() as usize;
        let large = work[large_start];
        aliases[small] = large;
        let large = large.to_u64() as usize;
        // `keep - 1` is exact for keep in [1, 2] (Sterbenz), so subtract first.
        keep[large] = (keep[large] - 1.0) + keep[small];
        if keep[large] < 1.0 {
            large_start += 1;
            work[small_end] = T::from_u64(large as u64);
            small_end += 1;
        }
    }

    // Leftovers are 1 up to rounding; they keep their whole column. A leftover of
    // weight 0 is impossible in exact arithmetic, but guard the invariant anyway.
    let heaviest = weights.iter().position(|&w| w == max).unwrap_or(0);
    for slot in work[..small_end].iter().chain(&work[large_start..]) {
        let i = slot.to_u64() as usize;
        if weights[i] > 0.0 {
            keep[i] = 1.0;
        } else {
            keep[i] = 0.0;
            aliases[i] = T::from_u64(heaviest as u64);
        }
    }
    Ok((keep, aliases))
}

/// `WeightedRandomSampler`'s stream with replacement: `num_samples` draws from a
/// shared [`AliasTable`], from one [`Rng`] seeded with `seed`.
pub struct WeightedIndices {
    table: Arc<AliasTable>,
    remaining: u64,
    rng: Rng,
}

impl WeightedIndices {
    pub fn new(table: Arc<AliasTable>, num_samples: u64, seed: u64) -> Self {
        WeightedIndices {
            table,
            remaining: num_samples,
            rng: Rng::from_seed(seed),
        }
    }
}

impl Iterator for WeightedIndices {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        Some(self.table.sample(&mut self.rng))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match usize::try_from(self.remaining) {
            Ok(len) => (len, Some(len)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl ExactSizeIterator for WeightedIndices {}

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
/// then the weights are validated as in [`AliasTable::new`]. `k == 0` with valid
/// weights returns an empty list.
///
/// # Keys and their order (part of the stable contract)
/// One generator draw per weight, in index order, zero weights included:
/// `E_i = -ln(u_i)` with `u_i` in `(0, 1]`, and the key is `E_i / (w_i / max w)`
/// in `f64`, clamped to `f64::MAX` (so that a positive weight ~1e308 times
/// smaller than the largest still sorts before every zero weight). Dividing by the
/// maximum keeps keys finite for any weights; ratio keys cost one logarithm per
/// weight where log-space keys `ln E_i - ln w_i` would cost two, and they lose no
/// precision that matters (both are exact to an ulp or so). Equal keys fall back
/// to index order. The logarithm is the platform's `f64::ln`, correctly rounded
/// or within an ulp on every mainstream libm, so orders agree across platforms
/// except for keys that differ in their last bit.
///
/// # Cost
/// O(n) to draw keys. For `k` close to `n`, an LSD radix sort over the key bits
/// (positive `f64`s order like their bit patterns), three 11-bit passes with the
/// index packed beside the key; for small `k`, a selection first, then a sort of
/// the `k` survivors.
pub fn weighted_without_replacement(
    weights: &[f64],
    k: u64,
    seed: u64,
) -> Result<Vec<u64>, WeightError> {
    if k > weights.len() as u64 {
        return Err(WeightError::TooManySamples);
    }
    let max = validate(weights)?;
    if k == 0 {
        return Ok(Vec::new());
    }
    let k = k as usize;
    let t0 = std::time::Instant::now();
    let keys = exponential_keys(weights, max, seed);
    eprintln!("keygen {:?}", t0.elapsed());
    let positive_picks = if compact::fits_u32(weights.len() as u64) {
        smallest_keys::<u32>(&keys, k)
    } else {
        smallest_keys::<u64>(&keys, k)
    };
    let mut picks = positive_picks;
    if picks.len() < k {
        let zero_weights = weights.iter().enumerate().filter(|&(_, &w)| w == 0.0);
        picks.extend(zero_weights.map(|(i, _)| i as u64).take(k - picks.len()));
    }
    Ok(picks)
}

/// The bit pattern of key `E_i / (w_i / max)` for each weight, [`ZERO_WEIGHT_KEY`]
/// for zero weights. Non-negative finite `f64`s order like their bit patterns.
fn exponential_keys(weights: &[f64], max: f64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::from_seed(seed);
    weights
        .iter()
        .map(|&w| {
            // `0.0 - ln u`, not `-ln u`: for u = 1 the latter is -0.0, whose bit
            // pattern would sort after every positive key.
            let u = rng.next_f64_nonzero();
            if w > 0.0 {
                let exponential = 0.0 - u.ln();
                (exponential / (w / max)).min(f64::MAX).to_bits()
            } else {
                ZERO_WEIGHT_KEY
            }
        })
        .collect()
}

/// The key of a zero weight: +inf's bits, above every clamped positive key.
const ZERO_WEIGHT_KEY: u64 = 0x7FF0_0000_0000_0000;

/// The indices of the `min(k, positive)` smallest positive keys, by (key, index).
fn smallest_keys<T: CompactIndex>(keys: &[u64], k: usize) -> Vec<u64> {
    let positive = keys.iter().filter(|&&key| key != ZERO_WEIGHT_KEY).count();
    let take = k.min(positive);
    if take == 0 {
        return Vec::new();
    }
    // Radix sorting pays off for many candidates of which many are wanted;
    // otherwise select the wanted ones first and sort only those.
    if positive < 4096 || take <= positive / 16 {
        select_then_sort::<T>(keys, take)
    } else {
        radix_sorted_prefix(keys, take)
    }
}

/// Selects the `take` smallest (key, index) pairs, then sorts just those.
fn select_then_sort<T: CompactIndex>(keys: &[u64], take: usize) -> Vec<u64> {
    let mut pairs: Vec<(u64, T)> = keys
        .iter()
        .enumerate()
        .filter(|&(_, &key)| key != ZERO_WEIGHT_KEY)
        .map(|(i, &key)| (key, T::from_u64(i as u64)))
        .collect();
    if take < pairs.len() {
        pairs.select_nth_unstable(take - 1);
        pairs.truncate(take);
    }
    pairs.sort_unstable();
    pairs.into_iter().map(|(_, i)| i.to_u64()).collect()
}

/// Bits of key kept in a packed word; 3 radix passes of [`DIGIT_BITS`].
const PACKED_KEY_BITS: u32 = 33;
const DIGIT_BITS: u32 = 11;

/// Sorts the positive keys and returns the first `take` indices.
///
/// Each candidate is packed into one `u64`: the top bits of `key - min_key`
/// (at most [`PACKED_KEY_BITS`], fewer for datasets above 2^31 entries) above its
/// index. Candidates are packed in index order and LSD radix sort is stable, so
/// only the key bits need passes: equal packed keys stay in index order. Keys that
/// differ only in the dropped low bits tie in the packed word; such runs (rare and
/// short) are then re-sorted by full key, so the result equals a sort by
/// (full key, index).
fn radix_sorted_prefix(keys: &[u64], take: usize) -> Vec<u64> {
    let index_bits = u64::BITS - (keys.len() as u64 - 1).leading_zeros();
    let (min_key, max_key) = keys
        .iter()
        .filter(|&&key| key != ZERO_WEIGHT_KEY)
        .fold((u64::MAX, 0), |(lo, hi), &key| (lo.min(key), hi.max(key)));
    let range_bits = u64::BITS - (max_key - min_key).leading_zeros();
    let key_bits = range_bits.min(PACKED_KEY_BITS).min(u64::BITS - index_bits);
    let dropped_bits = range_bits - key_bits;
    let index_mask = u64::MAX.checked_shr(u64::BITS - index_bits).unwrap_or(0);

    let mut packed: Vec<u64> = keys
        .iter()
        .enumerate()
        .filter(|&(_, &key)| key != ZERO_WEIGHT_KEY)
        .map(|(i, &key)| {
            let truncated = (key - min_key).checked_shr(dropped_bits).unwrap_or(0);
            truncated.checked_shl(index_bits).unwrap_or(0) | i as u64
        })
        .collect();
    let t0 = std::time::Instant::now();
    radix_sort_bits(&mut packed, index_bits, key_bits);
    eprintln!("radix {:?} dropped {dropped_bits} key_bits {key_bits}", t0.elapsed());

    if dropped_bits > 0 {
        let packed_key = |word: u64| word.checked_shr(index_bits).unwrap_or(0);
        let mut start = 0;
        while start < take {
            let run_key = packed_key(packed[start]);
            let mut end = start + 1;
            while end < packed.len() && packed_key(packed[end]) == run_key {
                end += 1;
            }
            if end - start > 1 {
                packed[start..end].sort_unstable_by_key(|&word| {
                    let index = word & index_mask;
                    (keys[index as usize], index)
                });
            }
            start = end;
        }
    }
    let t0 = std::time::Instant::now();
    let r = packed[..take].iter().map(|&word| word & index_mask).collect();
    eprintln!("tail {:?}", t0.elapsed());
    r
}

/// Stable LSD radix sort of `values` by bits `[low, low + width)`, in digits of
/// [`DIGIT_BITS`]. One read counts every digit; a pass whose digit is the same
/// for all values is skipped.
fn radix_sort_bits(values: &mut Vec<u64>, low: u32, width: u32) {
    const BUCKETS: usize = 1 << DIGIT_BITS;
    const MASK: u64 = BUCKETS as u64 - 1;
    let passes = width.div_ceil(DIGIT_BITS) as usize;
    let shift = |pass: usize| low + pass as u32 * DIGIT_BITS;

    let mut counts = vec![[0usize; BUCKETS]; passes];
    for &value in values.iter() {
        for (pass, count) in counts.iter_mut().enumerate() {
            count[((value >> shift(pass)) & MASK) as usize] += 1;
        }
    }

    let mut scratch = vec![0u64; values.len()];
    for (pass, count) in counts.iter().enumerate() {
        if count.contains(&values.len()) {
            continue;
        }
        let mut offsets = [0usize; BUCKETS];
        let mut sum = 0;
        for (offset, &c) in offsets.iter_mut().zip(count) {
            *offset = sum;
            sum += c;
        }
        let shift = shift(pass);
        for &value in values.iter() {
            let digit = ((value >> shift) & MASK) as usize;
            scratch[offsets[digit]] = value;
            offsets[digit] += 1;
        }
        std::mem::swap(values, &mut scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_stats::assert_chi_square_fits;

    fn proportions(weights: &[f64]) -> Vec<f64> {
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
    }

    #[test]
    fn error_messages_are_torchs() {
        assert_eq!(
            WeightError::NotFiniteOrNegative.to_string(),
            "probability tensor contains either `inf`, `nan` or element < 0"
        );
        assert_eq!(
            WeightError::ZeroSum.to_string(),
            "invalid multinomial distribution (sum of probabilities <= 0)"
        );
        assert_eq!(
            WeightError::Empty.to_string(),
            "cannot sample from an empty list of weights"
        );
        assert_eq!(
            WeightError::TooManySamples.to_string(),
            "cannot sample n_sample > prob_dist.size(-1) samples without replacement"
        );
    }

    #[test]
    fn invalid_weights_are_rejected_by_both_samplers() {
        let cases: [(&[f64], WeightError); 6] = [
            (&[], WeightError::Empty),
            (&[1.0, f64::NAN], WeightError::NotFiniteOrNegative),
            (&[1.0, f64::INFINITY], WeightError::NotFiniteOrNegative),
            (&[1.0, -0.5], WeightError::NotFiniteOrNegative),
            (&[0.0, 0.0], WeightError::ZeroSum),
            (&[-0.0], WeightError::ZeroSum),
        ];
        for (weights, error) in cases {
            assert_eq!(AliasTable::new(weights).err(), Some(error), "{weights:?}");
            let k = weights.len() as u64;
            assert_eq!(
                weighted_without_replacement(weights, k, 0).err(),
                Some(error),
                "{weights:?}"
            );
        }
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
    fn alias_table_of_one_category() {
        let table = AliasTable::new(&[3.5]).unwrap();
        assert_eq!(table.len(), 1);
        assert!(!table.is_empty());
        let mut rng = Rng::from_seed(0);
        assert!((0..100).all(|_| table.sample(&mut rng) == 0));
    }

    #[test]
    fn alias_frequencies_follow_the_weights() {
        let weights = [1.0, 2.0, 3.0, 4.0, 0.0, 10.0, 0.5, 1e-3];
        let table = Arc::new(AliasTable::new(&weights).unwrap());
        let mut counts = [0u64; 8];
        for i in WeightedIndices::new(table, 200_000, 1) {
            counts[i as usize] += 1;
        }
        assert_chi_square_fits(&counts, &proportions(&weights));
    }

    #[test]
    fn alias_frequencies_follow_extreme_weights() {
        // Weights spanning 600 orders of magnitude do not overflow the build.
        let weights = [1e300, 2e300, 1e-300, 0.0, 3e300];
        let table = AliasTable::new(&weights).unwrap();
        let mut rng = Rng::from_seed(2);
        let mut counts = [0u64; 5];
        for _ in 0..60_000 {
            counts[table.sample(&mut rng) as usize] += 1;
        }
        assert_chi_square_fits(&counts, &[1.0 / 6.0, 2.0 / 6.0, 0.0, 0.0, 3.0 / 6.0]);
    }

    #[test]
    fn wide_alias_columns_agree_with_narrow_ones() {
        let weights: Vec<f64> = (0..1000).map(|i| ((i * 7919) % 13) as f64).collect();
        let (keep_narrow, narrow) = build_alias_columns::<u32>(&weights).unwrap();
        let (keep_wide, wide) = build_alias_columns::<u64>(&weights).unwrap();
        assert_eq!(keep_narrow, keep_wide);
        assert!(narrow.iter().map(|&a| u64::from(a)).eq(wide.iter().copied()));
    }

    #[test]
    fn weighted_indices_length_and_determinism() {
        let table = Arc::new(AliasTable::new(&[1.0, 1.0, 2.0]).unwrap());
        let a: Vec<u64> = WeightedIndices::new(table.clone(), 50, 7).collect();
        let b = WeightedIndices::new(table.clone(), 50, 7);
        assert_eq!(b.len(), 50);
        assert_eq!(a, b.collect::<Vec<_>>());
        assert_eq!(WeightedIndices::new(table, 0, 7).count(), 0);
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

    /// The selection path (small k) and the radix path (large k) must agree, and
    /// agree with a plain sort of the keys by (key, index).
    #[test]
    fn select_and_radix_paths_agree_with_a_comparison_sort() {
        let weights: Vec<f64> = (0..20_000)
            .map(|i| match i % 5 {
                0 => 0.0,
                1 => 1e-200,
                _ => (i % 97) as f64 + 0.5,
            })
            .collect();
        let max = validate(&weights).unwrap();
        let keys = exponential_keys(&weights, max, 8);
        let mut expected: Vec<(u64, u64)> = keys
            .iter()
            .enumerate()
            .filter(|&(_, &key)| key != ZERO_WEIGHT_KEY)
            .map(|(i, &key)| (key, i as u64))
            .collect();
        expected.sort_unstable();
        let expected: Vec<u64> = expected.into_iter().map(|(_, i)| i).collect();
        for take in [1, 100, 999, 1000, 1001, 15_000, 16_000] {
            assert_eq!(select_then_sort::<u32>(&keys, take), expected[..take]);
            assert_eq!(radix_sorted_prefix(&keys, take), expected[..take]);
        }
    }

    /// Keys that differ only below the packed word's precision tie there and
    /// must be re-sorted by their full bits.
    #[test]
    fn radix_path_resolves_keys_equal_in_the_packed_bits() {
        let base = 1.0f64.to_bits();
        let keys = vec![base + 5, base + 3, base + (1 << 40), base + 4, base + 3, base];
        assert_eq!(radix_sorted_prefix(&keys, 6), [5, 1, 4, 3, 0, 2]);
    }

    #[test]
    fn a_key_from_u_equal_to_one_sorts_first() {
        // -ln(1) must be +0.0, not -0.0 (whose bits are the largest of all).
        let zero = 0.0 - 1.0f64.ln();
        assert_eq!(zero.to_bits(), 0);
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
        let hits = (0..1000).filter(|_| table.sample(&mut rng) == heavy as u64).count();
        assert!(hits > 900, "heavy index drawn {hits} times in 1000");

        let picks = weighted_without_replacement(&weights, 3, 0).unwrap();
        assert_eq!(picks[0], heavy as u64);
        assert!(picks[1..].iter().all(|&i| i % 4096 == 0));

    }
}
