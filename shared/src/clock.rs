//! The one clock read of the workspace: wall-clock milliseconds since the Unix epoch. Pure
//! modules (detectors, formatting, the pending-action logic) take the time as a parameter;
//! only the edges that stamp events, metrics and frames call this.
use crate::metrics::TimestampMs;

pub fn now_ms() -> TimestampMs {
    chrono::Utc::now().timestamp_millis()
}
