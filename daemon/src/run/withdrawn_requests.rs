//! Which granted operator requests get their journal line when filed, and which only if they
//! are confirmed (issue 15: request/cancel cycles).
//!
//! The pending caps bound how many requests wait at once, not how many a client files: one
//! that files and cancels in a loop is granted every time, and each filing and each cancel was
//! an fsynced journal line, so the journal grew without bound (two lines a cycle, hundreds of
//! cycles a second). Per uid and per window of
//! [`REFUSAL_WINDOW_MS`](super::refusal_throttle::REFUSAL_WINDOW_MS), the first
//! [`REFUSALS_JOURNALED_PER_WINDOW`] filings are journaled when filed, as before, and so are
//! their cancels and expiries. A filing past that is journaled only if it is confirmed (just
//! before its confirmation, saying when it was filed); if it is withdrawn (cancelled, expired)
//! unconfirmed it is only counted, and one summary line per window says how many. Every
//! confirmed action therefore has its filing and its confirmation in the journal; what the
//! journal leaves out is requests that never did anything. A window holds at most
//! `2 × (REFUSALS_JOURNALED_PER_WINDOW + 1) + 1` lines of filings and withdrawals per uid,
//! besides the confirmed ones.
//!
//! Pure: the caller passes the clock and which ids are still pending, and writes the lines.
use std::collections::BTreeMap;

use dflash_shared::metrics::TimestampMs;

use super::refusal_throttle::{RefusalThrottle, Summary, Verdict, REFUSALS_JOURNALED_PER_WINDOW};

/// What to do with a granted filing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filing {
    /// Journal this line now.
    Journal(String),
    /// Keep it back: journaled if confirmed, counted if withdrawn.
    Defer,
}

/// A filing kept back, journaled if its action is confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    pub uid: u32,
    pub filed_ms: TimestampMs,
    pub text: String,
}

impl Deferred {
    /// Its journal line, written just before the confirmation.
    pub fn text(&self) -> String {
        format!(
            "{} (filed at {} ms; journaled with its confirmation, as uid {} had filed \
             {REFUSALS_JOURNALED_PER_WINDOW} requests within a minute)",
            self.text, self.filed_ms, self.uid
        )
    }
}

#[derive(Debug, Default)]
pub struct WithdrawnRequests {
    throttle: RefusalThrottle,
    /// Filings kept back, by action id; only ids still pending (at most the pending cap).
    deferred: BTreeMap<String, Deferred>,
}

impl WithdrawnRequests {
    /// A granted filing of `id` by `uid`. `still_pending` says which ids are pending now (the
    /// record of any other is dropped: it expired where no one journaled it).
    pub fn filed(
        &mut self,
        uid: u32,
        now_ms: TimestampMs,
        id: &str,
        text: &str,
        still_pending: impl Fn(&str) -> bool,
    ) -> Filing {
        self.deferred.retain(|id, _| still_pending(id));
        match self.throttle.judge(uid, now_ms) {
            Verdict::Journal => Filing::Journal(text.to_string()),
            Verdict::JournalAndThrottle { window_ends_ms } => Filing::Journal(format!(
                "{text}; uid {uid} has filed {REFUSALS_JOURNALED_PER_WINDOW} requests in this \
                 minute: until {window_ends_ms} ms further ones are journaled only if confirmed, \
                 and one line will count those withdrawn"
            )),
            Verdict::Count => {
                // Counted only if it is withdrawn; journaled if it is confirmed.
                self.deferred.insert(
                    id.to_string(),
                    Deferred {
                        uid,
                        filed_ms: now_ms,
                        text: text.to_string(),
                    },
                );
                Filing::Defer
            }
        }
    }

    /// `id` was cancelled or expired unconfirmed: whether that gets a line (its filing had
    /// one) or is only counted (its filing was kept back).
    pub fn withdrawn(&mut self, now_ms: TimestampMs, id: &str, text: &str) -> bool {
        match self.deferred.remove(id) {
            Some(d) => {
                self.throttle
                    .count(d.uid, now_ms, &format!("{}, then {text}", d.text));
                false
            }
            None => true,
        }
    }

    /// `id` was confirmed: its filing, if it was kept back, to journal first.
    pub fn confirmed(&mut self, id: &str) -> Option<Deferred> {
        self.deferred.remove(id)
    }

    /// Summaries of the windows over at `now_ms` (all with `all`); call before the others.
    pub fn take_summaries(&mut self, now_ms: TimestampMs, all: bool) -> Vec<Summary> {
        self.throttle.take_summaries(now_ms, all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::refusal_throttle::REFUSAL_WINDOW_MS;

    const N: usize = REFUSALS_JOURNALED_PER_WINDOW as usize;

    #[test]
    fn filings_past_the_first_are_kept_back_and_counted_when_withdrawn() {
        let mut w = WithdrawnRequests::default();
        let mut lines = 0;
        for i in 0..1000 {
            let id = format!("stop-{i}");
            if let Filing::Journal(_) = w.filed(7, i, &id, "stop", |p| p == id) {
                lines += 1;
            }
            if w.withdrawn(i, &id, "cancelled") {
                lines += 1;
            }
        }
        // The first N + 1 filings and their cancels; the rest only counted.
        assert_eq!(lines, 2 * (N + 1));
        let s = w.take_summaries(REFUSAL_WINDOW_MS, false);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].left_out, (1000 - N - 1) as u64);
        assert!(s[0].last.contains("then cancelled"), "{}", s[0].last);
        // A new window journals filings again.
        assert!(matches!(
            w.filed(7, REFUSAL_WINDOW_MS, "a", "stop", |_| true),
            Filing::Journal(_)
        ));
    }

    #[test]
    fn a_kept_back_filing_is_journaled_when_confirmed_and_not_counted() {
        let mut w = WithdrawnRequests::default();
        for i in 0..=N as i64 {
            let id = format!("x{i}");
            assert!(matches!(
                w.filed(7, i, &id, "stop", |_| true),
                Filing::Journal(_)
            ));
            assert!(w.withdrawn(i, &id, "cancelled"));
        }
        assert_eq!(
            w.filed(7, 50, "stop-1", "Stop the run", |_| true),
            Filing::Defer
        );
        let d = w.confirmed("stop-1").expect("kept back");
        assert!(
            d.text().starts_with("Stop the run (filed at 50 ms"),
            "{}",
            d.text()
        );
        assert!(w.confirmed("stop-1").is_none());
        // Nothing was left out: no summary.
        assert!(w.take_summaries(REFUSAL_WINDOW_MS, true).is_empty());
    }

    #[test]
    fn records_of_ids_no_longer_pending_are_dropped() {
        let mut w = WithdrawnRequests::default();
        for i in 0..=N as i64 {
            w.filed(7, i, &format!("x{i}"), "stop", |_| true);
        }
        for i in 0..100 {
            // Each expired unnoticed: never withdrawn through us.
            w.filed(7, 20, &format!("gone{i}"), "stop", |_| true);
            w.filed(7, 20, "probe", "stop", |id| id == "probe");
            assert!(w.deferred.len() <= 2, "{}", w.deferred.len());
        }
    }
}
