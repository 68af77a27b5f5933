//! Recordings: a JSONL file of `RecordedFrame`s (one frame the daemon streamed, with its time),
//! read here and played into the console at an adjustable speed.
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use dflash_shared::recording::RecordedFrame;
use thiserror::Error;
use tokio::sync::mpsc;

use crate::app::{App, AppEvent, ReplayControl};

/// Speeds `+` and `-` step through.
pub const SPEEDS: [f64; 14] = [
    0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
];
/// A quiet stretch in a recording never stalls the replay longer than this.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// While it waits for the next frame the player moves the replay clock on this often.
const TICK_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Error)]
pub enum RecordingError {
    #[error("cannot read recording {path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error(
        "recording {path} has no readable frame ({skipped} lines skipped; first problem: {first})"
    )]
    Empty {
        path: String,
        skipped: usize,
        first: String,
    },
}

#[derive(Debug, Clone)]
pub struct Recording {
    pub frames: Vec<RecordedFrame>,
    /// (line number, reason) for each line that was not a frame.
    pub skipped: Vec<(usize, String)>,
}

/// Reads a recording. A bad line is reported with its number and skipped; a file with no
/// readable frame is an error.
pub fn load(path: &Path) -> Result<Recording, RecordingError> {
    let io_error = |source| RecordingError::Io {
        path: path.display().to_string(),
        cause: source,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    let mut frames = Vec::new();
    let mut skipped = Vec::new();
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io_error)?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<RecordedFrame>(&line) {
            Ok(frame) => frames.push(frame),
            Err(e) => skipped.push((index + 1, e.to_string())),
        }
    }
    if frames.is_empty() {
        return Err(RecordingError::Empty {
            path: path.display().to_string(),
            skipped: skipped.len(),
            first: skipped
                .first()
                .map(|(line, why)| format!("line {line}: {why}"))
                .unwrap_or_else(|| "the file is empty".into()),
        });
    }
    // The daemon writes frames in order; sort anyway so a concatenated file still plays.
    frames.sort_by_key(|f| f.ts_ms);
    Ok(Recording { frames, skipped })
}

/// Applies every frame at once, as if the replay had run to the end.
pub fn apply_all(app: &mut App, frames: &[RecordedFrame]) {
    for frame in frames {
        app.handle(AppEvent::Tick(frame.ts_ms));
        app.handle(AppEvent::Recorded(frame.frame.clone()));
    }
}

pub fn faster(speed: f64) -> f64 {
    SPEEDS.iter().copied().find(|s| *s > speed).unwrap_or(speed)
}

pub fn slower(speed: f64) -> f64 {
    SPEEDS
        .iter()
        .rev()
        .copied()
        .find(|s| *s < speed)
        .unwrap_or(speed)
}

/// Plays frames into the console with their recorded spacing divided by the speed.
pub async fn play(
    frames: Vec<RecordedFrame>,
    mut speed: f64,
    events: mpsc::Sender<AppEvent>,
    mut controls: mpsc::Receiver<ReplayControl>,
) {
    let mut paused = false;
    let progress = |position, speed, paused, finished| AppEvent::ReplayProgress {
        position,
        speed,
        paused,
        finished,
    };
    let total = frames.len();
    let mut previous_ts = frames.first().map(|f| f.ts_ms).unwrap_or_default();
    for (index, frame) in frames.into_iter().enumerate() {
        let gap_ms = (frame.ts_ms - previous_ts).max(0) as f64;
        let from_ts = previous_ts;
        previous_ts = frame.ts_ms;
        let whole = Duration::from_secs_f64(gap_ms / 1000.0 / speed).min(MAX_WAIT);
        let mut remaining = whole;
        loop {
            let started = tokio::time::Instant::now();
            let wait = if paused {
                Duration::from_secs(3600)
            } else {
                remaining.min(TICK_EVERY)
            };
            tokio::select! {
                _ = tokio::time::sleep(wait), if !paused => {
                    remaining = remaining.saturating_sub(wait);
                    if remaining.is_zero() {
                        break;
                    }
                    // Replay time moves on through a quiet stretch of the recording, so ages
                    // grow and stale figures show as stale, as they did at that moment.
                    let done = 1.0 - remaining.as_secs_f64() / whole.as_secs_f64();
                    let now = from_ts + (gap_ms * done) as i64;
                    if events.send(AppEvent::Tick(now)).await.is_err() {
                        return;
                    }
                }
                control = controls.recv() => {
                    match control {
                        None => return,
                        Some(ReplayControl::TogglePause) => paused = !paused,
                        Some(ReplayControl::Faster) => speed = faster(speed),
                        Some(ReplayControl::Slower) => speed = slower(speed),
                    }
                    if !paused {
                        remaining = remaining.saturating_sub(started.elapsed());
                    }
                    if events.send(progress(index, speed, paused, false)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let sent = async {
            events.send(AppEvent::Tick(frame.ts_ms)).await?;
            events.send(AppEvent::Recorded(frame.frame)).await?;
            events.send(progress(index + 1, speed, paused, false)).await
        };
        if sent.await.is_err() {
            return;
        }
    }
    let _ = events.send(progress(total, speed, paused, true)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_step_within_the_table() {
        assert_eq!(faster(60.0), 120.0);
        assert_eq!(slower(60.0), 30.0);
        assert_eq!(faster(7200.0), 7200.0);
        assert_eq!(slower(0.25), 0.25);
        assert_eq!(faster(45.0), 60.0);
    }

    #[test]
    fn bad_lines_are_skipped_with_their_numbers_and_an_empty_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let good = r#"{"ts_ms":5,"frame":{"type":"ok"}}"#;
        std::fs::write(&path, format!("{good}\nnot json\n\n{good}\n")).unwrap();
        let recording = load(&path).unwrap();
        assert_eq!(recording.frames.len(), 2);
        assert_eq!(recording.skipped.len(), 1);
        assert_eq!(recording.skipped[0].0, 2);

        std::fs::write(&path, "garbage\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_replay_clock_moves_on_through_a_quiet_stretch() {
        use dflash_shared::protocol::Response;
        // Two frames 14 minutes apart: the wait is capped (2 s of wall time), and meanwhile
        // the player ticks the recording's clock through the gap, so ages grow in a replay.
        let frames = vec![
            RecordedFrame {
                ts_ms: 0,
                frame: Response::Ok,
            },
            RecordedFrame {
                ts_ms: 840_000,
                frame: Response::Ok,
            },
        ];
        let (tx, mut rx) = mpsc::channel(64);
        let (_controls_tx, controls) = mpsc::channel(4);
        play(frames, 60.0, tx, controls).await;
        let mut ticks = Vec::new();
        while let Ok(event) = rx.try_recv() {
            if let AppEvent::Tick(t) = event {
                ticks.push(t);
            }
        }
        assert_eq!(ticks.first(), Some(&0));
        assert_eq!(ticks.last(), Some(&840_000));
        let between: Vec<i64> = ticks
            .iter()
            .copied()
            .filter(|t| *t > 0 && *t < 840_000)
            .collect();
        assert!(between.len() >= 4, "{ticks:?}");
        assert!(between.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
    }
}
