//! Records every streamed telemetry and event frame of a run to `recording.jsonl`, one
//! [`RecordedFrame`] per line, for `dflash-tui replay` postmortems.
//!
//! Unlike the journal this is a bulk stream: buffered, flushed per frame (a `write`, no
//! `fsync`), and a write failure disables recording with one log line instead of failing the
//! run.
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use dflash_shared::metrics::TimestampMs;
use dflash_shared::protocol::Response;
use dflash_shared::recording::RecordedFrame;

#[derive(Debug)]
pub struct Recorder {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

impl Recorder {
    pub fn open(run_dir: &Path) -> io::Result<Self> {
        let path = dflash_shared::run_dir::recording_path(run_dir);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(Recorder {
            path,
            out: Some(BufWriter::new(file)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_recording(&self) -> bool {
        self.out.is_some()
    }

    /// Whether a frame belongs in a recording: the pushed telemetry and events (not log lines
    /// or drop notices), and status snapshots, which a replay reads the run's thresholds from.
    pub fn records(frame: &Response) -> bool {
        match frame {
            Response::Status(_) => true,
            Response::Log { .. } | Response::Dropped { .. } => false,
            other => other.is_pushed(),
        }
    }

    pub fn record(&mut self, ts_ms: TimestampMs, frame: &Response) {
        let Some(out) = self.out.as_mut() else { return };
        let line = RecordedFrame {
            ts_ms,
            frame: frame.clone(),
        };
        let result = serde_json::to_writer(&mut *out, &line)
            .map_err(io::Error::other)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = result {
            tracing::error!(path = %self.path.display(), error = %e, "recording disabled after a write failure");
            self.out = None;
        }
    }
}
