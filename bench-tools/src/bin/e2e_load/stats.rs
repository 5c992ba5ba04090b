//! Medians and latency percentiles.

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
/// NaNs are ignored.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// The `q`-quantile (0..=1) of sorted samples by nearest rank; `None` when empty.
pub(crate) fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50 and p99 in milliseconds of latencies given in microseconds (sorted here).
pub(crate) fn p50_p99_ms(latencies_us: &mut [u32]) -> (Option<f64>, Option<f64>) {
    latencies_us.sort_unstable();
    let ms = |q| percentile(latencies_us, q).map(|us| f64::from(us) / 1000.0);
    (ms(0.50), ms(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn percentiles() {
        let samples: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&samples, 0.5), Some(50));
        assert_eq!(percentile(&samples, 0.99), Some(99));
        assert_eq!(percentile(&samples, 1.0), Some(100));
        assert_eq!(percentile(&samples, 0.0), Some(1));
        assert_eq!(percentile::<u32>(&[], 0.5), None);
        let mut latencies = vec![3000, 1000, 2000];
        assert_eq!(p50_p99_ms(&mut latencies), (Some(2.0), Some(3.0)));
    }
}
