//! `tail` without a daemon: the journal (`journal.jsonl`, one event per line) and the rolling
//! logs under `logs/`, merged by time; `--follow` polls them for new lines.
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dflash_shared::events::Event;
use dflash_shared::run_dir::JSON_LOG_EXTENSION;

use super::{Gone, Out};
use crate::feed::{self, Item};
use crate::paths::DaemonFiles;

const POLL: Duration = Duration::from_millis(500);

/// Reads the complete lines appended to a file since the last call.
#[derive(Debug, Default)]
struct Cursor {
    offset: u64,
    partial: String,
    /// Complete lines returned so far, for error messages with line numbers.
    lines_read: usize,
}

impl Cursor {
    fn read_new_lines(&mut self, path: &Path) -> Vec<String> {
        let Ok(mut file) = std::fs::File::open(path) else {
            return Vec::new();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Truncated or replaced (log rotation): start over.
            self.offset = 0;
            self.partial.clear();
            self.lines_read = 0;
        }
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return Vec::new();
        }
        self.offset += bytes.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&bytes));
        let Some(end) = self.partial.rfind('\n') else {
            return Vec::new();
        };
        let complete: String = self.partial.drain(..=end).collect();
        let lines: Vec<String> = complete.lines().map(str::to_string).collect();
        self.lines_read += lines.len();
        lines
    }
}

/// The daemon writes each line twice, to a human log and a JSON-lines log: read the JSON ones
/// (exact levels and times), or the human ones when there are none.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let is_json = |p: &PathBuf| p.extension().is_some_and(|e| e == JSON_LOG_EXTENSION);
    if files.iter().any(is_json) {
        files.retain(is_json);
    }
    files
}

struct Sources {
    cursors: BTreeMap<PathBuf, Cursor>,
    journal: PathBuf,
    logs_dir: PathBuf,
}

impl Sources {
    /// New items from every source, sorted by time.
    fn poll(&mut self) -> Vec<Item> {
        let mut items = Vec::new();
        let journal = self.journal.clone();
        let cursor = self.cursors.entry(journal.clone()).or_default();
        let first_line = cursor.lines_read;
        for (i, line) in cursor.read_new_lines(&journal).into_iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(&line) {
                Ok(event) => items.push(Item::Event(event)),
                Err(e) => eprintln!(
                    "dflash-tui: {}:{}: skipping a line that is not a journal event: {e}",
                    journal.display(),
                    first_line + i + 1
                ),
            }
        }
        for path in log_files(&self.logs_dir) {
            let cursor = self.cursors.entry(path.clone()).or_default();
            items.extend(
                cursor
                    .read_new_lines(&path)
                    .iter()
                    .filter_map(|l| feed::parse_log_line(l)),
            );
        }
        items.sort_by_key(Item::ts_ms);
        items
    }
}

pub(super) async fn tail(
    files: &DaemonFiles,
    out: &mut Out,
    lines: usize,
    follow: bool,
) -> anyhow::Result<(), Gone> {
    let mut sources = Sources {
        cursors: BTreeMap::new(),
        journal: files.journal.clone(),
        logs_dir: files.logs_dir.clone(),
    };
    if !files.journal.exists() && !files.logs_dir.exists() {
        eprintln!(
            "dflash-tui: no journal ({}) and no logs ({}) yet",
            files.journal.display(),
            files.logs_dir.display()
        );
    }
    out.emit_history(&sources.poll(), lines)?;
    if !follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(POLL).await;
        for item in sources.poll() {
            out.emit(&item)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_cursor_returns_only_complete_new_lines_and_survives_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut file = std::fs::File::create(&path).unwrap();
        write!(file, "one\ntw").unwrap();
        let mut cursor = Cursor::default();
        assert_eq!(cursor.read_new_lines(&path), vec!["one"]);
        write!(file, "o\nthree\n").unwrap();
        assert_eq!(cursor.read_new_lines(&path), vec!["two", "three"]);
        assert!(cursor.read_new_lines(&path).is_empty());
        std::fs::write(&path, "fresh\n").unwrap();
        assert_eq!(cursor.read_new_lines(&path), vec!["fresh"]);
    }
}
