//! Small statistics over repeated measurements.

/// Median of the values (mean of the middle two for an even count); `None` when empty or when
/// a value is not finite.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// `|a - b| / |b|` (`b` is the reference); `None` when `b` is zero or either is not finite.
pub fn rel_diff(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b != 0.0).then(|| (a - b).abs() / b.abs())
}

/// `a / b` when both are finite and `b > 0`.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() && b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_degenerate_inputs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn rel_diff_and_ratio_guard_against_zero_and_nan() {
        assert_eq!(
            rel_diff(1.1, 1.0).map(|x| (x * 1e6).round()),
            Some(100_000.0)
        );
        assert_eq!(rel_diff(1.0, 0.0), None);
        assert_eq!(ratio(Some(2.0), Some(4.0)), Some(0.5));
        assert_eq!(ratio(Some(2.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }
}
