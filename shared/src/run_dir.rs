//! What `dflashd` keeps where, outside the control socket: one contract for the daemon (which
//! writes these files) and `dflash-tui` (which reads them, also when the daemon is down). Every
//! name of a file or folder in the run dir, the state dir and the data dir is a constant here;
//! the socket's own rule is [`crate::socket_path`]. A checkpoint's own layout (its manifest and
//! tensors) is the engine's (`train/checkpoint.rs`, `train/resume.rs`).
//!
//! - **Run dir** (`--run-dir`, else `run.run_dir`, else [`StateDirs::default_run_dir`]): the
//!   journal, the recording, the metrics lines, the checkpoints, the TensorBoard event files
//!   ([`tensorboard_event_file_name`]) unless `[tensorboard] dir` puts them elsewhere, and the
//!   daemon's records of the run (lock, fingerprint, caches, warmup, healthy record, data
//!   report, effective config, unlocks).
//! - **State dir**: [`LOGS_DIR_NAME`]`/` with the daily-rolling logs
//!   (`dflashd.2026-03-14.log` and `dflashd.2026-03-14.jsonl`, see [`LOG_FILE_PREFIX`]) and a
//!   detached daemon's stdio, the last-run record, and the per-recipe healthy records.
//!
//! Where the state and data dirs are by default is [`resolve_state_dirs`], a pure function of the
//! environment, which [`default_state_dirs`] reads for both programs: the XDG base-directory rule exactly as the `directories` crate
//! applies it on Linux (which both programs used before this module existed):
//! - state dir: `$XDG_STATE_HOME/dflash`, else `<home>/.local/state/dflash`;
//! - data dir: `$XDG_DATA_HOME/dflash`, else `<home>/.local/share/dflash`;
//! - default run dir: `<data dir>/runs/default`.
//!
//! A relative or empty `XDG_*` value is ignored, as if unset (the XDG specification says so, and
//! a path must not depend on the working directory). Without a home directory there is no
//! default at all, even when both `XDG_*` variables are set: `directories` behaves so, and the
//! daemon and the console must agree.
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::socket_path::APP_DIR;

// --- In the run dir.

/// The journal, one event per line; the daemon's `run/journal.rs` appends, the console reads.
pub const JOURNAL_FILE_NAME: &str = "journal.jsonl";
/// The telemetry recording, one streamed frame per line for `dflash-tui replay`; the daemon's
/// `run/recorder.rs` writes it.
pub const RECORDING_FILE_NAME: &str = "recording.jsonl";
/// One metrics line per step unless `--metrics-jsonl` says where; the daemon's
/// `runtime/metrics_out.rs` writes it, the bench's objective tournament reads it.
pub const METRICS_FILE_NAME: &str = "metrics.jsonl";
/// The checkpoint root: the engine's trainer writes `step-*` checkpoints there, `dflashd
/// export` and the engine's `resolve_checkpoint` look there when handed a run dir.
pub const CHECKPOINTS_DIR_NAME: &str = "checkpoints";
/// The embedded default's target model, which the engine's `tiny_target` writes there unless
/// one is there, and loads.
pub const TARGET_DIR_NAME: &str = "target";
/// The one-daemon-per-run-dir lock, holding the holder's pid; the daemon's
/// `runtime/run_dir_lock.rs` takes it.
pub const LOCK_FILE_NAME: &str = "dflashd.lock";
/// The environment fingerprint taken at the first start and compared on resume; the daemon's
/// `telemetry/fingerprint.rs` writes it.
pub const FINGERPRINT_FILE_NAME: &str = "fingerprint.json";
/// The last compile and kernel cache inventory, so a change while the daemon was down shows;
/// the daemon's `telemetry/caches.rs` writes it.
pub const CACHE_INVENTORY_FILE_NAME: &str = "caches.json";
/// The warmup record, one entry per warmed device (the `dflash_warmup` cache of
/// `[telemetry] caches`); the daemon's `telemetry/warmup.rs` writes it.
pub const WARMUP_FILE_NAME: &str = "warmup.json";
/// The run's healthy record, which a resumed run is judged against; the daemon's
/// `runtime/healthy_record.rs` writes it (`health/healthy_record.rs` is its shape).
pub const HEALTHY_RECORD_FILE_NAME: &str = "healthy.json";
/// The training data's report at setup (what was read, kept and dropped); the daemon's
/// `runtime/setup.rs` writes it.
pub const DATA_REPORT_FILE_NAME: &str = "data_report.json";
/// The config the run was started with, effective values filled in, which a resume compares
/// its locked keys against; the daemon's `run/locked_keys.rs` writes it.
pub const EFFECTIVE_CONFIG_FILE_NAME: &str = "config.effective.toml";
/// Locked keys an operator unlocked for the next resume; the daemon's `run/locked_keys.rs`
/// writes it.
pub const UNLOCKS_FILE_NAME: &str = "unlocked-keys.json";
/// Unlocks an earlier resume used, which later checkpoint checks still let differ; the daemon's
/// `run/locked_keys.rs` writes it.
pub const APPLIED_UNLOCKS_FILE_NAME: &str = "applied-unlocks.json";

