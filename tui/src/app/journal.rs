//! The journal as the console knows it: events ordered by `seq` (backfill and live pushes may
//! overlap), plus the most recent log lines.
use std::collections::VecDeque;

use dflash_shared::events::{Event, Severity};
use dflash_shared::metrics::TimestampMs;

use super::wording;

const MAX_EVENTS: usize = 20_000;
const MAX_LOG_LINES: usize = 2_000;

#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    pub ts_ms: TimestampMs,
    pub level: String,
    pub line: String,
}

#[derive(Debug, Clone, Default)]
pub struct Journal {
    events: Vec<Event>,
    logs: VecDeque<LogLine>,
}

/// What the events view shows: a minimum severity and a case-insensitive text match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    pub min_severity: Option<Severity>,
    pub text: String,
}

impl EventFilter {
    pub fn matches(&self, event: &Event) -> bool {
        if self.min_severity.is_some_and(|min| event.severity < min) {
            return false;
        }
        if self.text.is_empty() {
            return true;
        }
        let needle = self.text.to_lowercase();
        wording::kind_tag(&event.kind).contains(&needle)
            || wording::describe(&event.kind)
                .to_lowercase()
                .contains(&needle)
    }

    /// all → warn and above → crit only → all.
    pub fn cycle_severity(&mut self) {
        self.min_severity = match self.min_severity {
            None | Some(Severity::Info) => Some(Severity::Warn),
            Some(Severity::Warn) => Some(Severity::Crit),
            Some(Severity::Crit) => None,
        };
    }
}

impl Journal {
    /// Adds an event; one already known by `seq` is replaced, not duplicated.
    pub fn insert(&mut self, event: Event) {
        match self.events.binary_search_by_key(&event.seq, |e| e.seq) {
            Ok(at) => self.events[at] = event,
            Err(at) => self.events.insert(at, event),
        }
        if self.events.len() > MAX_EVENTS {
            let excess = self.events.len() - MAX_EVENTS;
            self.events.drain(..excess);
        }
    }

    pub fn extend(&mut self, events: impl IntoIterator<Item = Event>) {
        for event in events {
            self.insert(event);
        }
    }

    pub fn push_log(&mut self, line: LogLine) {
        self.logs.push_back(line);
        while self.logs.len() > MAX_LOG_LINES {
            self.logs.pop_front();
        }
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn logs(&self) -> impl DoubleEndedIterator<Item = &LogLine> {
        self.logs.iter()
    }

    pub fn filtered<'a>(&'a self, filter: &'a EventFilter) -> impl Iterator<Item = &'a Event> {
        self.events.iter().filter(move |e| filter.matches(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::events::EventKind;

    fn event(seq: u64, ts_ms: i64, severity: Severity, kind: EventKind) -> Event {
        Event {
            seq,
            ts_ms,
            severity,
            kind,
        }
    }

    fn note(seq: u64, text: &str) -> Event {
        event(
            seq,
            seq as i64 * 1000,
            Severity::Info,
            EventKind::Note {
                message: text.into(),
            },
        )
    }

    #[test]
    fn overlapping_backfill_and_pushes_keep_one_copy_in_seq_order() {
        let mut journal = Journal::default();
        journal.insert(note(3, "c"));
        journal.extend([note(1, "a"), note(3, "c"), note(2, "b")]);
        let seqs: Vec<u64> = journal.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
    }

    #[test]
    fn filter_by_severity_and_text() {
        let mut journal = Journal::default();
        journal.insert(note(1, "hello"));
        journal.insert(event(
            2,
            2000,
            Severity::Warn,
            EventKind::CacheChanged {
                name: "triton".into(),
                path: "/c".into(),
                change: "deleted".into(),
            },
        ));
        let mut filter = EventFilter::default();
        assert_eq!(journal.filtered(&filter).count(), 2);
        filter.cycle_severity();
        assert_eq!(journal.filtered(&filter).count(), 1);
        filter.cycle_severity();
        assert_eq!(journal.filtered(&filter).count(), 0);
        filter.cycle_severity();
        filter.text = "KERNEL".into();
        assert_eq!(
            journal.filtered(&filter).map(|e| e.seq).collect::<Vec<_>>(),
            vec![2]
        );
    }
}
