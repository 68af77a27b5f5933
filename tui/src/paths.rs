//! Where `dflashd` puts its socket and its files, by default.
//!
//! - Socket: the rule the daemon listens by ([`dflash_shared::socket_path`]):
//!   `$RUNTIME_DIRECTORY/dflashd.sock` under systemd, else
//!   `$XDG_RUNTIME_DIR/dflash/dflashd.sock`, else the private 0700 directory
//!   `<tmp>/dflash-<uid>/` (servers reached over SSH often have no `XDG_RUNTIME_DIR`). This
//!   module reads the environment and checks the fallback directory before trusting it.
//! - State dir, run dir and the files in them: the contract in [`dflash_shared::run_dir`]
//!   (`$XDG_STATE_HOME/dflash` holding `logs/` and the last-run record;
//!   `$XDG_DATA_HOME/dflash/runs/default` unless the daemon was given `--run-dir`, holding
//!   `journal.jsonl` and `recording.jsonl`). This module reads the environment for it.
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use dflash_shared::last_run::LastRun;
use dflash_shared::run_dir::{self, StateDirs};
use dflash_shared::socket_path::{private_fallback_dir, resolve_socket, RuntimeDirVars};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PathError {
    #[error(
        "cannot find a home directory for the dflash state dir; pass --state-dir and --run-dir"
    )]
    NoHome,
    #[error(
        "refusing socket directory {dir}: it must be owned by uid {expected_uid} with mode 0700, \
         found uid {found_uid} mode {found_mode:o}; another user could impersonate the daemon"
    )]
    UnsafeSocketDir {
        dir: PathBuf,
        expected_uid: u32,
        found_uid: u32,
        found_mode: u32,
    },
}

/// The socket the daemon listens on unless told otherwise.
pub fn default_socket_path() -> PathBuf {
    let vars = RuntimeDirVars::from_process();
    resolve_socket(&vars.socket_env(&std::env::temp_dir(), current_uid())).socket
}

/// The daemon's files that the console reads when the daemon is down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonFiles {
    pub state_dir: PathBuf,
    pub logs_dir: PathBuf,
    pub run_dir: PathBuf,
    pub journal: PathBuf,
}

impl DaemonFiles {
    pub fn new(state_dir: &Path, run_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            logs_dir: run_dir::logs_dir(state_dir),
            run_dir: run_dir.to_path_buf(),
            journal: run_dir::journal_path(run_dir),
        }
    }

    /// From `--state-dir` / `--run-dir` when given; else the run the daemon last started
    /// (recorded in the state dir), else the XDG defaults. The environment is read only for
    /// what was not given.
    pub fn resolve(state_dir: Option<&Path>, run_dir: Option<&Path>) -> Result<Self, PathError> {
        let state_dir = match state_dir {
            Some(dir) => dir.to_path_buf(),
            None => default_dirs()?.state_dir,
        };
        let run_dir = match run_dir {
            Some(dir) => dir.to_path_buf(),
            None => match last_run(&state_dir) {
                Some(record) => PathBuf::from(record.run_dir),
                None => default_dirs()?.default_run_dir,
            },
        };
        Ok(Self::new(&state_dir, &run_dir))
    }
}

/// The daemon's default directories for this process's environment
/// ([`dflash_shared::run_dir::default_state_dirs`], the read the daemon makes too).
pub fn default_dirs() -> Result<StateDirs, PathError> {
    run_dir::default_state_dirs().ok_or(PathError::NoHome)
}

/// The daemon's record of the run it last started, if there is a readable one.
pub fn last_run(state_dir: &Path) -> Option<LastRun> {
    let text = std::fs::read_to_string(run_dir::last_run_path(state_dir)).ok()?;
    LastRun::parse(&text)
}

pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Before trusting a socket in the shared temp dir, check that its directory is ours and
/// private: otherwise another local user could have created it and be listening there.
pub fn check_fallback_socket_dir(socket: &Path) -> Result<(), PathError> {
    let fallback = private_fallback_dir(&std::env::temp_dir(), current_uid());
    match socket.parent() {
        Some(dir) if dir == fallback => check_private_dir(dir, current_uid()),
        _ => Ok(()),
    }
}

