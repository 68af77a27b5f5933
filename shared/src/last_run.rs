//! Where the most recent `dflashd start` put its run, so that the console finds the journal when
//! the daemon is down even if the run dir was given with `--run-dir` (as `make run` does).
//!
//! The daemon writes `<state dir>/last-run.json` once a run has started; `dflash-tui status` and
//! `tail` read it when neither a daemon answers nor `--run-dir` was given.
use serde::{Deserialize, Serialize};

use crate::metrics::TimestampMs;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRun {
    pub run_name: String,
    pub run_dir: String,
    pub socket: String,
    pub pid: u32,
    pub started_ms: TimestampMs,
}

impl LastRun {
    /// `None` for anything that is not a record we wrote (an old format, a partial file): the
    /// caller then falls back to the default run dir rather than failing.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_ignores_what_it_did_not_write() {
        let record = LastRun {
            run_name: "tiny-cpu".into(),
            run_dir: "/work/repo/runs/default".into(),
            socket: "/tmp/dflash-0/dflashd.sock".into(),
            pid: 4242,
            started_ms: 1_796_037_161_379,
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(LastRun::parse(&text), Some(record));
        assert_eq!(LastRun::parse("{\"run_dir\": 3}"), None);
        assert_eq!(LastRun::parse(""), None);
    }
}
