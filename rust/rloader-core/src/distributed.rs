//! `DistributedSampler`: one rank's shard of an epoch, exactly torch's partition.
//!
//! torch builds the epoch's index list (a permutation of `0..n` if shuffling, else
//! `0..n`), pads it by repeating it from the start until its length is a multiple
//! of the number of replicas `R` (or, with `drop_last`, truncates it to one), and
//! gives rank `r` the entries at positions `r, r + R, r + 2R, ...`.
//!
//! Padding repeats the list cyclically, so position `p` of the padded list holds
//! entry `p % n`; this module reads the shard straight from the unpadded list and
//! never builds the padded one.

use crate::compact::{self, CompactIndex};
use crate::random::fill_permutation;
use crate::rng::Rng;

/// How many indices each rank gets: torch's `num_samples`.
///
/// `ceil((n - R) / R)` if `drop_last` and `R` does not divide `n`, else
/// `ceil(n / R)`. torch computes `n - R` with Python integers, so for `n < R` the
/// first form is the ceiling of a number in `(-1, 0)`, which is 0.
///
/// # Panics
/// If `num_replicas == 0`.
pub fn distributed_num_samples(n: u64, num_replicas: u64, drop_last: bool) -> u64 {
    assert!(num_replicas > 0, "num_replicas must be positive");
    if drop_last && n % num_replicas != 0 {
        // n - R < 0 here means ceil of a value in (-1, 0): 0.
        n.saturating_sub(num_replicas).div_ceil(num_replicas)
    } else {
        n.div_ceil(num_replicas)
    }
}

/// torch's `(num_samples, total_size)`: [`distributed_num_samples`], and the length of the
/// padded (or trimmed) list, `num_samples * num_replicas` (a u128: it may pass `u64::MAX`).
///
/// # Panics
/// If `num_replicas == 0`.
pub fn distributed_sizes(n: u64, num_replicas: u64, drop_last: bool) -> (u64, u128) {
    let num_samples = distributed_num_samples(n, num_replicas, drop_last);
    (
        num_samples,
        u128::from(num_samples) * u128::from(num_replicas),
    )
}

/// Rank `rank`'s indices for `epoch`, in torch's order.
///
/// With `shuffle`, every rank builds the same permutation of `0..n` from
/// `Rng::from_seed(seed.wrapping_add(epoch))` (see [`crate::random::permutation`]).
/// `n == 0` yields an empty list (torch would divide by zero while padding).
///
/// # Panics
/// If `num_replicas == 0` or `rank >= num_replicas` (torch raises `ValueError`;
/// callers validate first).
pub fn distributed_indices(
    n: u64,
    num_replicas: u64,
    rank: u64,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    drop_last: bool,
) -> Vec<u64> {
    let num_samples = distributed_num_samples(n, num_replicas, drop_last);
    distributed_shard(n, num_replicas, rank, shuffle, seed, epoch, num_samples)
}

/// [`distributed_indices`] for a given `num_samples`, which torch reads from its
/// sampler's attribute (a subclass may set it): the indices at positions `rank,
/// rank + R, ...` of the padded list, `num_samples` of them. The caller checks,
/// as torch does, that they lie within its `total_size`.
///
/// # Panics
/// If `num_replicas == 0` or `rank >= num_replicas`.
pub fn distributed_shard(
    n: u64,
    num_replicas: u64,
    rank: u64,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    num_samples: u64,
) -> Vec<u64> {
    assert!(
        rank < num_replicas,
        "rank {rank} must be in [0, {num_replicas})"
    );
    if n == 0 || num_samples == 0 {
        return Vec::new();
    }
    let positions = (0..num_samples).map(|k| (rank + k * num_replicas) % n);
    if !shuffle {
        return positions.collect();
    }
    let mut rng = Rng::from_seed(seed.wrapping_add(epoch));
    if compact::fits_u32(n) {
        read_shard::<u32>(n, &mut rng, positions)
    } else {
        read_shard::<u64>(n, &mut rng, positions)
    }
}

