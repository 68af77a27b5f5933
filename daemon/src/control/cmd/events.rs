//! `events`: a page of the journal after a sequence number, or its newest events.
use dflash_shared::events::Event;
use dflash_shared::protocol::{ErrorCode, Response};

use super::error;
use crate::run::handle::RunHandle;
use crate::run::journal::JournalQuery;

/// Events per `events` reply; a client pages with the last seq it got.
pub const MAX_EVENTS_PER_REPLY: usize = 500;

pub(super) fn answer(handle: &RunHandle, after_seq: Option<u64>, last: Option<usize>) -> Response {
    let q = JournalQuery {
        after_seq,
        ..Default::default()
    };
    match handle.with_journal(|j| j.query(&q)) {
        Ok(events) => Response::Events {
            events: page_of_events(events, last),
        },
        Err(e) => error(ErrorCode::Internal, e.to_string()),
    }
}

/// The reply page: the oldest [`MAX_EVENTS_PER_REPLY`] events, or with `last` the newest
/// `last` (capped the same way), still oldest first.
fn page_of_events(mut events: Vec<Event>, last: Option<usize>) -> Vec<Event> {
    if let Some(n) = last {
        let keep = n.min(MAX_EVENTS_PER_REPLY);
        events.drain(..events.len().saturating_sub(keep));
    }
    events.truncate(MAX_EVENTS_PER_REPLY);
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::events::{EventKind, Severity};

    fn note(seq: u64) -> Event {
        Event {
            seq,
            ts_ms: 0,
            severity: Severity::Info,
            kind: EventKind::Note {
                message: format!("n{seq}"),
            },
        }
    }

    #[test]
    fn event_pages_are_the_oldest_or_with_last_the_newest() {
        let seqs = |v: Vec<Event>| v.iter().map(|e| e.seq).collect::<Vec<_>>();
        let all: Vec<_> = (1..=MAX_EVENTS_PER_REPLY as u64 + 10).map(note).collect();
        let page = seqs(page_of_events(all.clone(), None));
        assert_eq!(page.len(), MAX_EVENTS_PER_REPLY);
        assert_eq!(page[0], 1);
        assert_eq!(
            seqs(page_of_events(all.clone(), Some(3))),
            vec![508, 509, 510]
        );
        let capped = seqs(page_of_events(all.clone(), Some(100_000)));
        assert_eq!((capped.len(), capped[0]), (MAX_EVENTS_PER_REPLY, 11));
        assert!(page_of_events(all, Some(0)).is_empty());
        assert_eq!(seqs(page_of_events(vec![note(4)], Some(5))), vec![4]);
    }
}
