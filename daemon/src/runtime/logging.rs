//! Logging: `tracing` to stderr, to daily-rolling files in the state dir (a human log and a
//! JSON-lines log), and to `logs` subscribers of the control socket.
//!
//! File writes go through `tracing-appender`'s non-blocking worker, so a slow disk never
//! stalls a training thread; under extreme pressure lines are dropped, not waited for.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use dflash_shared::protocol::{Response, Topic};
use thiserror::Error;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::run::bus::FrameBus;

// The file names are the run-dir contract the console reads (`dflash_shared::run_dir`).
use dflash_shared::run_dir::{
    HUMAN_LOG_EXTENSION as HUMAN_LOG_SUFFIX, JSON_LOG_EXTENSION as JSON_LOG_SUFFIX, LOG_FILE_PREFIX,
};
/// Days of rolled files kept per format.
pub const KEPT_LOG_FILES: usize = 14;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StderrFormat {
    Human,
    Json,
    Off,
}

#[derive(Debug, Clone)]
pub struct LoggingConfig {
    pub log_dir: PathBuf,
    pub stderr: StderrFormat,
    /// An `EnvFilter` directive such as "info" or "dflashd=debug,info"; `RUST_LOG` wins.
    pub filter: String,
    /// Where `logs` subscribers listen; `None` before the control plane exists.
    pub bus: Option<FrameBus>,
}

#[derive(Debug, Error)]
pub enum LoggingError {
    #[error("creating log files in {dir}: {message}")]
    Files { dir: PathBuf, message: String },
    #[error("invalid log filter {filter:?}: {message}")]
    Filter { filter: String, message: String },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
}

/// Keeps the file writers flushing; drop it last (it flushes what is buffered).
#[must_use = "dropping the guards stops file logging"]
#[derive(Debug)]
pub struct LogGuards {
    _guards: Vec<WorkerGuard>,
}

/// Builds the subscriber without installing it (tests use `with_default`).
pub fn build(
    cfg: &LoggingConfig,
) -> Result<(impl Subscriber + Send + Sync, LogGuards), LoggingError> {
    std::fs::create_dir_all(&cfg.log_dir).map_err(|e| files_err(&cfg.log_dir, e))?;
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => env,
        _ => cfg.filter.clone(),
    };
    let env_filter = EnvFilter::try_new(&filter).map_err(|e| LoggingError::Filter {
        filter,
        message: e.to_string(),
    })?;
    let (human, human_guard) =
        tracing_appender::non_blocking(appender(&cfg.log_dir, HUMAN_LOG_SUFFIX)?);
    let (json, json_guard) =
        tracing_appender::non_blocking(appender(&cfg.log_dir, JSON_LOG_SUFFIX)?);
    let stderr_human = (cfg.stderr == StderrFormat::Human).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::env::var_os("NO_COLOR").is_none())
    });
    let stderr_json = (cfg.stderr == StderrFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
    });
    let subscriber = Registry::default()
        .with(env_filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(human)
                .with_ansi(false),
        )
        .with(tracing_subscriber::fmt::layer().json().with_writer(json))
        .with(stderr_human)
        .with(stderr_json)
        .with(cfg.bus.clone().map(|bus| BusLayer { bus }));
    Ok((
        subscriber,
        LogGuards {
            _guards: vec![human_guard, json_guard],
        },
    ))
}

/// Builds and installs the process-wide subscriber.
pub fn init(cfg: &LoggingConfig) -> Result<LogGuards, LoggingError> {
    let (subscriber, guards) = build(cfg)?;
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|_| LoggingError::AlreadyInstalled)?;
    Ok(guards)
}

fn appender(dir: &Path, suffix: &str) -> Result<RollingFileAppender, LoggingError> {
    RollingFileAppender::builder()
        .rotation(Rotation::DAILY)
        .filename_prefix(LOG_FILE_PREFIX)
        .filename_suffix(suffix)
        .max_log_files(KEPT_LOG_FILES)
        .build(dir)
        .map_err(|e| files_err(dir, e))
}