/// Builds the epoch's permutation in `T` words and reads `positions` from it.
fn read_shard<T: CompactIndex>(
    n: u64,
    rng: &mut Rng,
    positions: impl Iterator<Item = u64>,
) -> Vec<u64> {
    let mut order = crate::buffer::filled(
        T::from_u64(0),
        usize::try_from(n).expect("dataset exceeds memory"),
    );
    fill_permutation(&mut order, rng);
    positions.map(|p| order[p as usize].to_u64()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::permutation;

    /// torch's algorithm, transcribed literally (padded list and all).
    fn torch_reference(
        n: u64,
        replicas: u64,
        rank: u64,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        drop_last: bool,
    ) -> Vec<u64> {
        let num_samples = if drop_last && n % replicas != 0 {
            let numerator = n as i64 - replicas as i64;
            // Python's math.ceil(numerator / replicas)
            (numerator as f64 / replicas as f64).ceil() as u64
        } else {
            n.div_ceil(replicas)
        };
        let total_size = (num_samples * replicas) as usize;
        let mut indices: Vec<u64> = if shuffle {
            permutation(n, &mut Rng::from_seed(seed.wrapping_add(epoch)))
        } else {
            (0..n).collect()
        };
        if !drop_last {
            let padding = total_size - indices.len();
            let base = indices.clone();
            indices.extend(base.iter().cycle().take(padding));
        } else {
            indices.truncate(total_size);
        }
        // Python's slice: empty when rank >= total_size.
        indices
            .get(rank as usize..total_size)
            .unwrap_or(&[])
            .iter()
            .step_by(replicas as usize)
            .copied()
            .collect()
    }

    #[test]
    fn num_samples_follows_torch() {
        assert_eq!(distributed_num_samples(10, 3, false), 4);
        assert_eq!(distributed_num_samples(10, 3, true), 3);
        assert_eq!(distributed_num_samples(9, 3, true), 3);
        assert_eq!(distributed_num_samples(9, 3, false), 3);
        assert_eq!(distributed_num_samples(3, 8, false), 1);
        assert_eq!(distributed_num_samples(3, 8, true), 0); // ceil(-5/8) == 0
        assert_eq!(distributed_num_samples(0, 4, false), 0);
        assert_eq!(distributed_num_samples(0, 4, true), 0);
        assert_eq!(distributed_num_samples(7, 1, true), 7);
        assert_eq!(distributed_num_samples(u64::MAX, 2, true), u64::MAX / 2);
    }

    /// torch's `num_samples` and `total_size` as Python computes them: the ceiling of a
    /// quotient that may be negative, in unbounded integers.
    fn torch_sizes(n: u64, replicas: u64, drop_last: bool) -> (i128, i128) {
        let (n, r) = (i128::from(n), i128::from(replicas));
        let ceil_div = |a: i128| -(-a).div_euclid(r); // -(-a // r)
        let num_samples = if drop_last && n % r != 0 {
            ceil_div(n - r)
        } else {
            ceil_div(n)
        };
        (num_samples, num_samples * r)
    }

    #[test]
    fn sizes_follow_torch() {
        for n in (0..60).chain([1000, 1001, 1 << 40, (1 << 63) - 1, u64::MAX]) {
            for replicas in (1..14).chain([1000, 1 << 33, u64::MAX - 1, u64::MAX]) {
                for drop_last in [false, true] {
                    let (num_samples, total_size) = distributed_sizes(n, replicas, drop_last);
                    assert_eq!(
                        (i128::from(num_samples), total_size as i128),
                        torch_sizes(n, replicas, drop_last),
                        "n={n} replicas={replicas} drop_last={drop_last}"
                    );
                }
            }
        }
        // Fewer samples than replicas: one each (padded), or none with drop_last.
        assert_eq!(distributed_sizes(3, 8, false), (1, 8));
        assert_eq!(distributed_sizes(3, 8, true), (0, 0));
        assert_eq!(distributed_sizes(u64::MAX, 2, false), (1 << 63, 1 << 64));
    }

    #[test]
    fn matches_the_literal_torch_algorithm() {
        for n in [1, 2, 3, 7, 8, 16, 17, 100] {
            for replicas in [1, 2, 3, 8] {
                for drop_last in [false, true] {
                    for shuffle in [false, true] {
                        for rank in [0, replicas / 2, replicas - 1] {
                            let args = (n, replicas, rank, shuffle, 5, 2, drop_last);
                            assert_eq!(
                                distributed_indices(n, replicas, rank, shuffle, 5, 2, drop_last),
                                torch_reference(n, replicas, rank, shuffle, 5, 2, drop_last),
                                "{args:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn padding_longer_than_the_dataset_repeats_it() {
        // n = 3, R = 8: the padded list is [a, b, c, a, b, c, a, b].
        let order = permutation(3, &mut Rng::from_seed(1));
        let shards: Vec<Vec<u64>> = (0..8)
            .map(|rank| distributed_indices(3, 8, rank, true, 1, 0, false))
            .collect();
        for (rank, shard) in shards.iter().enumerate() {
            assert_eq!(shard, &[order[rank % 3]]);
        }
        for rank in 0..8 {
            assert!(distributed_indices(3, 8, rank, true, 1, 0, true).is_empty());
        }
    }

    #[test]
    fn one_replica_gets_everything() {
        assert_eq!(
            distributed_indices(5, 1, 0, false, 0, 0, false),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(
            distributed_indices(5, 1, 0, true, 9, 3, true),
            permutation(5, &mut Rng::from_seed(12))
        );
    }

    #[test]
    fn last_rank_without_shuffle() {
        assert_eq!(distributed_indices(10, 4, 3, false, 0, 0, false), [3, 7, 1]);
        assert_eq!(distributed_indices(10, 4, 3, false, 0, 0, true), [3, 7]);
    }

    #[test]
    fn empty_dataset_gives_empty_shards() {
        for drop_last in [false, true] {
            assert!(distributed_indices(0, 4, 3, true, 0, 0, drop_last).is_empty());
        }
    }

    #[test]
    fn epoch_changes_the_order_and_seed_plus_epoch_wraps() {
        let a = distributed_indices(100, 2, 0, true, 0, 0, false);
        let b = distributed_indices(100, 2, 0, true, 0, 1, false);
        assert_ne!(a, b);
        let wrapped = distributed_indices(100, 2, 0, true, u64::MAX, 1, false);
        assert_eq!(wrapped, a);
    }

    #[test]
    #[should_panic(expected = "rank 4 must be in [0, 4)")]
    fn rank_out_of_range_panics() {
        distributed_indices(10, 4, 4, false, 0, 0, false);
    }
}
