//! Numbers worded for operators: "14 min", "2.1 GB", "12.8K tok/s".
use dflash_shared::metrics::TimestampMs;

/// A duration in the largest sensible unit: "45 s", "14 min", "3 h", "3 h 20 min", "2 d 4 h".
pub fn duration_ms(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    match () {
        _ if s < 60 => format!("{s} s"),
        _ if s < 3600 => format!("{m} min"),
        _ if d == 0 && m == 0 => format!("{h} h"),
        _ if d == 0 => format!("{h} h {m} min"),
        _ if h == 0 => format!("{d} d"),
        _ => format!("{d} d {h} h"),
    }
}

/// "14 min ago" relative to `now_ms`.
pub fn ago(then_ms: TimestampMs, now_ms: TimestampMs) -> String {
    format!("{} ago", duration_ms(now_ms - then_ms))
}

/// Decimal units, as disk tools and the issue's examples use them: "2.1 GB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KB", "MB", "GB", "TB", "PB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1000.0 {
            break;
        }
        value /= 1000.0;
        unit = u;
    }
    format!("{value:.1} {unit}")
}

/// Throughput with one decimal in thousands: 12_840.0 -> "12.8K".
pub fn tokens_per_s(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.1}K", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_the_largest_sensible_unit() {
        assert_eq!(duration_ms(45_000), "45 s");
        assert_eq!(duration_ms(14 * 60_000 + 5_000), "14 min");
        assert_eq!(duration_ms(3 * 3_600_000), "3 h");
        assert_eq!(duration_ms(3 * 3_600_000 + 20 * 60_000), "3 h 20 min");
        assert_eq!(duration_ms(2 * 86_400_000 + 4 * 3_600_000), "2 d 4 h");
        assert_eq!(duration_ms(-5), "0 s");
    }

    #[test]
    fn bytes_and_throughput_read_like_the_issue() {
        assert_eq!(bytes(2_100_000_000), "2.1 GB");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_500), "1.5 KB");
        assert_eq!(tokens_per_s(12_840.0), "12.8K");
        assert_eq!(tokens_per_s(21_500.0), "21.5K");
        assert_eq!(tokens_per_s(640.4), "640");
    }
}
