//! Compile and kernel cache state transitions from successive [`CacheState`] samples.
//!
//! Deleting a warm compile cache makes the next start compile everything again (and, in the
//! incident this exists for, exposed a race at first compilation), so a warm cache that goes
//! missing or cold raises a Warn on `cache:<name>`; it returns to Ok once the cache is warm
//! again. A cache that was never warm (a first run) is not an alert.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Level, Transition};
use crate::events::wording::cache_label;
use crate::events::EventKind;
use crate::format::format_bytes;
use crate::metrics::{CacheState, TimestampMs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheChangeKind {
    /// Was present, now missing.
    Deleted,
    /// Still present, no longer warm (emptied or invalidated).
    WentCold,
    /// Was missing, now present.
    Appeared,
    /// Was cold, now warm.
    WentWarm,
}

impl CacheChangeKind {
    /// The word used in `CacheChanged.change` and read back by the alert explanation.
    pub fn word(self) -> &'static str {
        match self {
            CacheChangeKind::Deleted => "deleted",
            CacheChangeKind::WentCold => "went cold",
            CacheChangeKind::Appeared => "appeared",
            CacheChangeKind::WentWarm => "warm",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheChange {
    pub name: String,
    pub path: String,
    pub kind: CacheChangeKind,
    pub at_ms: TimestampMs,
    pub size_before: u64,
    pub entries_before: u64,
}

impl CacheChange {
    /// `change` reads "deleted (was 2.1 GB, 418 entries)"; its first words are the kind's word.
    pub fn to_event_kind(&self) -> EventKind {
        let change = match self.kind {
            CacheChangeKind::Deleted | CacheChangeKind::WentCold => format!(
                "{} (was {}, {} entries)",
                self.kind.word(),
                format_bytes(self.size_before),
                self.entries_before
            ),
            _ => self.kind.word().to_string(),
        };
        EventKind::CacheChanged {
            name: self.name.clone(),
            path: self.path.clone(),
            change,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Tracked {
    last: Option<CacheState>,
    was_ever_warm: bool,
    level: Level,
}

#[derive(Debug, Clone, Default)]
pub struct CacheWatcher {
    caches: BTreeMap<String, Tracked>,
}

impl CacheWatcher {
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers caches as they were in an earlier process (the healthy record's): one that was
    /// warm then and is missing or cold at the first observation raises its alert, so a restart
    /// does not forget that the cache is gone.
    pub fn remember(&mut self, states: &[CacheState]) {
        for state in states {
            let tracked = self.caches.entry(state.name.clone()).or_default();
            tracked.was_ever_warm |= state.present && state.warm;
            if tracked.last.is_none() {
                tracked.last = Some(state.clone());
            }
        }
    }

    /// Feeds one inventory of all configured caches. Returns the changes (for the journal) and
    /// any level transitions (for alerts).
    pub fn observe(
        &mut self,
        ts_ms: TimestampMs,
        states: &[CacheState],
    ) -> (Vec<CacheChange>, Vec<Transition>) {
        let mut changes = Vec::new();
        let mut transitions = Vec::new();
        for state in states {
            let tracked = self.caches.entry(state.name.clone()).or_default();
            if let Some(prev) = &tracked.last {
                let kind = match (prev.present, state.present, prev.warm, state.warm) {
                    (true, false, _, _) => Some(CacheChangeKind::Deleted),
                    (false, true, _, _) => Some(CacheChangeKind::Appeared),
                    (true, true, true, false) => Some(CacheChangeKind::WentCold),
                    (true, true, false, true) => Some(CacheChangeKind::WentWarm),
                    _ => None,
                };
                if let Some(kind) = kind {
                    changes.push(CacheChange {
                        name: state.name.clone(),
                        path: state.path.clone(),
                        kind,
                        at_ms: ts_ms,
                        size_before: prev.size_bytes,
                        entries_before: prev.entries,
                    });
                }
            }
            let warm_now = state.present && state.warm;
            let next = if warm_now || !tracked.was_ever_warm {
                Level::Ok
            } else {
                Level::Warn
            };
            if next != tracked.level {
                let label = cache_label(&state.name);
                let message = match next {
                    Level::Ok => format!("{label} warm again ({})", state.path),
                    _ if !state.present => format!(
                        "{label} deleted ({}); the next compilation starts cold",
                        state.path
                    ),
                    _ => format!(
                        "{label} went cold ({}); the next compilation starts cold",
                        state.path
                    ),
                };
                transitions.push(Transition {
                    detector: format!("cache:{}", state.name),
                    from: tracked.level,
                    to: next,
                    at_ms: ts_ms,
                    message,
                });
                tracked.level = next;
            }
            tracked.was_ever_warm |= warm_now;
            tracked.last = Some(state.clone());
        }
        (changes, transitions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(present: bool, warm: bool, size: u64) -> CacheState {
        CacheState {
            name: "torchinductor".into(),
            path: "/tmp/torchinductor_op".into(),
            present,
            size_bytes: size,
            entries: if present { 418 } else { 0 },
            last_change_ms: None,
            warm,
        }
    }

    #[test]
    fn a_first_cold_start_is_not_an_alert_but_deleting_a_warm_cache_is() {
        let mut w = CacheWatcher::new();
        let (c, t) = w.observe(0, &[state(false, false, 0)]);
        assert!(c.is_empty() && t.is_empty());
        let (c, t) = w.observe(1, &[state(true, false, 10)]);
        assert_eq!(c[0].kind, CacheChangeKind::Appeared);
        assert!(t.is_empty());
        let (c, _) = w.observe(2, &[state(true, true, 2_100_000_000)]);
        assert_eq!(c[0].kind, CacheChangeKind::WentWarm);
        let (c, t) = w.observe(3, &[state(false, false, 0)]);
        assert_eq!(c[0].kind, CacheChangeKind::Deleted);
        assert_eq!(
            c[0].to_event_kind(),
            EventKind::CacheChanged {
                name: "torchinductor".into(),
                path: "/tmp/torchinductor_op".into(),
                change: "deleted (was 2.1 GB, 418 entries)".into()
            }
        );
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].detector.as_str(), t[0].to),
            ("cache:torchinductor", Level::Warn)
        );
        assert_eq!(
            t[0].message,
            "TorchInductor compile cache deleted (/tmp/torchinductor_op); the next compilation starts cold"
        );
        let (_, t) = w.observe(4, &[state(true, true, 5)]);
        assert_eq!(t[0].to, Level::Ok);
    }

    #[test]
    fn a_cache_warm_in_an_earlier_process_and_missing_now_is_an_alert_from_the_first_scan() {
        let mut w = CacheWatcher::new();
        w.remember(&[state(true, true, 2_100_000_000)]);
        let (c, t) = w.observe(10, &[state(false, false, 0)]);
        assert_eq!(c[0].kind, CacheChangeKind::Deleted);
        assert_eq!((t.len(), t[0].to), (1, Level::Warn));
        // A fresh watcher would say nothing of the same scan.
        let (_, t) = CacheWatcher::new().observe(10, &[state(false, false, 0)]);
        assert!(t.is_empty());
    }

    #[test]
    fn going_cold_while_present() {
        let mut w = CacheWatcher::new();
        w.observe(0, &[state(true, true, 9)]);
        let (c, t) = w.observe(1, &[state(true, false, 9)]);
        assert_eq!(c[0].kind, CacheChangeKind::WentCold);
        assert!(t[0].message.contains("went cold"));
        assert!(
            w.observe(2, &[state(true, false, 9)]).0.is_empty(),
            "no repeat"
        );
    }
}
