//! The fuzz harnesses' random draws (`rloader-queue` and `rloader-workers`, `tests/fuzz.rs`,
//! include this file): rand_xoshiro's SplitMix64 seeded with the run's seed, so that a seed
//! replays a run, and rand's uniform ranges.

use rand::{Rng as _, RngExt, SeedableRng};
use rand_xoshiro::SplitMix64;

pub struct Rng(SplitMix64);

#[allow(dead_code)] // (each harness draws what it needs)
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 for n == 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.0.random_range(0..n)
        }
    }

    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        self.0.fill_bytes(&mut out);
        out
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}
