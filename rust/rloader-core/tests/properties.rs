//! Property tests: invariants that must hold for every input, not just the
//! examples in the unit tests.

use std::sync::Arc;

use proptest::prelude::*;
use rloader_core::random::SCATTER_THRESHOLD;
use rloader_core::{
    distributed_indices, distributed_num_samples, permutation, shuffle,
    weighted_without_replacement, AliasTable, Batches, RandomIndices, Rng, WeightedIndices,
};

fn is_permutation_of(values: &[u64], n: u64) -> bool {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.into_iter().eq(0..n)
}

/// Weights with some zeros and a spread of magnitudes, at least one positive.
fn weights() -> impl Strategy<Value = Vec<f64>> {
    let weight = prop_oneof![
        2 => Just(0.0),
        5 => 0.001f64..1000.0,
        1 => Just(1e-300),
        1 => Just(1e300),
    ];
    prop::collection::vec(weight, 1..300)
        .prop_filter("needs a positive weight", |w| w.iter().any(|&x| x > 0.0))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn permutation_is_a_permutation(n in 0u64..3000, seed: u64) {
        prop_assert!(is_permutation_of(&permutation(n, &mut Rng::from_seed(seed)), n));
    }

    #[test]
    fn scatter_permutation_is_a_permutation(extra in 0u64..5000, seed: u64) {
        let n = SCATTER_THRESHOLD + extra;
        prop_assert!(is_permutation_of(&permutation(n, &mut Rng::from_seed(seed)), n));
    }

    #[test]
    fn shuffle_keeps_the_multiset(mut items in prop::collection::vec(0u8..5, 0..200), seed: u64) {
        let mut before = items.clone();
        shuffle(&mut items, &mut Rng::from_seed(seed));
        before.sort_unstable();
        items.sort_unstable();
        prop_assert_eq!(before, items);
    }

    #[test]
    fn below_stays_below(n in 1u64.., seed: u64) {
        let mut rng = Rng::from_seed(seed);
        for _ in 0..16 {
            prop_assert!(rng.below(n) < n);
        }
    }

    #[test]
    fn random_indices_rounds_are_permutations(
        n in 1u64..200,
        num_samples in 0u64..1000,
        seed: u64,
    ) {
        let stream: Vec<u64> = RandomIndices::new(n, num_samples, false, seed).collect();
        prop_assert_eq!(stream.len() as u64, num_samples);
        let rounds = stream.chunks(n as usize);
        for round in rounds {
            if round.len() as u64 == n {
                prop_assert!(is_permutation_of(round, n));
            } else {
                let mut distinct = round.to_vec();
                distinct.sort_unstable();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), round.len());
            }
        }
    }

    #[test]
    fn random_indices_with_replacement_length_and_range(
        n in 1u64..1_000_000,
        num_samples in 0u64..1000,
        seed: u64,
    ) {
        let it = RandomIndices::new(n, num_samples, true, seed);
        prop_assert_eq!(it.len() as u64, num_samples);
        let stream: Vec<u64> = it.collect();
        prop_assert_eq!(stream.len() as u64, num_samples);
        prop_assert!(stream.iter().all(|&i| i < n));
    }

    #[test]
    fn distributed_shards_partition_the_dataset(
        replicas in 1u64..9,
        per_replica in 0u64..40,
        shuffle in any::<bool>(),
        drop_last in any::<bool>(),
        seed: u64,
        epoch in 0u64..4,
    ) {
        let n = replicas * per_replica;
        let mut all = Vec::new();
        for rank in 0..replicas {
            let shard = distributed_indices(n, replicas, rank, shuffle, seed, epoch, drop_last);
            prop_assert_eq!(shard.len() as u64, per_replica);
            all.extend(shard);
        }
        prop_assert!(is_permutation_of(&all, n));
    }

    /// Whatever n, every rank reads the same epoch order: rank r's k-th index is
    /// entry (r + k * R) mod n of one permutation, so all shards interleave into
    /// that permutation, repeated as padding.
    #[test]
    fn distributed_ranks_agree_on_the_permutation(
        n in 1u64..300,
        replicas in 1u64..12,
        drop_last in any::<bool>(),
        seed: u64,
    ) {
        let num_samples = distributed_num_samples(n, replicas, drop_last);
        let shards: Vec<Vec<u64>> = (0..replicas)
            .map(|rank| distributed_indices(n, replicas, rank, true, seed, 0, drop_last))
            .collect();
        let order = permutation(n, &mut Rng::from_seed(seed));
        for (rank, shard) in shards.iter().enumerate() {
            prop_assert_eq!(shard.len() as u64, num_samples);
            for (k, &index) in shard.iter().enumerate() {
                let position = (rank as u64 + k as u64 * replicas) % n;
                prop_assert_eq!(index, order[position as usize]);
            }
        }
    }

    #[test]
    fn batches_concatenate_to_the_input(
        n in 0u64..500,
        batch_size in 1usize..70,
        drop_last in any::<bool>(),
    ) {
        let batches: Vec<Vec<u64>> = Batches::new(0..n, batch_size, drop_last).collect();
        let full = n as usize / batch_size;
        let short = n as usize % batch_size;
        let expected_count = if drop_last || short == 0 { full } else { full + 1 };
        prop_assert_eq!(batches.len(), expected_count);
        for (i, batch) in batches.iter().enumerate() {
            let expected_len = if i < full { batch_size } else { short };
            prop_assert_eq!(batch.len(), expected_len);
        }
        let flat: Vec<u64> = batches.concat();
        let kept = if drop_last { (full * batch_size) as u64 } else { n };
        prop_assert!(flat.into_iter().eq(0..kept));
    }

    #[test]
    fn batches_next_into_matches_next(
        n in 0u64..300,
        batch_size in 1usize..50,
        drop_last in any::<bool>(),
        seed: u64,
    ) {
        let expected: Vec<Vec<u64>> =
            Batches::new(RandomIndices::new(n, n, false, seed), batch_size, drop_last).collect();
        let mut batches = Batches::new(RandomIndices::new(n, n, false, seed), batch_size, drop_last);
        let mut buffer = Vec::new();
        let mut got = Vec::new();
        while batches.next_into(&mut buffer) {
            got.push(buffer.clone());
        }
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn without_replacement_is_distinct_with_zero_weights_last(
        weights in weights(),
        fraction in 0.0f64..=1.0,
        seed: u64,
    ) {
        let k = (weights.len() as f64 * fraction) as u64;
        let picks = weighted_without_replacement(&weights, k, seed).unwrap();
        prop_assert_eq!(picks.len() as u64, k);
        let mut distinct = picks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        prop_assert_eq!(distinct.len(), picks.len());
        let is_zero: Vec<bool> = picks.iter().map(|&i| weights[i as usize] == 0.0).collect();
        let first_zero = is_zero.iter().position(|&z| z).unwrap_or(is_zero.len());
        prop_assert!(is_zero[first_zero..].iter().all(|&z| z), "a positive weight after a zero one");
        let zeros: Vec<u64> = picks[first_zero..].to_vec();
        prop_assert!(zeros.windows(2).all(|w| w[0] < w[1]), "zero weights out of index order");
        let positive = weights.iter().filter(|&&w| w > 0.0).count();
        prop_assert_eq!(first_zero, positive.min(k as usize));
    }

    #[test]
    fn without_replacement_prefixes_agree(weights in weights(), seed: u64) {
        let n = weights.len() as u64;
        let all = weighted_without_replacement(&weights, n, seed).unwrap();
        for k in [0, 1, n / 2, n] {
            let prefix = weighted_without_replacement(&weights, k, seed).unwrap();
            prop_assert_eq!(&prefix[..], &all[..k as usize]);
        }
    }

    /// Above 4096 positive weights, taking most of them goes through the radix
    /// sort; it must give the same order as taking a few (selection).
    #[test]
    fn without_replacement_radix_and_selection_agree(
        n in 5000usize..7000,
        zero_every in 10usize..50,
        spread in 0.0f64..200.0,
        seed: u64,
    ) {
        let weights: Vec<f64> = (0..n)
            .map(|i| if i % zero_every == 0 { 0.0 } else { 10f64.powf(spread * ((i * 37) % 101) as f64 / 101.0) })
            .collect();
        let all = weighted_without_replacement(&weights, n as u64, seed).unwrap();
        let few = weighted_without_replacement(&weights, 50, seed).unwrap();
        prop_assert_eq!(&all[..50], &few[..]);
    }

    #[test]
    fn alias_table_never_returns_a_zero_weight(weights in weights(), seed: u64) {
        let table = Arc::new(AliasTable::new(&weights).unwrap());
        prop_assert_eq!(table.len(), weights.len());
        for index in WeightedIndices::new(table, 500, seed) {
            prop_assert!(weights[index as usize] > 0.0, "index {} has weight 0", index);
        }
    }
}
