//! Chi-square helpers for the statistical tests. Every test uses a fixed seed, so
//! they are deterministic; the thresholds sit at p = 1e-6 so that a correct
//! algorithm passes for any seed one might pick, while a biased one fails by orders
//! of magnitude.

/// The upper-tail critical value of chi-square with `df` degrees of freedom at
/// p = 1e-6, by the Wilson–Hilferty cube-root approximation (slightly lenient).
pub fn chi_square_critical(df: usize) -> f64 {
    const Z: f64 = 4.753_424; // standard normal upper quantile at 1e-6
    let df = df as f64;
    let h = 2.0 / (9.0 * df);
    df * (1.0 - h + Z * h.sqrt()).powi(3)
}

/// Pearson's statistic for observed counts against expected counts.
pub fn chi_square(observed: &[u64], expected: &[f64]) -> f64 {
    assert_eq!(observed.len(), expected.len());
    observed
        .iter()
        .zip(expected)
        .map(|(&o, &e)| {
            assert!(e > 0.0, "expected count must be positive");
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

/// Asserts `observed` fits `probabilities` (cells with probability 0 must be empty).
pub fn assert_chi_square_fits(observed: &[u64], probabilities: &[f64]) {
    let total: u64 = observed.iter().sum();
    let mut kept_observed = Vec::new();
    let mut expected = Vec::new();
    for (&o, &p) in observed.iter().zip(probabilities) {
        if p == 0.0 {
            assert_eq!(o, 0, "a cell with probability 0 was hit");
        } else {
            kept_observed.push(o);
            expected.push(p * total as f64);
        }
    }
    let statistic = chi_square(&kept_observed, &expected);
    let critical = chi_square_critical(expected.len() - 1);
    assert!(
        statistic < critical,
        "chi-square {statistic:.1} >= {critical:.1} (df {}): {observed:?}",
        expected.len() - 1
    );
}

/// Asserts `observed` fits the uniform distribution over its cells.
pub fn assert_chi_square_uniform(observed: &[u64]) {
    let p = 1.0 / observed.len() as f64;
    assert_chi_square_fits(observed, &vec![p; observed.len()]);
}
