//! The figures the report's tables print: medians over rounds of a value
//! and of a ratio between two paths, and a number as a table shows it.

use super::control::median;
use super::samples::Round;

/// Median over rounds of the per-round ratio `path`/`other`.
pub(super) fn ratio_median(
    results: &[Round],
    value: impl Fn(&Round, &str) -> Option<f64>,
    path: &str,
    other: &str,
) -> Option<f64> {
    let mut ratios: Vec<f64> = results
        .iter()
        .filter_map(|round| Some(value(round, path)? / value(round, other)?))
        .collect();
    (!ratios.is_empty()).then(|| median(&mut ratios))
}

pub(super) fn value_median(
    results: &[Round],
    value: &impl Fn(&Round, &str) -> Option<f64>,
    path: &str,
) -> f64 {
    let mut values: Vec<f64> = results
        .iter()
        .filter_map(|round| value(round, path))
        .collect();
    median(&mut values)
}

pub(super) fn number(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