/// `dir` must belong to `uid` and be closed to group and others. A missing dir passes: the
/// connect attempt then reports "no daemon" with the path.
pub fn check_private_dir(dir: &Path, uid: u32) -> Result<(), PathError> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o777;
    if meta.uid() != uid || mode & 0o077 != 0 || meta.file_type().is_symlink() {
        return Err(PathError::UnsafeSocketDir {
            dir: dir.to_path_buf(),
            expected_uid: uid,
            found_uid: meta.uid(),
            found_mode: mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_lives_in_the_run_dir_and_logs_in_the_state_dir() {
        let files = DaemonFiles::new(Path::new("/state"), Path::new("/runs/r1"));
        assert_eq!(files.journal, PathBuf::from("/runs/r1/journal.jsonl"));
        assert_eq!(files.logs_dir, PathBuf::from("/state/logs"));
        let given = DaemonFiles::resolve(Some(Path::new("/s")), Some(Path::new("/r"))).unwrap();
        assert_eq!(given, DaemonFiles::new(Path::new("/s"), Path::new("/r")));
    }

    #[test]
    fn the_shared_rule_gives_what_the_directories_crate_gives_in_this_environment() {
        // What `dflashd` (`PathInputs::from_environment`) and this console computed before the
        // rule moved to `dflash_shared::run_dir`.
        let dirs = directories::ProjectDirs::from("", "", dflash_shared::socket_path::APP_DIR)
            .expect("tests run with a home directory");
        let state_dir = dirs
            .state_dir()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| dirs.data_local_dir().join("state"));
        let shared = default_dirs().unwrap();
        assert_eq!(shared.state_dir, state_dir);
        assert_eq!(shared.logs_dir, state_dir.join("logs"));
        assert_eq!(shared.data_dir, dirs.data_dir());
        assert_eq!(
            shared.default_run_dir,
            dirs.data_dir().join("runs").join("default")
        );
    }

    #[test]
    fn without_run_dir_the_daemons_last_run_is_used() {
        let state = tempfile::tempdir().unwrap();
        let record = LastRun {
            run_name: "tiny-cpu".into(),
            run_dir: "/work/repo/runs/default".into(),
            socket: "/tmp/dflash-0/dflashd.sock".into(),
            pid: 7,
            started_ms: 0,
        };
        std::fs::write(
            run_dir::last_run_path(state.path()),
            serde_json::to_string(&record).unwrap(),
        )
        .unwrap();
        let files = DaemonFiles::resolve(Some(state.path()), None).unwrap();
        assert_eq!(files.run_dir, PathBuf::from("/work/repo/runs/default"));
        // --run-dir still wins; a garbled record falls back to the default.
        let given = DaemonFiles::resolve(Some(state.path()), Some(Path::new("/r"))).unwrap();
        assert_eq!(given.run_dir, PathBuf::from("/r"));
        std::fs::write(run_dir::last_run_path(state.path()), "{").unwrap();
        let files = DaemonFiles::resolve(Some(state.path()), None).unwrap();
        assert!(files.run_dir.ends_with("runs/default"), "{files:?}");
        assert_ne!(files.run_dir, PathBuf::from("/work/repo/runs/default"));
    }

    #[test]
    fn a_private_dir_passes_and_an_open_or_foreign_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dflash-x");
        assert!(
            check_private_dir(&dir, current_uid()).is_ok(),
            "missing dir passes"
        );
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(check_private_dir(&dir, current_uid()).is_ok());
        assert!(matches!(
            check_private_dir(&dir, current_uid().wrapping_add(1)),
            Err(PathError::UnsafeSocketDir { .. })
        ));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            check_private_dir(&dir, current_uid()),
            Err(PathError::UnsafeSocketDir {
                found_mode: 0o755,
                ..
            })
        ));
    }
}
