//! One benchmark per sampler, at the sizes rloader is built for. Small sample
//! counts keep `cargo bench -p rloader-core` to a couple of minutes on two cores.
//!
//! Setup also builds an alias table and draws without replacement over 100M
//! categories once, printing the times: torch caps categories at 2^24, and this
//! is the check that rloader does not (too heavy for the unit tests).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use rloader_core::{
    distributed_indices, permutation, weighted_without_replacement, AliasTable, Batches,
    RandomIndices, Rng, WeightedIndices,
};

const TEN_MILLION: u64 = 10_000_000;
const ONE_MILLION: usize = 1_000_000;

/// Deterministic weights spread over three orders of magnitude, some zero.
fn weights(n: usize) -> Vec<f64> {
    let mut rng = Rng::from_seed(99);
    (0..n)
        .map(|i| {
            if i % 100 == 0 {
                0.0
            } else {
                1000f64.powf(rng.next_f64())
            }
        })
        .collect()
}

fn random(c: &mut Criterion) {
    c.bench_function("permutation 10M", |b| {
        b.iter(|| permutation(black_box(TEN_MILLION), &mut Rng::from_seed(0)))
    });
    c.bench_function("RandomIndices 10M collected", |b| {
        b.iter(|| {
            RandomIndices::new(black_box(TEN_MILLION), TEN_MILLION, false, 0).collect::<Vec<_>>()
        })
    });
    c.bench_function("Batches(RandomIndices 10M, 1024)", |b| {
        b.iter(|| {
            let mut batches = Batches::new(
                RandomIndices::new(TEN_MILLION, TEN_MILLION, false, 0),
                1024,
                false,
            );
            let mut batch = Vec::new();
            let mut checksum = 0u64;
            while batches.next_into(&mut batch) {
                checksum = checksum.wrapping_add(batch[0]);
            }
            checksum
        })
    });
}

fn weighted(c: &mut Criterion) {
    let weights = weights(ONE_MILLION);
    c.bench_function("AliasTable build 1M + 1M draws", |b| {
        b.iter(|| {
            let table = Arc::new(AliasTable::new(black_box(&weights)).unwrap());
            WeightedIndices::new(table, ONE_MILLION as u64, 0).fold(0u64, u64::wrapping_add)
        })
    });
    c.bench_function("weighted_without_replacement 1M of 1M", |b| {
        b.iter(|| weighted_without_replacement(black_box(&weights), ONE_MILLION as u64, 0).unwrap())
    });
    c.bench_function("weighted_without_replacement 1k of 1M", |b| {
        b.iter(|| weighted_without_replacement(black_box(&weights), 1000, 0).unwrap())
    });
}

fn distributed(c: &mut Criterion) {
    c.bench_function("distributed_indices 10M R=8 rank=3 shuffled", |b| {
        b.iter(|| distributed_indices(black_box(TEN_MILLION), 8, 3, true, 0, 1, false))
    });
}

/// 100M categories, built once (not a criterion measurement).
fn hundred_million_categories(_: &mut Criterion) {
    let n = 100_000_000;
    let weights = weights(n);
    let start = Instant::now();
    let table = AliasTable::new(&weights).expect("100M categories");
    println!("AliasTable::new, 100M categories: {:.2?}", start.elapsed());
    let last = (0..1000)
        .map(|s| table.sample(&mut Rng::from_seed(s)))
        .max();
    assert!(last.unwrap() < n as u64);
    drop(table);
    let start = Instant::now();
    let picks = weighted_without_replacement(&weights, 1000, 0).expect("100M categories");
    println!(
        "weighted_without_replacement, 1k of 100M: {:.2?}",
        start.elapsed()
    );
    assert_eq!(picks.len(), 1000);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(6));
    targets = hundred_million_categories, random, weighted, distributed
}
criterion_main!(benches);
