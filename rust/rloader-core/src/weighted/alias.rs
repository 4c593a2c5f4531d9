//! Sampling with replacement: Vose's alias table.

use std::sync::Arc;

use super::{validate, WeightError};
use crate::compact::{self, CompactIndex};
use crate::rng::Rng;

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
    columns: Vec<Column>,
}

/// One column of the table. Keeping both fields together makes a draw one
/// cache miss, not two, when the table is larger than the cache.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Column {
    /// The share of the column that belongs to its own index, in `[0, 1]`.
    keep: f64,
    /// The index that owns the rest of the column.
    alias: u64,
}

impl AliasTable {
    pub fn new(weights: &[f64]) -> Result<AliasTable, WeightError> {
        let columns = if compact::fits_u32(weights.len() as u64) {
            build_columns::<u32>(weights)?
        } else {
            build_columns::<u64>(weights)?
        };
        Ok(AliasTable { columns })
    }

    /// The number of categories (weights), zero-weight ones included.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// Always false: a table is never built from an empty list.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// One index, with probability proportional to its weight (two generator draws).
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let index = rng.below(self.columns.len() as u64);
        let coin = rng.next_f64();
        let column = self.columns[index as usize];
        if coin < column.keep {
            index
        } else {
            column.alias
        }
    }
}

/// Builds the columns of an [`AliasTable`] (see there), with a worklist of
/// `T` words.
fn build_columns<T: CompactIndex>(weights: &[f64]) -> Result<Vec<Column>, WeightError> {
    let max = validate(weights)?.max;
    let n = weights.len();

    // Relative weights in (0, 1] sum to at most n: no overflow. Summed in chunks,
    // so that rounding error grows with the number of chunks, not with n.
    let relative = |w: f64| w / max;
    let total: f64 = weights
        .chunks(4096)
        .map(|chunk| chunk.iter().map(|&w| relative(w)).sum::<f64>())
        .sum();
    let to_mean_one = n as f64 / total;
    let mut columns: Vec<Column> = crate::buffer::with_capacity(n);
    columns.extend(weights.iter().map(|&w| Column {
        keep: relative(w) * to_mean_one,
        alias: 0,
    }));

    // Two stacks in one buffer: small indices grow up from the front, large ones
    // down from the back. Together they never hold more than n entries.
    let mut work = crate::buffer::filled(T::from_u64(0), n);
    let (mut small_end, mut large_start) = (0, n);
    for (i, column) in columns.iter().enumerate() {
        if column.keep < 1.0 {
            work[small_end] = T::from_u64(i as u64);
            small_end += 1;
        } else {
            large_start -= 1;
            work[large_start] = T::from_u64(i as u64);
        }
    }

    while small_end > 0 && large_start < n {
        small_end -= 1;
        let small = work[small_end].to_u64();
        let large = work[large_start].to_u64();
        columns[small as usize].alias = large;
        let small_keep = columns[small as usize].keep;
        let large_column = &mut columns[large as usize];
        // `keep - 1` is exact for keep in [1, 2] (Sterbenz), so subtract first.
        large_column.keep = (large_column.keep - 1.0) + small_keep;
        if large_column.keep < 1.0 {
            large_start += 1;
            work[small_end] = T::from_u64(large);
            small_end += 1;
        }
    }

    // Leftovers are 1 up to rounding; they keep their whole column. A leftover of
    // weight 0 is impossible in exact arithmetic, but guard the invariant anyway.
    let heaviest = weights.iter().position(|&w| w == max).unwrap_or(0) as u64;
    for slot in work[..small_end].iter().chain(&work[large_start..]) {
        let i = slot.to_u64() as usize;
        columns[i] = if weights[i] > 0.0 {
            Column {
                keep: 1.0,
                alias: i as u64,
            }
        } else {
            Column {
                keep: 0.0,
                alias: heaviest,
            }
        };
    }
    Ok(columns)
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

impl WeightedIndices {
    /// Appends up to `max` draws to `out`: exactly the draws that many `next()` calls give,
    /// made in two passes — every random number first, then every table look-up — so that
    /// look-ups that miss the cache (large tables) overlap instead of waiting on each other.
    pub fn next_chunk(&mut self, out: &mut Vec<u64>, max: usize) {
        let k = usize::try_from(self.remaining).map_or(max, |r| r.min(max));
        let n = self.table.columns.len() as u64;
        let start = out.len();
        let mut coins = Vec::with_capacity(k);
        for _ in 0..k {
            out.push(self.rng.below(n));
            coins.push(self.rng.next_f64());
        }
        let columns = &self.table.columns;
        for (slot, coin) in out[start..].iter_mut().zip(coins) {
            let column = columns[*slot as usize];
            if coin >= column.keep {
                *slot = column.alias;
            }
        }
        self.remaining -= k as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_chunk_gives_the_same_draws_as_next() {
        let weights: Vec<f64> = (0..1000).map(|i| ((i * 7919) % 13) as f64).collect();
        let table = Arc::new(AliasTable::new(&weights).unwrap());
        let one_by_one: Vec<u64> = WeightedIndices::new(table.clone(), 5000, 9).collect();
        let mut chunked = WeightedIndices::new(table, 5000, 9);
        let mut out = Vec::new();
        for size in [1, 7, 4096, 4096] {
            chunked.next_chunk(&mut out, size);
        }
        assert_eq!(out, one_by_one);
        assert_eq!(chunked.next(), None);
    }
    use crate::test_stats::assert_chi_square_fits;

    fn proportions(weights: &[f64]) -> Vec<f64> {
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
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
    fn u32_and_u64_worklists_build_the_same_table() {
        let weights: Vec<f64> = (0..1000).map(|i| ((i * 7919) % 13) as f64).collect();
        assert_eq!(
            build_columns::<u32>(&weights).unwrap(),
            build_columns::<u64>(&weights).unwrap()
        );
    }

    /// The table's exact probabilities: column i gives `keep / n` to i and the
    /// rest to its alias. They must equal the normalised weights.
    #[test]
    fn table_probabilities_equal_the_weights() {
        let weights = [3.0, 0.0, 1.0, 1e-9, 7.0, 2.5, 0.0, 1.0];
        let columns = build_columns::<u32>(&weights).unwrap();
        let n = columns.len() as f64;
        let mut probability = [0.0; 8];
        for (i, column) in columns.iter().enumerate() {
            probability[i] += column.keep / n;
            probability[column.alias as usize] += (1.0 - column.keep) / n;
        }
        for (p, expected) in probability.iter().zip(proportions(&weights)) {
            assert!((p - expected).abs() < 1e-12, "{probability:?}");
        }
        assert_eq!(probability[1], 0.0);
        assert_eq!(probability[6], 0.0);
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
}
