//! The run's durable, append-only history: one JSON [`Event`] per line in `journal.jsonl`.
//!
//! Every append is written with a single `write` of the whole line and `fsync`ed before it
//! returns, so an event the daemon reported to anyone is on disk. A crash can still leave a
//! torn last line; reopening drops it (and says so) instead of refusing the whole journal, and
//! truncates it so the next append starts on a clean line. Sequence numbers continue from the
//! highest one found.
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::metrics::TimestampMs;
use thiserror::Error;

/// Events kept in memory for queries; older ones are read back from the file.
const MEMORY_TAIL: usize = 4096;

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("{action} journal {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error("serializing journal event: {0}")]
    Serialize(serde_json::Error),
}

/// By hand rather than `#[from]`, which would also make the serde error the `source()` of a
/// message that already prints it (an error chain would print it twice).
impl From<serde_json::Error> for JournalError {
    fn from(e: serde_json::Error) -> Self {
        Self::Serialize(e)
    }
}

/// What reopening found; the daemon logs it and journals a note when lines were lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub events: u64,
    /// Byte length of a torn final line that was cut off.
    pub torn_tail_bytes: u64,
    /// Complete lines in the middle of the file that did not parse (line numbers, 1-based).
    pub unreadable_lines: Vec<u64>,
}

impl RecoveryReport {
    pub fn is_clean(&self) -> bool {
        self.torn_tail_bytes == 0 && self.unreadable_lines.is_empty()
    }
}

/// A filter over journal events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalQuery {
    pub after_seq: Option<u64>,
    pub since_ms: Option<TimestampMs>,
    pub until_ms: Option<TimestampMs>,
    pub min_severity: Option<Severity>,
    pub limit: Option<usize>,
}

impl JournalQuery {
    fn matches(&self, e: &Event) -> bool {
        self.after_seq.is_none_or(|s| e.seq > s)
            && self.since_ms.is_none_or(|t| e.ts_ms >= t)
            && self.until_ms.is_none_or(|t| e.ts_ms <= t)
            && self.min_severity.is_none_or(|s| e.severity >= s)
    }
}

#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    next_seq: u64,
    tail: VecDeque<Event>,
}

impl Journal {
    /// Opens (creating if needed) the journal of `run_dir`.
    pub fn open(run_dir: &Path) -> Result<(Self, RecoveryReport), JournalError> {
        Self::open_file(&dflash_shared::run_dir::journal_path(run_dir))
    }

    pub fn open_file(path: &Path) -> Result<(Self, RecoveryReport), JournalError> {
        let io_err = |action: &'static str| {
            let path = path.to_path_buf();
            move |source| JournalError::Io {
                action,
                path,
                cause: source,
            }
        };
        let (events, report, good_len) = match File::open(path) {
            Ok(f) => scan(BufReader::new(f)).map_err(io_err("reading"))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                (Vec::new(), RecoveryReport::default(), 0)
            }
            Err(e) => return Err(io_err("opening")(e)),
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err("opening for append"))?;
        if report.torn_tail_bytes > 0 {
            file.set_len(good_len)
                .map_err(io_err("truncating the torn tail of"))?;
            file.sync_all().map_err(io_err("syncing"))?;
        }
        let next_seq = events.last().map_or(1, |e| e.seq + 1);
        let skip = events.len().saturating_sub(MEMORY_TAIL);
        let tail = events.into_iter().skip(skip).collect();
        Ok((
            Journal {
                path: path.to_path_buf(),
                file,
                next_seq,
                tail,
            },
            report,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The seq the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends one event stamped now; returns it once it is on disk.
    pub fn append(&mut self, severity: Severity, kind: EventKind) -> Result<Event, JournalError> {
        self.append_at(dflash_shared::clock::now_ms(), severity, kind)
    }

    /// Appends with an explicit timestamp (recordings and tests).
    pub fn append_at(
        &mut self,
        ts_ms: TimestampMs,
        severity: Severity,
        kind: EventKind,
    ) -> Result<Event, JournalError> {
        let event = Event {
            seq: self.next_seq,
            ts_ms,
            severity,
            kind,
        };
        let mut line = serde_json::to_vec(&event)?;
        line.push(b'\n');
        let io_err = |action: &'static str| {
            let path = self.path.clone();
            move |source| JournalError::Io {
                action,
                path,
                cause: source,
            }
        };
        self.file.write_all(&line).map_err(io_err("appending to"))?;
        self.file.sync_data().map_err(io_err("syncing"))?;
        self.next_seq += 1;
        if self.tail.len() == MEMORY_TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(event.clone());
        Ok(event)
    }

    /// Events matching `query`, oldest first.
    pub fn query(&self, query: &JournalQuery) -> Result<Vec<Event>, JournalError> {
        let oldest_in_memory = self.tail.front().map(|e| e.seq);
        let needs_file = match (oldest_in_memory, query.after_seq) {
            (None, _) => false,
            (Some(1), _) => false,
            (Some(oldest), Some(after)) => after + 1 < oldest,
            (Some(_), None) => true,
        };
        let mut out: Vec<Event> = if needs_file {
            let f = File::open(&self.path).map_err(|source| JournalError::Io {
                action: "reading",
                path: self.path.clone(),
                cause: source,
            })?;
            let (events, _, _) = scan(BufReader::new(f)).map_err(|source| JournalError::Io {
                action: "reading",
                path: self.path.clone(),
                cause: source,
            })?;
            events.into_iter().filter(|e| query.matches(e)).collect()
        } else {
            self.tail
                .iter()
                .filter(|e| query.matches(e))
                .cloned()
                .collect()
        };
        if let Some(limit) = query.limit {
            // The newest `limit` events are the useful ones for a timeline.
            let drop = out.len().saturating_sub(limit);
            out.drain(..drop);
        }
        Ok(out)
    }

    /// The most recent events, oldest first.
    pub fn recent(&self, n: usize) -> Vec<Event> {
        let skip = self.tail.len().saturating_sub(n);
        self.tail.iter().skip(skip).cloned().collect()
    }
}

