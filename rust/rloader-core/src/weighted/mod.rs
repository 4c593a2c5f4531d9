//! `WeightedRandomSampler`: sampling indices in proportion to `f64` weights.
//!
//! With replacement, draws come from an [`AliasTable`] (O(n) to build, O(1) per
//! draw). Without replacement, [`weighted_without_replacement`] sorts exponential
//! keys. Neither caps the number of categories (torch stops at 2^24).
//!
//! Weights are validated as torch validates them, with torch's messages
//! ([`WeightError`]), and then divided by their maximum, so that no sum or key
//! overflows however large or small the weights are.

mod alias;
mod without_replacement;

use std::fmt;

pub use alias::{AliasTable, WeightedIndices};
pub use without_replacement::weighted_without_replacement;

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

/// What the samplers need to know about a valid list of weights.
#[derive(Clone, Copy, Debug)]
struct WeightSummary {
    /// The largest weight (> 0).
    max: f64,
    /// The smallest positive weight.
    min_positive: f64,
    /// How many weights are positive (>= 1).
    positive: usize,
}

/// Checks `weights` in torch's order (empty, then invalid values, then all zero).
fn validate(weights: &[f64]) -> Result<WeightSummary, WeightError> {
    if weights.is_empty() {
        return Err(WeightError::Empty);
    }
    let parts = split_evenly(weights, threads_for(weights.len()));
    let scan = in_parallel(parts, Scan::of)
        .into_iter()
        .reduce(Scan::merge)
        .expect("one part at least");
    let summary = WeightSummary {
        max: scan
            .max
            .into_iter()
            .fold(0.0, |a, b| if b > a { b } else { a }),
        min_positive: scan
            .min_positive
            .into_iter()
            .fold(f64::INFINITY, |a, b| if b < a { b } else { a }),
        positive: scan.positive.iter().map(|&count| count as usize).sum(),
    };
    if scan.non_finite.iter().any(|x| x.is_nan()) || scan.lowest.iter().any(|&w| w < 0.0) {
        Err(WeightError::NotFiniteOrNegative)
    } else if summary.positive == 0 {
        Err(WeightError::ZeroSum)
    } else {
        Ok(summary)
    }
}

/// Lanes of [`Scan`]: enough independent chains to keep the adds and
/// comparisons busy.
const LANES: usize = 8;

/// What [`validate`] gathers in one pass, lane by lane.
///
/// Branch-free f64 arithmetic, so that it vectorises: `w * 0.0` is NaN exactly
/// for NaN and infinite weights (and sums stay NaN), the lowest weight tells
/// negatives. Positive weights are counted in f64 lanes too, exactly (below
/// 2^53 each); the summary only counts when all weights are valid.
struct Scan {
    non_finite: [f64; LANES],
    lowest: [f64; LANES],
    max: [f64; LANES],
    min_positive: [f64; LANES],
    positive: [f64; LANES],
}

impl Scan {
    /// The scan of `weights`, in AVX2 where the CPU has it.
    fn of(weights: &[f64]) -> Scan {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { Scan::of_avx2(weights) };
        }
        Scan::of_portable(weights)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn of_avx2(weights: &[f64]) -> Scan {
        Scan::of_portable(weights)
    }

