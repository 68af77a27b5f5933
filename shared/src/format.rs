//! Human formatting both binaries use, so the console, `status` reports and the daemon's
//! consequence sentences print the same numbers the same way.
use chrono::{FixedOffset, TimeZone};

use crate::metrics::TimestampMs;

/// A count with its thousands grouped: "1,234,567".
pub fn format_thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Tokens per second, compact: `850`, `4.3K`, `21.5K`, `128K`, `1.2M`.
pub fn format_tokens_per_s(tokens_per_s: f64) -> String {
    format_si(tokens_per_s)
}

/// A count with K/M/G suffixes and three significant digits at most.
pub fn format_si(value: f64) -> String {
    if !value.is_finite() {
        return "–".into();
    }
    let sign = if value < 0.0 { "-" } else { "" };
    let v = value.abs();
    const UNITS: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")];
    for (scale, suffix) in UNITS {
        // Round first so 999_960 prints "1.0M", not "1000.0K".
        if round_sig(v / scale, 3) >= 1.0 {
            return format!("{sign}{}{suffix}", fmt_scaled(v / scale));
        }
    }
    format!("{sign}{}", v.round() as u64)
}

/// Bytes in decimal units (what NVML tools and `df -H` print): `512 B`, `1.5 kB`, `2.1 GB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(f64, &str); 5] = [
        (1e15, "PB"),
        (1e12, "TB"),
        (1e9, "GB"),
        (1e6, "MB"),
        (1e3, "kB"),
    ];
    scaled_bytes(bytes, &UNITS)
}

/// Bytes in binary units (what the CUDA allocator and `nvidia-smi` MiB columns mean):
/// `80.0 GiB`.
pub fn format_bytes_binary(bytes: u64) -> String {
    const UNITS: [(f64, &str); 5] = [
        (1_125_899_906_842_624.0, "PiB"),
        (1_099_511_627_776.0, "TiB"),
        (1_073_741_824.0, "GiB"),
        (1_048_576.0, "MiB"),
        (1024.0, "KiB"),
    ];
    scaled_bytes(bytes, &UNITS)
}

fn scaled_bytes(bytes: u64, units: &[(f64, &str)]) -> String {
    let v = bytes as f64;
    for &(scale, suffix) in units {
        if round_sig(v / scale, 3) >= 1.0 {
            return format!("{} {suffix}", fmt_scaled(v / scale));
        }
    }
    format!("{bytes} B")
}

/// One decimal below 100 (`2.1`, `21.5`), none from 100 (`128`).
fn fmt_scaled(x: f64) -> String {
    if round_sig(x, 3) >= 100.0 {
        format!("{}", x.round() as u64)
    } else {
        format!("{:.1}", x)
    }
}

fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 {
        return 0.0;
    }
    let magnitude = x.abs().log10().floor() as i32;
    let factor = 10f64.powi(digits - 1 - magnitude);
    (x * factor).round() / factor
}

