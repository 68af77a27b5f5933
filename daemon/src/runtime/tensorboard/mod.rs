//! TensorBoard event files in the run dir (`[tensorboard]`, default `<run dir>/tensorboard/`):
//! one event per `metrics.jsonl` line, with a scalar for each of its numbers
//! ([`scalars`]), flushed per line so TensorBoard shows the run while it trains.
//!
//! Each start opens a new file (a resumed run appends one beside the earlier ones; TensorBoard
//! reads a directory's files in name order). The encoding is pure: [`record`] frames,
//! [`event`] holds the protobuf messages. A write failure is reported once, journaled, and
//! training goes on, as for `metrics.jsonl`.
pub mod event;
pub mod record;
pub mod scalars;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};

use dflash_shared::events::{EventKind, Severity};
use dflash_shared::run_dir::tensorboard_event_file_name;
use serde_json::Value;

use crate::run::handle::RunHandle;
use crate::telemetry::fingerprint::hostname;

/// Files one process may try in the same second before it gives up (each is `create_new`).
const MAX_FILE_SUFFIX: u32 = 1000;

pub struct TensorBoardOut {
    file: BufWriter<File>,
    path: PathBuf,
    failed: bool,
}

impl TensorBoardOut {
    /// Creates `dir` and a new event file in it, whose first record is the file version.
    pub fn open(dir: &Path, unix_ms: i64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let host = hostname().unwrap_or_else(|| "localhost".into());
        let (file, path) = create_new_file(dir, unix_ms, &host)?;
        let mut out = TensorBoardOut {
            file: BufWriter::new(file),
            path,
            failed: false,
        };
        out.append(&event::file_version_event(unix_ms as f64 / 1000.0))?;
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the event of one serialized metrics line and flushes it.
    pub fn write(&mut self, line: &Value, handle: &RunHandle) {
        if self.failed {
            return;
        }
        let written = scalars::scalar_line(line)
            .map_err(std::io::Error::other)
            .and_then(|l| self.append(&event::scalars_event(&l)));
        if let Err(e) = written {
            self.failed = true;
            let message = format!(
                "writing TensorBoard events to {} failed ({e}); later steps are not written \
                 there, metrics.jsonl and the recording still have them",
                self.path.display()
            );
            tracing::error!("{message}");
            handle.record_event_logged(Severity::Warn, EventKind::Note { message });
        }
    }

    fn append(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all(&record::frame(data))?;
        self.file.flush()
    }
}

/// `events.out.tfevents.<s>.<host>.<pid>.<n>` with the lowest `n` not taken.
fn create_new_file(dir: &Path, unix_ms: i64, host: &str) -> std::io::Result<(File, PathBuf)> {
    let seconds = u64::try_from(unix_ms / 1000).unwrap_or(0);
    for n in 0..MAX_FILE_SUFFIX {
        let path = dir.join(tensorboard_event_file_name(
            seconds,
            host,
            std::process::id(),
            n,
        ));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "{MAX_FILE_SUFFIX} event files of this process and second already exist in {}",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_file_in_the_same_second_gets_the_next_suffix_and_both_start_with_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        let a = TensorBoardOut::open(&tb, 1_764_600_000_999).unwrap();
        let b = TensorBoardOut::open(&tb, 1_764_600_000_000).unwrap();
        let name =
            |o: &TensorBoardOut| o.path().file_name().unwrap().to_string_lossy().into_owned();
        let (na, nb) = (name(&a), name(&b));
        assert!(na.starts_with("events.out.tfevents.1764600000."), "{na}");
        assert!(na.ends_with(&format!(".{}.0", std::process::id())), "{na}");
        assert_eq!(nb, format!("{}1", na.strip_suffix('0').unwrap()));
        let version = record::frame(&event::file_version_event(1_764_600_000.999));
        assert_eq!(std::fs::read(a.path()).unwrap(), version);
    }
}
