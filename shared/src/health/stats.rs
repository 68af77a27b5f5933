//! Small robust statistics for the detectors.

/// Median of the values (mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    // Selection, not a sort: the throughput baseline takes the median of ~1800 samples per tick.
    let (n, mid) = (v.len(), v.len() / 2);
    let (lower, upper, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    let upper = *upper;
    if n % 2 == 1 {
        return Some(upper);
    }
    let below = lower.iter().copied().max_by(f64::total_cmp)?;
    Some((below + upper) / 2.0)
}

/// Population mean and standard deviation; `None` when empty.
pub(crate) fn mean_std(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    Some((mean, var.sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_std() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median([f64::NAN, 1.0]), Some(1.0));
        assert_eq!(median(Vec::<f64>::new()), None);
        assert_eq!(
            mean_std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]),
            Some((5.0, 2.0))
        );
    }
}