/// A duration for sentences: `45 s`, `14 min`, `3 h`, `3 h 20 min`, `14 h`, `2 d 3 h`.
///
/// Precision falls with size on purpose: "stable for 3 h 20 min" reads better than seconds.
pub fn format_duration_ms(ms: i64) -> String {
    if ms < 0 {
        return format!("-{}", format_duration_ms(-ms));
    }
    let s = ms / 1000;
    let (min, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 60 {
        format!("{s} s")
    } else if min < 60 {
        format!("{min} min")
    } else if h < 10 {
        match min % 60 {
            0 => format!("{h} h"),
            m => format!("{h} h {m} min"),
        }
    } else if h < 48 {
        format!("{h} h")
    } else {
        match h % 24 {
            0 => format!("{d} d"),
            rest => format!("{d} d {rest} h"),
        }
    }
}

pub fn format_duration_s(seconds: f64) -> String {
    format_duration_ms((seconds * 1000.0).round() as i64)
}

/// `14 min ago`; `just now` under a second; `in 5 min` for a future time.
pub fn format_ago(then_ms: TimestampMs, now_ms: TimestampMs) -> String {
    let delta = now_ms - then_ms;
    if delta.abs() < 1000 {
        "just now".into()
    } else if delta > 0 {
        format!("{} ago", format_duration_ms(delta))
    } else {
        format!("in {}", format_duration_ms(-delta))
    }
}

/// Wall-clock `HH:MM` of a timestamp in the given UTC offset (the console passes the local one).
pub fn format_clock(ts_ms: TimestampMs, offset: FixedOffset) -> String {
    match offset.timestamp_millis_opt(ts_ms).single() {
        Some(t) => t.format("%H:%M").to_string(),
        None => "??:??".into(),
    }
}

/// Parses a byte size as people write it in a config: `4096`, `512 MiB`, `8GiB`, `2.5 GB`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (number, unit) = (t[..split].replace('_', ""), t[split..].trim());
    let value: f64 = number.parse().map_err(|_| {
        format!("'{text}' is not a byte size (examples: 4096, \"512 MiB\", \"8 GiB\")")
    })?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1_048_576.0,
        "gib" => 1_073_741_824.0,
        "tib" => 1_099_511_627_776.0,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{text}' (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(format_thousands(0), "0");
        assert_eq!(format_thousands(999), "999");
        assert_eq!(format_thousands(1_000), "1,000");
        assert_eq!(format_thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn tokens_per_s_reads_like_the_incident_report() {
        assert_eq!(format_tokens_per_s(21_500.0), "21.5K");
        assert_eq!(format_tokens_per_s(21_480.0), "21.5K");
        assert_eq!(format_tokens_per_s(4_300.0), "4.3K");
        assert_eq!(format_tokens_per_s(12_800.0), "12.8K");
        assert_eq!(format_tokens_per_s(850.4), "850");
        assert_eq!(format_tokens_per_s(999.6), "1.0K");
        assert_eq!(format_tokens_per_s(128_400.0), "128K");
        assert_eq!(format_tokens_per_s(999_960.0), "1.0M");
        assert_eq!(format_tokens_per_s(1_230_000.0), "1.2M");
        assert_eq!(format_tokens_per_s(0.0), "0");
        assert_eq!(format_tokens_per_s(f64::NAN), "–");
    }

    #[test]
    fn bytes_decimal_and_binary() {
        assert_eq!(format_bytes(2_100_000_000), "2.1 GB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1_500), "1.5 kB");
        assert_eq!(format_bytes(150_754_820_096), "151 GB");
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes_binary(80 << 30), "80.0 GiB");
        assert_eq!(format_bytes_binary(1023), "1023 B");
        assert_eq!(format_bytes_binary(1536), "1.5 KiB");
    }

    #[test]
    fn durations_for_sentences() {
        assert_eq!(format_duration_ms(45_000), "45 s");
        assert_eq!(format_duration_ms(14 * 60_000 + 59_000), "14 min");
        assert_eq!(format_duration_ms(3 * 3_600_000), "3 h");
        assert_eq!(
            format_duration_ms(3 * 3_600_000 + 20 * 60_000),
            "3 h 20 min"
        );
        assert_eq!(format_duration_ms(14 * 3_600_000 + 20 * 60_000), "14 h");
        assert_eq!(format_duration_ms(51 * 3_600_000), "2 d 3 h");
        assert_eq!(format_duration_ms(72 * 3_600_000), "3 d");
        assert_eq!(format_duration_s(0.4), "0 s");
        assert_eq!(format_ago(0, 14 * 60_000), "14 min ago");
        assert_eq!(format_ago(5 * 60_000, 0), "in 5 min");
        assert_eq!(format_ago(10, 20), "just now");
    }

    #[test]
    fn clock_in_an_offset() {
        // 2026-01-01T20:52:00Z
        let ts = 1_767_300_720_000;
        assert_eq!(format_clock(ts, FixedOffset::east_opt(0).unwrap()), "20:52");
        assert_eq!(
            format_clock(ts, FixedOffset::east_opt(3600).unwrap()),
            "21:52"
        );
    }

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("2.5 GB"), Ok(2_500_000_000));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
        assert!(parse_bytes("eight")
            .unwrap_err()
            .contains("not a byte size"));
        assert!(parse_bytes("8 GB/s")
            .unwrap_err()
            .contains("unknown unit 'GB/s'"));
    }
}