// --- In the state dir.

/// The last started run (`crate::last_run`), so the console finds the journal while no daemon
/// answers; the daemon's `runtime/launch.rs` writes it.
pub const LAST_RUN_FILE_NAME: &str = "last-run.json";
/// The healthy record of each recipe, `<recipe digest>.json`, which a new run dir of the same
/// recipe is judged against; the daemon's `runtime/healthy_record.rs` writes them.
pub const RECIPE_RECORDS_DIR_NAME: &str = "healthy";
/// The log directory; the daemon's `runtime/logging.rs` writes the rolling logs there.
pub const LOGS_DIR_NAME: &str = "logs";
/// A detached daemon's stdout and stderr, in the log directory; the daemon's
/// `runtime/detach.rs` redirects them there.
pub const STDIO_LOG_FILE_NAME: &str = "dflashd-stdio.out";
/// Every rolled log file's name starts with this: `dflashd.<date>.<extension>`.
pub const LOG_FILE_PREFIX: &str = "dflashd";
/// The human-readable log files end in `.log`.
pub const HUMAN_LOG_EXTENSION: &str = "log";
/// The JSON-lines log files (one `tracing` JSON object per line) end in `.jsonl`; they carry the
/// same lines as the human ones, with exact levels and times.
pub const JSON_LOG_EXTENSION: &str = "jsonl";
// --- In the data dir.

/// Under the data dir, the parent of the default run dir.
pub const RUNS_DIR_NAME: &str = "runs";
/// The default run dir's name under [`RUNS_DIR_NAME`].
pub const DEFAULT_RUN_NAME: &str = "default";

// --- TensorBoard, in the run dir unless `[tensorboard] dir` is absolute.

/// The TensorBoard event files' directory in the run dir, when `[tensorboard] dir` is not set;
/// the daemon's `runtime/tensorboard/` writes them.
pub const TENSORBOARD_DIR_NAME: &str = "tensorboard";
/// Every event file's name starts with this; TensorBoard reads only files whose name contains
/// `tfevents`.
pub const TENSORBOARD_EVENT_FILE_PREFIX: &str = "events.out.tfevents";

/// `<run dir>/journal.jsonl`.
pub fn journal_path(run_dir: &Path) -> PathBuf {
    run_dir.join(JOURNAL_FILE_NAME)
}

/// `<run dir>/recording.jsonl`.
pub fn recording_path(run_dir: &Path) -> PathBuf {
    run_dir.join(RECORDING_FILE_NAME)
}

/// Where the event files go: `configured` (`[tensorboard] dir`) under the run dir when it is
/// relative, as it is when absolute.
pub fn tensorboard_dir(run_dir: &Path, configured: &str) -> PathBuf {
    run_dir.join(configured)
}

/// `events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>`: the name TensorFlow's and
/// PyTorch's writers give their files. TensorBoard reads every file of a directory in name
/// order, so a resumed run (a later start time) appends a new file after the earlier ones; `n`
/// tells apart the files one process opens in the same second.
pub fn tensorboard_event_file_name(unix_s: u64, hostname: &str, pid: u32, n: u32) -> String {
    format!("{TENSORBOARD_EVENT_FILE_PREFIX}.{unix_s}.{hostname}.{pid}.{n}")
}

/// `<state dir>/logs`.
pub fn logs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(LOGS_DIR_NAME)
}

/// `<state dir>/last-run.json`.
pub fn last_run_path(state_dir: &Path) -> PathBuf {
    state_dir.join(LAST_RUN_FILE_NAME)
}

/// `<data dir>/runs/default`.
pub fn default_run_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(RUNS_DIR_NAME).join(DEFAULT_RUN_NAME)
}

/// The environment the default state and data dirs depend on, as the process found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdgEnv<'a> {
    /// The user's home directory: `$HOME`, or the password database's entry when `$HOME` is
    /// unset or empty (`std::env::home_dir`, as `directories::BaseDirs::home_dir` finds it).
    /// `None` when neither gives one.
    pub home: Option<&'a Path>,
    /// `$XDG_STATE_HOME`, raw.
    pub xdg_state_home: Option<&'a OsStr>,
    /// `$XDG_DATA_HOME`, raw.
    pub xdg_data_home: Option<&'a OsStr>,
}

/// The default directories of `dflashd`'s files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDirs {
    /// `$XDG_STATE_HOME/dflash` or `~/.local/state/dflash`: logs and the last-run record.
    pub state_dir: PathBuf,
    /// `<state dir>/logs`.
    pub logs_dir: PathBuf,
    /// `$XDG_DATA_HOME/dflash` or `~/.local/share/dflash`.
    pub data_dir: PathBuf,
    /// `<data dir>/runs/default`: the run dir when none is given.
    pub default_run_dir: PathBuf,
}

