//! The wall clock: the one place either program reads the time of day.
//!
//! Everything else in this crate (detectors, wording, the run-dir rules) is pure and takes the
//! time as a parameter (`now_ms`, `ts_ms`), so tests feed it fixed times; the daemon and the
//! console read the clock here and pass it in.
use crate::metrics::TimestampMs;

/// Milliseconds since the Unix epoch, UTC (`chrono::Utc::now().timestamp_millis()`).
pub fn now_ms() -> TimestampMs {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_wall_clock_in_milliseconds() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let now = now_ms();
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(before <= now && now <= after, "{before} {now} {after}");
    }
}
