//! Which refused operator requests get a journal line of their own (issue 15, defect 8).
//!
//! Every journal line is fsynced, so a client repeating a refused request (4,000 stops over
//! one connection, a script retrying a wrong run name) must not turn into thousands of lines.
//! Per uid and per window of [`REFUSAL_WINDOW_MS`], the first [`REFUSALS_JOURNALED_PER_WINDOW`]
//! refusals are journaled one by one, as before; the next one is journaled together with the
//! notice that further ones are only counted; when the window is over, one summary line says
//! how many were left out and what the last of them was. That bounds refusals at
//! `REFUSALS_JOURNALED_PER_WINDOW + 2` journal lines per uid per window, and the first
//! occurrences (the ones that say what started) are always kept. Granted requests and
//! confirmations are never throttled: they are what the journal is for.
//!
//! Pure: the caller passes the clock and writes the lines.
use std::collections::BTreeMap;

use dflash_shared::metrics::TimestampMs;

/// Refusals per uid journaled one by one in each window.
pub const REFUSALS_JOURNALED_PER_WINDOW: u32 = 16;
/// The length of one counting window.
pub const REFUSAL_WINDOW_MS: TimestampMs = 60_000;

/// What to do with one refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Journal it as usual.
    Journal,
    /// Journal it, saying that further refusals in this window are counted, not journaled.
    JournalAndThrottle { window_ends_ms: TimestampMs },
    /// Count it; a summary line follows when the window is over.
    Count,
}

/// The refusals of one uid that were counted and not journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub uid: u32,
    pub left_out: u64,
    pub from_ms: TimestampMs,
    pub until_ms: TimestampMs,
    /// The text of the last refusal left out.
    pub last: String,
}

impl Summary {
    pub fn text(&self) -> String {
        self.text_of("refused requests")
    }

    /// The summary line, for what the throttle counted (`what`: "refused requests").
    pub fn text_of(&self, what: &str) -> String {
        format!(
            "{} more {what} from uid {} were counted, not journaled one by one, in \
             the {} s after {} ms (the last: {})",
            self.left_out,
            self.uid,
            (self.until_ms - self.from_ms) / 1000,
            self.from_ms,
            self.last
        )
    }
}

#[derive(Debug, Clone)]
struct Window {
    started_ms: TimestampMs,
    journaled: u32,
    left_out: u64,
    last: String,
}

#[derive(Debug, Default)]
pub struct RefusalThrottle {
    windows: BTreeMap<u32, Window>,
}

impl RefusalThrottle {
    /// Decides for one refusal of `uid` at `now_ms`. `text` is what its line would say.
    pub fn admit(&mut self, uid: u32, now_ms: TimestampMs, text: &str) -> Verdict {
        let verdict = self.judge(uid, now_ms);
        if verdict == Verdict::Count {
            self.count(uid, now_ms, text);
        }
        verdict
    }

    /// [`Self::admit`] without counting: a `Count` verdict leaves the counting to the caller
    /// ([`Self::count`]), for occurrences that may still turn out to need their line.
    pub fn judge(&mut self, uid: u32, now_ms: TimestampMs) -> Verdict {
        let w = self.windows.entry(uid).or_insert_with(|| Window {
            started_ms: now_ms,
            journaled: 0,
            left_out: 0,
            last: String::new(),
        });
        if w.journaled < REFUSALS_JOURNALED_PER_WINDOW {
            w.journaled += 1;
            Verdict::Journal
        } else if w.journaled == REFUSALS_JOURNALED_PER_WINDOW {
            w.journaled += 1;
            Verdict::JournalAndThrottle {
                window_ends_ms: w.started_ms + REFUSAL_WINDOW_MS,
            }
        } else {
            Verdict::Count
        }
    }

    /// Counts one occurrence that gets no line of its own, in `uid`'s current window (opened
    /// at `now_ms` if there is none), so the window's summary includes it.
    pub fn count(&mut self, uid: u32, now_ms: TimestampMs, text: &str) {
        let w = self.windows.entry(uid).or_insert_with(|| Window {
            started_ms: now_ms,
            journaled: 0,
            left_out: 0,
            last: String::new(),
        });
        w.left_out += 1;
        w.last = text.to_string();
    }

    /// Closes the windows that are over at `now_ms` (all of them with `all`, at shutdown) and
    /// returns a summary for each that left refusals out. Call it before [`Self::admit`].
    pub fn take_summaries(&mut self, now_ms: TimestampMs, all: bool) -> Vec<Summary> {
        let over: Vec<u32> = self
            .windows
            .iter()
            .filter(|(_, w)| all || now_ms >= w.started_ms + REFUSAL_WINDOW_MS)
            .map(|(uid, _)| *uid)
            .collect();
        over.into_iter()
            .filter_map(|uid| {
                let w = self.windows.remove(&uid)?;
                (w.left_out > 0).then(|| Summary {
                    uid,
                    left_out: w.left_out,
                    from_ms: w.started_ms,
                    until_ms: now_ms.min(w.started_ms + REFUSAL_WINDOW_MS),
                    last: w.last,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_refusals_are_journaled_then_counted_then_summarised() {
        let mut t = RefusalThrottle::default();
        let verdicts: Vec<Verdict> = (0..100)
            .map(|i| t.admit(1000, i, &format!("r{i}")))
            .collect();
        let n = REFUSALS_JOURNALED_PER_WINDOW as usize;
        assert!(verdicts[..n].iter().all(|v| *v == Verdict::Journal));
        assert_eq!(
            verdicts[n],
            Verdict::JournalAndThrottle {
                window_ends_ms: REFUSAL_WINDOW_MS
            }
        );
        assert!(verdicts[n + 1..].iter().all(|v| *v == Verdict::Count));
        // Another uid has its own window.
        assert_eq!(t.admit(1001, 100, "x"), Verdict::Journal);
        assert!(t.take_summaries(REFUSAL_WINDOW_MS - 1, false).is_empty());
        let s = t.take_summaries(REFUSAL_WINDOW_MS, false);
        assert_eq!(
            s,
            vec![Summary {
                uid: 1000,
                left_out: (100 - n - 1) as u64,
                from_ms: 0,
                until_ms: REFUSAL_WINDOW_MS,
                last: "r99".into(),
            }]
        );
        assert!(s[0]
            .text()
            .contains("83 more refused requests from uid 1000"));
        // The window restarts: the next refusal is journaled again.
        assert_eq!(t.admit(1000, REFUSAL_WINDOW_MS, "again"), Verdict::Journal);
        // uid 1001's window closed without leaving anything out: no summary, at shutdown too.
        assert!(t.take_summaries(REFUSAL_WINDOW_MS + 101, true).is_empty());
    }

    #[test]
    fn shutdown_summarises_an_open_window() {
        let mut t = RefusalThrottle::default();
        for i in 0..=REFUSALS_JOURNALED_PER_WINDOW as i64 + 3 {
            t.admit(7, i, "stop refused");
        }
        let s = t.take_summaries(50, true);
        assert_eq!((s.len(), s[0].left_out, s[0].until_ms), (1, 3, 50));
    }
}
