//! Telemetry recordings: the daemon writes every frame it streams to a per-run JSONL file, and
//! `dflash-tui replay` plays one back. One `RecordedFrame` per line.
use serde::{Deserialize, Serialize};

use crate::metrics::TimestampMs;
use crate::protocol::Response;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedFrame {
    pub ts_ms: TimestampMs,
    pub frame: Response,
}