/// Reads every line; returns the events, what was skipped, and the byte length of the
/// well-formed prefix (everything up to the last complete, parseable-or-skipped line).
fn scan<R: BufRead>(mut reader: R) -> io::Result<(Vec<Event>, RecoveryReport, u64)> {
    let mut events = Vec::new();
    let mut report = RecoveryReport::default();
    let mut good_len = 0u64;
    let mut line = Vec::new();
    let mut line_no = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let complete = line.last() == Some(&b'\n');
        let parsed = serde_json::from_slice::<Event>(trim_newline(&line));
        match (complete, parsed) {
            (true, Ok(event)) => {
                good_len += n as u64;
                events.push(event);
            }
            (true, Err(_)) if trim_newline(&line).iter().all(u8::is_ascii_whitespace) => {
                good_len += n as u64;
            }
            (true, Err(_)) => {
                good_len += n as u64;
                report.unreadable_lines.push(line_no);
            }
            // A final line without its newline is torn even if it happens to parse: the write
            // that produced it never completed, so nobody was told about this event.
            (false, _) => report.torn_tail_bytes = n as u64,
        }
    }
    report.events = events.len() as u64;
    Ok((events, report, good_len))
}

fn trim_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(m: &str) -> EventKind {
        EventKind::Note { message: m.into() }
    }

    #[test]
    fn seq_continues_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, report) = Journal::open(dir.path()).unwrap();
            assert!(report.is_clean());
            assert_eq!(j.append(Severity::Info, note("a")).unwrap().seq, 1);
            assert_eq!(j.append(Severity::Warn, note("b")).unwrap().seq, 2);
        }
        let (mut j, report) = Journal::open(dir.path()).unwrap();
        assert_eq!(report.events, 2);
        assert_eq!(j.append(Severity::Info, note("c")).unwrap().seq, 3);
        let all = j.query(&JournalQuery::default()).unwrap();
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn torn_last_line_is_cut_and_appends_resume_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(Severity::Info, note("kept")).unwrap();
        }
        let path = dflash_shared::run_dir::journal_path(dir.path());
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"seq":2,"ts_ms":5,"severity":"info","kind":"no"#)
            .unwrap();
        drop(f);
        let (mut j, report) = Journal::open(dir.path()).unwrap();
        assert!(report.torn_tail_bytes > 0);
        assert_eq!(report.events, 1);
        assert_eq!(j.append(Severity::Info, note("after")).unwrap().seq, 2);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        for l in text.lines() {
            serde_json::from_str::<Event>(l).expect("every line parses after recovery");
        }
    }

    #[test]
    fn corrupt_middle_line_is_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dflash_shared::run_dir::journal_path(dir.path());
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append(Severity::Info, note("one")).unwrap();
        }
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"garbage\n").unwrap();
        drop(f);
        let (mut j, report) = Journal::open(dir.path()).unwrap();
        assert_eq!(report.unreadable_lines, vec![2]);
        assert_eq!(j.append(Severity::Info, note("two")).unwrap().seq, 2);
    }

    #[test]
    fn query_by_seq_time_and_severity() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        for (ts, sev) in [
            (100, Severity::Info),
            (200, Severity::Warn),
            (300, Severity::Crit),
            (400, Severity::Info),
        ] {
            j.append_at(ts, sev, note("x")).unwrap();
        }
        let seqs = |q: JournalQuery| {
            j.query(&q)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            seqs(JournalQuery {
                after_seq: Some(2),
                ..Default::default()
            }),
            vec![3, 4]
        );
        assert_eq!(
            seqs(JournalQuery {
                since_ms: Some(200),
                until_ms: Some(300),
                ..Default::default()
            }),
            vec![2, 3]
        );
        assert_eq!(
            seqs(JournalQuery {
                min_severity: Some(Severity::Warn),
                ..Default::default()
            }),
            vec![2, 3]
        );
        assert_eq!(
            seqs(JournalQuery {
                limit: Some(2),
                ..Default::default()
            }),
            vec![3, 4]
        );
    }

    #[test]
    fn old_events_beyond_the_memory_tail_are_read_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        // Writing MEMORY_TAIL+ events with fsync each is slow; fake a long history on disk.
        let path = j.path().to_path_buf();
        drop(j);
        let mut text = String::new();
        for seq in 1..=(MEMORY_TAIL as u64 + 10) {
            let e = Event {
                seq,
                ts_ms: seq as i64,
                severity: Severity::Info,
                kind: note("h"),
            };
            text.push_str(&serde_json::to_string(&e).unwrap());
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap();
        (j, _) = Journal::open(dir.path()).unwrap();
        assert_eq!(j.recent(1)[0].seq, MEMORY_TAIL as u64 + 10);
        let early = j
            .query(&JournalQuery {
                after_seq: Some(0),
                until_ms: Some(3),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            early.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
    }
}
