//! Numbers, sizes, durations and clock times, worded the way operators read them:
//! "21.5K tok/s", "2.1 GB", "3 h 10 min", "21:03".
use chrono::{DateTime, FixedOffset, Local, Offset, TimeZone, Utc};
use dflash_shared::format;
use dflash_shared::metrics::TimestampMs;

/// "1,234,567"
pub fn thousands(value: u64) -> String {
    format::format_thousands(value)
}

/// "45 s", "14 min", "3 h 10 min", "2 d 3 h". Negative spans (clock skew, an expired
/// deadline) read as zero.
pub fn duration_ms(ms: i64) -> String {
    format::format_duration_ms(ms.max(0))
}

/// The zone clock times are shown in: the operator's local zone, or a fixed offset (tests, and
/// `TZ`-less servers that want UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisplayClock {
    Local,
    Fixed(FixedOffset),
}

impl DisplayClock {
    pub fn utc() -> Self {
        DisplayClock::Fixed(FixedOffset::east_opt(0).expect("zero offset is valid"))
    }

    fn with_format(&self, ts_ms: TimestampMs, format: &str) -> String {
        let Some(utc) = DateTime::<Utc>::from_timestamp_millis(ts_ms) else {
            return "??:??".into();
        };
        match self {
            DisplayClock::Local => utc.with_timezone(&Local).format(format).to_string(),
            DisplayClock::Fixed(offset) => utc.with_timezone(offset).format(format).to_string(),
        }
    }

    /// The UTC offset in effect at `ts_ms` (local time changes with daylight saving).
    pub fn offset_at(&self, ts_ms: TimestampMs) -> FixedOffset {
        match self {
            DisplayClock::Fixed(offset) => *offset,
            DisplayClock::Local => DateTime::<Utc>::from_timestamp_millis(ts_ms)
                .map(|t| Local.offset_from_utc_datetime(&t.naive_utc()).fix())
                .unwrap_or_else(|| Utc.fix()),
        }
    }

    /// "21:03"
    pub fn hm(&self, ts_ms: TimestampMs) -> String {
        self.with_format(ts_ms, "%H:%M")
    }

    /// "21:03:17"
    pub fn hms(&self, ts_ms: TimestampMs) -> String {
        self.with_format(ts_ms, "%H:%M:%S")
    }

    /// "03-14 21:03"
    pub fn month_day_hm(&self, ts_ms: TimestampMs) -> String {
        self.with_format(ts_ms, "%m-%d %H:%M")
    }

    /// "2026-03-14 21:03"
    pub fn date_hm(&self, ts_ms: TimestampMs) -> String {
        self.with_format(ts_ms, "%Y-%m-%d %H:%M")
    }
}

/// RFC 3339 in UTC with milliseconds, for machine-readable output.
pub fn rfc3339(ts_ms: TimestampMs) -> String {
    DateTime::<Utc>::from_timestamp_millis(ts_ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ts_ms.to_string())
}

/// What the queue view and the status report say when the run has no hidden-state queue.
pub const INLINE_QUEUE_NOTE: &str = "no hidden-state queue: one device runs the target and \
                                     trains the drafter inline, so neither side waits on the other";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn durations_never_go_negative() {
        assert_eq!(duration_ms(14 * 60_000), "14 min");
        assert_eq!(duration_ms(3 * 3_600_000 + 10 * 60_000), "3 h 10 min");
        assert_eq!(duration_ms(-5_000), "0 s");
    }

    #[test]
    fn clock_times_use_the_display_offset() {
        let ts = 1_773_522_180_000; // 2026-03-14T21:03:00Z
        assert_eq!(DisplayClock::utc().hm(ts), "21:03");
        let plus_one = DisplayClock::Fixed(FixedOffset::east_opt(3600).unwrap());
        assert_eq!(plus_one.hm(ts), "22:03");
        assert_eq!(rfc3339(ts), "2026-03-14T21:03:00.000Z");
    }
}
