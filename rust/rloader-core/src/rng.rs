//! rloader's one random number generator.
//!
//! # Stable contract
//!
//! The index order every sampler produces for a given seed is part of rloader's
//! stable contract: a user who pins a seed gets the same epoch order on every
//! rloader version, platform and thread count. That is why this module does not
//! defer to `rand`'s distributions (which may change algorithms between releases):
//!
//! * the bit generator is xoshiro256++ (`rand_xoshiro::Xoshiro256PlusPlus`), a fixed,
//!   published algorithm, seeded with `SeedableRng::seed_from_u64`, which expands the
//!   `u64` with SplitMix64;
//! * bounded integers ([`Rng::below`]) use Lemire's nearly-divisionless method,
//!   written out here;
//! * floats ([`Rng::next_f64`]) take the top 53 bits of one output.
//!
//! The `golden` tests pin the first outputs of every sampler for seeds 0 and 42; a
//! change that moves any of them is a breaking change and needs a major version.

use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A seeded xoshiro256++ generator with the few draws rloader's samplers need.
#[derive(Clone, Debug)]
pub struct Rng {
    state: Xoshiro256PlusPlus,
}

impl Rng {
    /// The generator for `seed` (SplitMix64 expansion of the 64-bit seed to the 256-bit state).
    pub fn from_seed(seed: u64) -> Rng {
        Rng {
            state: Xoshiro256PlusPlus::seed_from_u64(seed),
        }
    }

    /// The next 64 uniformly random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state.next_u64()
    }

    /// A uniformly random integer in `[0, n)`, without bias.
    ///
    /// Lemire's nearly-divisionless method ("Fast Random Integer Generation in an
    /// Interval", 2019): the 128-bit product `x * n` of a random `x` maps `[0, 2^64)`
    /// onto `[0, n)` through its high half. Each output receives `floor(2^64 / n)` or
    /// one more preimage; the low half `l` tells which `x` are the surplus ones, and
    /// exactly those with `l < 2^64 mod n` are rejected and redrawn. The modulo is only
    /// computed when `l < n`, which is rare for small `n`.
    ///
    /// # Panics
    /// If `n == 0` (debug builds; release builds return 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0, "Rng::below(0)");
        let mut product = u128::from(self.next_u64()) * u128::from(n);
        let mut low = product as u64;
        if low < n {
            let threshold = n.wrapping_neg() % n;
            while low < threshold {
                product = u128::from(self.next_u64()) * u128::from(n);
                low = product as u64;
            }
        }
        (product >> 64) as u64
    }

    /// A uniformly random `f64` in `[0, 1)`: the top 53 bits of one output, times 2^-53.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
        (self.next_u64() >> 11) as f64 * SCALE
    }

    /// A uniformly random `f64` in `(0, 1]`, for logarithms: like [`Rng::next_f64`]
    /// but counting from 1, so it is never 0.
    #[inline]
    pub fn next_f64_nonzero(&mut self) -> f64 {
        const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
        ((self.next_u64() >> 11) + 1) as f64 * SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_stats::{assert_chi_square_uniform, chi_square_critical};

    #[test]
    fn same_seed_same_stream_and_different_seeds_differ() {
        let mut a = Rng::from_seed(7);
        let mut b = Rng::from_seed(7);
        let mut c = Rng::from_seed(8);
        let xs: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..16).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn below_stays_in_range_at_the_extremes() {
        let mut rng = Rng::from_seed(1);
        for _ in 0..1000 {
            assert_eq!(rng.below(1), 0);
            assert!(rng.below(2) < 2);
            assert!(rng.below(u64::MAX) < u64::MAX);
            assert!(rng.below((1 << 63) + 1) < (1 << 63) + 1);
        }
    }

    #[test]
    fn below_is_uniform_for_a_small_bound() {
        let mut rng = Rng::from_seed(2);
        let mut counts = [0u64; 7];
        for _ in 0..70_000 {
            counts[rng.below(7) as usize] += 1;
        }
        assert_chi_square_uniform(&counts);
    }

    /// For n = 3 * 2^62, multiply-and-shift without rejection maps two preimages onto
    /// every multiple of 3 and one onto the others, so `below(n) % 3` would come out
    /// (1/2, 1/4, 1/4). The rejection step must make it (1/3, 1/3, 1/3).
    #[test]
    fn below_is_unbiased_for_a_bound_near_2_pow_64() {
        let n = 3u64 << 62;
        let mut rng = Rng::from_seed(3);
        let mut counts = [0u64; 3];
        for _ in 0..30_000 {
            counts[(rng.below(n) % 3) as usize] += 1;
        }
        assert_chi_square_uniform(&counts);
    }

    #[test]
    fn next_f64_is_in_unit_interval_and_uniform() {
        let mut rng = Rng::from_seed(4);
        let mut counts = [0u64; 10];
        for _ in 0..100_000 {
            let x = rng.next_f64();
            assert!((0.0..1.0).contains(&x));
            counts[(x * 10.0) as usize] += 1;
        }
        assert_chi_square_uniform(&counts);
        let y = Rng::from_seed(4).next_f64_nonzero();
        assert!(y > 0.0 && y <= 1.0);
    }

    #[test]
    fn chi_square_critical_values_match_tables() {
        // Published upper-tail quantiles at p = 1e-6. Wilson–Hilferty errs on the
        // lenient side this far out, by under 12%: no flakes, and still tight enough.
        for (df, table) in [(2, 27.63), (10, 44.86), (100, 172.7)] {
            let approx = chi_square_critical(df);
            assert!(approx >= table && approx < table * 1.12, "df {df}: {approx}");
        }
    }
}