    #[inline(always)]
    fn of_portable(weights: &[f64]) -> Scan {
        let mut scan = Scan {
            non_finite: [0.0; LANES],
            lowest: [0.0; LANES],
            max: [0.0; LANES],
            min_positive: [f64::INFINITY; LANES],
            positive: [0.0; LANES],
        };
        let chunks = weights.chunks_exact(LANES);
        // Zeros, the rest's padding, change nothing.
        let mut rest = [0.0; LANES];
        rest[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        for chunk in chunks {
            scan.visit(chunk.try_into().expect("chunks_exact"));
        }
        scan.visit(&rest);
        scan
    }

    /// The scan of two parts of the weights, from theirs.
    fn merge(self, other: Scan) -> Scan {
        let lanes = |a: [f64; LANES], b: [f64; LANES], f: fn(f64, f64) -> f64| {
            std::array::from_fn(|lane| f(a[lane], b[lane]))
        };
        Scan {
            non_finite: lanes(self.non_finite, other.non_finite, |a, b| a + b),
            lowest: lanes(self.lowest, other.lowest, |a, b| if b < a { b } else { a }),
            max: lanes(self.max, other.max, |a, b| if b > a { b } else { a }),
            min_positive: lanes(self.min_positive, other.min_positive, |a, b| {
                if b < a {
                    b
                } else {
                    a
                }
            }),
            positive: lanes(self.positive, other.positive, |a, b| a + b),
        }
    }

    #[inline(always)]
    fn visit(&mut self, chunk: &[f64; LANES]) {
        for (lane, &w) in chunk.iter().enumerate() {
            self.non_finite[lane] += w * 0.0;
            self.lowest[lane] = if w < self.lowest[lane] {
                w
            } else {
                self.lowest[lane]
            };
            self.max[lane] = if w > self.max[lane] {
                w
            } else {
                self.max[lane]
            };
            let candidate = if w > 0.0 { w } else { f64::INFINITY };
            self.min_positive[lane] = if candidate < self.min_positive[lane] {
                candidate
            } else {
                self.min_positive[lane]
            };
            self.positive[lane] += if w > 0.0 { 1.0 } else { 0.0 };
        }
    }
}

/// How many threads the samplers use for `n` weights: one below 2^16 (a
/// thread's start costs more than it saves), else one per core, up to 8.
fn threads_for(n: usize) -> usize {
    if n < 1 << 16 {
        return 1;
    }
    // Read once: on Linux it parses cgroup files, ~30 µs a call.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES
        .get_or_init(|| std::thread::available_parallelism().map_or(1, |cores| cores.get().min(8)))
}

/// `items` split into `parts` consecutive slices of about equal length.
fn split_evenly<T>(items: &[T], parts: usize) -> Vec<&[T]> {
    (0..parts)
        .map(|p| &items[items.len() * p / parts..items.len() * (p + 1) / parts])
        .collect()
}

/// Runs `work` on each item, the first on this thread and the others on scoped
/// threads of their own, and returns the results in the items' order. The
/// threads are joined before it returns; a panic in one is resumed here. Items
/// whose thread the system refuses to start are worked on this thread.
fn in_parallel<T: Send, R: Send>(items: Vec<T>, work: impl Fn(T) -> R + Sync) -> Vec<R> {
    use std::sync::Mutex;
    // Each item sits in a slot that its thread, or failing that this one, empties.
    let slots: Vec<Mutex<Option<T>>> = items
        .into_iter()
        .map(|item| Mutex::new(Some(item)))
        .collect();
    let take = |slot: &Mutex<Option<T>>| slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    let work = &work;
    std::thread::scope(|scope| {
        let others: Vec<_> = slots
            .iter()
            .skip(1)
            .map(|slot| {
                std::thread::Builder::new()
                    .spawn_scoped(scope, move || take(slot).map(work))
                    .ok()
            })
            .collect();
        let mut results: Vec<R> = slots.first().and_then(take).map(work).into_iter().collect();
        for (handle, slot) in others.into_iter().zip(slots.iter().skip(1)) {
            let result = match handle.map(|handle| handle.join()) {
                Some(Ok(result)) => result,
                Some(Err(panic)) => std::panic::resume_unwind(panic),
                None => None,
            };
            // Not started: its item is still in its slot.
            results.extend(result.or_else(|| take(slot).map(work)));
        }
        results
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let boxed: Box<dyn std::error::Error> = Box::new(WeightError::Empty);
        assert!(boxed.source().is_none());
    }

    #[test]
    fn invalid_weights_are_rejected_by_both_samplers() {
        let cases: [(&[f64], WeightError); 7] = [
            (&[], WeightError::Empty),
            (&[1.0, f64::NAN], WeightError::NotFiniteOrNegative),
            (&[1.0, f64::INFINITY], WeightError::NotFiniteOrNegative),
            (&[f64::NEG_INFINITY], WeightError::NotFiniteOrNegative),
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

    /// Invalid values are caught in every lane and in the remainder; -0.0 is a
    /// valid zero weight.
    #[test]
    fn validate_catches_invalid_values_anywhere() {
        // 200_003 weights are scanned in parts on more than one thread.
        for len in [2, 3, 4, 5, 9, 1000, 200_003] {
            for at in [0, len / 2, len - 1] {
                for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-300, -2.0] {
                    let mut weights = vec![1.0; len];
                    weights[at] = bad;
                    let error = validate(&weights).err();
                    assert_eq!(
                        error,
                        Some(WeightError::NotFiniteOrNegative),
                        "{len} {at} {bad}"
                    );
                }
                let mut weights = vec![0.5; len];
                weights[at] = -0.0;
                let summary = validate(&weights).unwrap();
                assert_eq!((summary.positive, summary.max), (len - 1, 0.5));
            }
        }
        let summary = validate(&[0.0, 1e-310, 3.0, 2.0, 0.0]).unwrap();
        assert_eq!(
            (summary.min_positive, summary.max, summary.positive),
            (1e-310, 3.0, 3)
        );
        // The extremes in either part of a long list.
        for (low, high) in [(10, 150_000), (150_000, 10)] {
            let mut weights = vec![1.0; 200_003];
            weights[low] = 1e-300;
            weights[high] = 7.0;
            weights[5] = 0.0;
            let summary = validate(&weights).unwrap();
            assert_eq!(
                (summary.min_positive, summary.max, summary.positive),
                (1e-300, 7.0, 200_002)
            );
        }
    }

    #[test]
    fn in_parallel_returns_results_in_order() {
        let items: Vec<u64> = (0..6).collect();
        assert_eq!(in_parallel(items, |x| x * 10), [0, 10, 20, 30, 40, 50]);
        assert_eq!(in_parallel(Vec::<u64>::new(), |x| x), Vec::<u64>::new());
    }

    #[test]
    fn split_evenly_covers_the_items_in_order() {
        let items: Vec<u32> = (0..10).collect();
        let parts = split_evenly(&items, 3);
        assert_eq!(parts, [&items[..3], &items[3..6], &items[6..]]);
        assert_eq!(split_evenly(&items, 1), [&items[..]]);
    }

    #[test]
    fn summary_of_valid_weights() {
        let summary = validate(&[0.0, 2.0, 0.5, 0.0, 3.0]).unwrap();
        assert_eq!(summary.max, 3.0);
        assert_eq!(summary.min_positive, 0.5);
        assert_eq!(summary.positive, 3);
    }
}
