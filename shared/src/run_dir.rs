//! What `dflashd` keeps where, outside the control socket: one contract for the daemon (which
//! writes these files) and `dflash-tui` (which reads them, also when the daemon is down). The
//! socket's own rule is [`crate::socket_path`].
//!
//! - **Run dir** (`--run-dir`, else `run.run_dir`, else [`StateDirs::default_run_dir`]):
//!   [`JOURNAL_FILE_NAME`] (one event per line) and [`RECORDING_FILE_NAME`] (one recorded frame
//!   per line, for `dflash-tui replay`), and [`TENSORBOARD_DIR_NAME`]`/` with the TensorBoard
//!   event files ([`tensorboard_event_file_name`]) unless `[tensorboard] dir` puts them elsewhere.
//! - **State dir**: [`LOGS_DIR_NAME`]`/` with the daily-rolling logs
//!   (`dflashd.2026-03-14.log` and `dflashd.2026-03-14.jsonl`, see [`LOG_FILE_PREFIX`]) and the
//!   last-run record ([`crate::last_run::LAST_RUN_FILE`]).
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

use crate::last_run::LAST_RUN_FILE;
use crate::socket_path::APP_DIR;

/// The journal, in the run dir.
pub const JOURNAL_FILE_NAME: &str = "journal.jsonl";
/// The telemetry recording, in the run dir.
pub const RECORDING_FILE_NAME: &str = "recording.jsonl";
/// The log directory, in the state dir.
pub const LOGS_DIR_NAME: &str = "logs";
/// Every rolled log file's name starts with this: `dflashd.<date>.<extension>`.
pub const LOG_FILE_PREFIX: &str = "dflashd";
/// The human-readable log files end in `.log`.
pub const HUMAN_LOG_EXTENSION: &str = "log";
/// The JSON-lines log files (one `tracing` JSON object per line) end in `.jsonl`; they carry the
/// same lines as the human ones, with exact levels and times.
pub const JSON_LOG_EXTENSION: &str = "jsonl";
/// Under the data dir, the parent of the default run dir.
pub const RUNS_DIR_NAME: &str = "runs";
/// The default run dir's name under [`RUNS_DIR_NAME`].
pub const DEFAULT_RUN_NAME: &str = "default";

/// The TensorBoard event files' directory in the run dir, when `[tensorboard] dir` is not set.
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
    state_dir.join(LAST_RUN_FILE)
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