fn files_err(dir: &Path, e: impl std::fmt::Display) -> LoggingError {
    LoggingError::Files {
        dir: dir.to_path_buf(),
        message: e.to_string(),
    }
}

/// Publishes each log line to `logs` subscribers as `Response::Log`.
struct BusLayer {
    bus: FrameBus,
}

impl<S: Subscriber> Layer<S> for BusLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if self.bus.subscriber_count() == 0 {
            return;
        }
        let meta = event.metadata();
        let mut line = LineVisitor::default();
        event.record(&mut line);
        let mut text = format!("{}: {}", meta.target(), line.message);
        if !line.fields.is_empty() {
            let _ = write!(text, " {}", line.fields);
        }
        self.bus.publish(
            Topic::Logs,
            Response::Log {
                level: meta.level().to_string(),
                line: text,
            },
        );
    }
}

#[derive(Default)]
struct LineVisitor {
    message: String,
    fields: String,
}

impl Visit for LineVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.push_field(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.push_field(field, value);
        }
    }
}

impl LineVisitor {
    fn push_field(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if !self.fields.is_empty() {
            self.fields.push(' ');
        }
        let _ = write!(self.fields, "{}={value:?}", field.name());
    }
}

/// The newest log file of a format in `log_dir` (what `tail` reads when the daemon is down).
pub fn newest_log_file(log_dir: &Path, suffix: &str) -> Option<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.starts_with(LOG_FILE_PREFIX) && name.ends_with(&format!(".{suffix}"))
        })
        .collect();
    // Daily names (`dflashd.2026-11-30.log`) sort chronologically.
    files.sort();
    files.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_the_human_file_the_json_file_and_log_subscribers() {
        let dir = tempfile::tempdir().unwrap();
        let bus = FrameBus::new(16);
        let mut rx = bus.subscribe();
        let cfg = LoggingConfig {
            log_dir: dir.path().into(),
            stderr: StderrFormat::Off,
            filter: "info".into(),
            bus: Some(bus),
        };
        let (subscriber, guards) = build(&cfg).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(device = "cpu", "warmup finished");
            tracing::debug!("filtered out at info");
        });
        drop(guards); // flushes the non-blocking writers

        let human = std::fs::read_to_string(newest_log_file(dir.path(), HUMAN_LOG_SUFFIX).unwrap())
            .unwrap();
        assert!(
            human.contains("warmup finished") && human.contains("device=\"cpu\""),
            "{human}"
        );
        assert!(!human.contains("filtered out"), "{human}");
        let json =
            std::fs::read_to_string(newest_log_file(dir.path(), JSON_LOG_SUFFIX).unwrap()).unwrap();
        let line: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        assert_eq!(line["fields"]["message"], "warmup finished");
        assert_eq!(line["level"], "INFO");

        let published = rx.try_recv().expect("log subscribers get the line");
        assert_eq!(published.topic, Topic::Logs);
        match &published.frame {
            Response::Log { level, line } => {
                assert_eq!(level, "INFO");
                assert!(line.ends_with("warmup finished device=\"cpu\""), "{line}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            rx.try_recv().is_err(),
            "the filtered debug line is not published"
        );
    }

    #[test]
    fn a_bad_filter_is_named() {
        if std::env::var_os("RUST_LOG").is_some() {
            return; // RUST_LOG overrides the configured filter by design.
        }
        let dir = tempfile::tempdir().unwrap();
        let cfg = LoggingConfig {
            log_dir: dir.path().into(),
            stderr: StderrFormat::Off,
            filter: "=[".into(),
            bus: None,
        };
        let err = build(&cfg).err().expect("invalid filter");
        assert!(
            err.to_string().contains("invalid log filter \"=[\""),
            "{err}"
        );
    }
}