/// The default state and data dirs for `env`; `None` without a home directory.
pub fn resolve_state_dirs(env: &XdgEnv<'_>) -> Option<StateDirs> {
    let home = env.home.filter(|h| !h.as_os_str().is_empty())?;
    let base = |var: Option<&OsStr>, fallback: &str| {
        var.map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| home.join(fallback))
            .join(APP_DIR)
    };
    let state_dir = base(env.xdg_state_home, ".local/state");
    let data_dir = base(env.xdg_data_home, ".local/share");
    Some(StateDirs {
        logs_dir: logs_dir(&state_dir),
        default_run_dir: default_run_dir(&data_dir),
        state_dir,
        data_dir,
    })
}

/// The default state and data dirs of this process's environment: [`resolve_state_dirs`] over
/// `$HOME` (else the password database's entry: `std::env::home_dir`, which finds the home
/// exactly as `directories` does), `$XDG_STATE_HOME` and `$XDG_DATA_HOME`. The one read of these
/// variables for `dflashd` and `dflash-tui`, so the two cannot disagree on where the files are.
/// It only reads the environment. `None` without a home directory.
pub fn default_state_dirs() -> Option<StateDirs> {
    let home = std::env::home_dir();
    let (state, data) = (
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("XDG_DATA_HOME"),
    );
    resolve_state_dirs(&XdgEnv {
        home: home.as_deref(),
        xdg_state_home: state.as_deref(),
        xdg_data_home: data.as_deref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(home: Option<&'a str>, state: Option<&'a str>, data: Option<&'a str>) -> XdgEnv<'a> {
        XdgEnv {
            home: home.map(Path::new),
            xdg_state_home: state.map(OsStr::new),
            xdg_data_home: data.map(OsStr::new),
        }
    }

    #[test]
    fn tensorboard_files_go_under_the_run_dir_unless_the_dir_is_absolute() {
        let run = Path::new("/runs/a");
        assert_eq!(
            tensorboard_dir(run, TENSORBOARD_DIR_NAME),
            PathBuf::from("/runs/a/tensorboard")
        );
        assert_eq!(tensorboard_dir(run, "tb/x"), PathBuf::from("/runs/a/tb/x"));
        assert_eq!(tensorboard_dir(run, "/srv/tb"), PathBuf::from("/srv/tb"));
        assert_eq!(
            tensorboard_event_file_name(1_764_600_000, "gpu-node-7", 4242, 0),
            "events.out.tfevents.1764600000.gpu-node-7.4242.0"
        );
    }

    #[test]
    fn without_xdg_variables_everything_lives_under_home() {
        let dirs = resolve_state_dirs(&env(Some("/home/a"), None, None)).unwrap();
        assert_eq!(
            dirs,
            StateDirs {
                state_dir: "/home/a/.local/state/dflash".into(),
                logs_dir: "/home/a/.local/state/dflash/logs".into(),
                data_dir: "/home/a/.local/share/dflash".into(),
                default_run_dir: "/home/a/.local/share/dflash/runs/default".into(),
            }
        );
    }

    #[test]
    fn absolute_xdg_variables_win_each_on_its_own() {
        let both = resolve_state_dirs(&env(Some("/home/a"), Some("/st"), Some("/da"))).unwrap();
        assert_eq!(both.state_dir, PathBuf::from("/st/dflash"));
        assert_eq!(both.logs_dir, PathBuf::from("/st/dflash/logs"));
        assert_eq!(both.data_dir, PathBuf::from("/da/dflash"));
        assert_eq!(
            both.default_run_dir,
            PathBuf::from("/da/dflash/runs/default")
        );

        let state_only = resolve_state_dirs(&env(Some("/home/a"), Some("/st"), None)).unwrap();
        assert_eq!(state_only.state_dir, PathBuf::from("/st/dflash"));
        assert_eq!(
            state_only.data_dir,
            PathBuf::from("/home/a/.local/share/dflash")
        );
    }

    #[test]
    fn relative_or_empty_xdg_variables_are_ignored() {
        for value in ["", "state", "./x", "~/.local/state"] {
            let dirs = resolve_state_dirs(&env(Some("/home/a"), Some(value), Some(value))).unwrap();
            assert_eq!(
                dirs,
                resolve_state_dirs(&env(Some("/home/a"), None, None)).unwrap(),
                "{value:?}"
            );
        }
    }

    #[test]
    fn no_home_means_no_default_even_with_xdg_variables() {
        assert_eq!(
            resolve_state_dirs(&env(None, Some("/st"), Some("/da"))),
            None
        );
        assert_eq!(resolve_state_dirs(&env(Some(""), None, None)), None);
    }

    #[test]
    fn the_files_are_named_in_the_run_and_state_dirs() {
        let run = Path::new("/runs/r1");
        assert_eq!(journal_path(run), PathBuf::from("/runs/r1/journal.jsonl"));
        assert_eq!(
            recording_path(run),
            PathBuf::from("/runs/r1/recording.jsonl")
        );
        let state = Path::new("/state");
        assert_eq!(logs_dir(state), PathBuf::from("/state/logs"));
        assert_eq!(last_run_path(state), PathBuf::from("/state/last-run.json"));
        assert_eq!(
            default_run_dir(Path::new("/data")),
            PathBuf::from("/data/runs/default")
        );
    }
}
