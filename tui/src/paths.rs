//! Where `dflashd` puts its socket and its files, by default.
//!
//! - Socket: the rule the daemon listens by ([`dflash_shared::socket_path`]):
//!   `$RUNTIME_DIRECTORY/dflashd.sock` under systemd, else
//!   `$XDG_RUNTIME_DIR/dflash/dflashd.sock`, else the private 0700 directory
//!   `<tmp>/dflash-<uid>/` (servers reached over SSH often have no `XDG_RUNTIME_DIR`). This
//!   module reads the environment and checks the fallback directory before trusting it.
//! - State: `$XDG_STATE_HOME/dflash` (else `~/.local/state/dflash`), holding `logs/`.
//! - Run dir: `$XDG_DATA_HOME/dflash/runs/default` unless the daemon was given `--run-dir`;
//!   it holds `journal.jsonl` (one event per line) and `recording.jsonl`.
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use dflash_shared::last_run::{LastRun, LAST_RUN_FILE};
use dflash_shared::socket_path::{private_fallback_dir, resolve_socket, SocketEnv};
use thiserror::Error;

pub const APP_DIR: &str = dflash_shared::socket_path::APP_DIR;
pub const SOCKET_FILE: &str = dflash_shared::socket_path::SOCKET_FILE_NAME;
pub const JOURNAL_FILE: &str = "journal.jsonl";
pub const RECORDING_FILE: &str = "recording.jsonl";
pub const LOGS_DIR: &str = "logs";

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
    let (systemd, xdg) = (
        std::env::var_os("RUNTIME_DIRECTORY"),
        std::env::var_os("XDG_RUNTIME_DIR"),
    );
    resolve_socket(&SocketEnv {
        runtime_directory: systemd.as_deref(),
        xdg_runtime_dir: xdg.as_deref(),
        temp_dir: &std::env::temp_dir(),
        uid: current_uid(),
    })
    .socket
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
            logs_dir: state_dir.join(LOGS_DIR),
            run_dir: run_dir.to_path_buf(),
            journal: run_dir.join(JOURNAL_FILE),
        }
    }

    /// From `--state-dir` / `--run-dir` when given; else the run the daemon last started
    /// (recorded in the state dir), else the XDG defaults.
    pub fn resolve(state_dir: Option<&Path>, run_dir: Option<&Path>) -> Result<Self, PathError> {
        let dirs = || directories::ProjectDirs::from("", "", APP_DIR).ok_or(PathError::NoHome);
        let state_dir = match state_dir {
            Some(dir) => dir.to_path_buf(),
            None => {
                let dirs = dirs()?;
                dirs.state_dir()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| dirs.data_local_dir().join("state"))
            }
        };
        let run_dir = match run_dir {
            Some(dir) => dir.to_path_buf(),
            None => match last_run(&state_dir) {
                Some(record) => PathBuf::from(record.run_dir),
                None => dirs()?.data_dir().join("runs").join("default"),
            },
        };
        Ok(Self::new(&state_dir, &run_dir))
    }
}

/// The daemon's record of the run it last started, if there is a readable one.
pub fn last_run(state_dir: &Path) -> Option<LastRun> {
    let text = std::fs::read_to_string(state_dir.join(LAST_RUN_FILE)).ok()?;
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
            state.path().join(LAST_RUN_FILE),
            serde_json::to_string(&record).unwrap(),
        )
        .unwrap();
        let files = DaemonFiles::resolve(Some(state.path()), None).unwrap();
        assert_eq!(files.run_dir, PathBuf::from("/work/repo/runs/default"));
        // --run-dir still wins; a garbled record falls back to the default.
        let given = DaemonFiles::resolve(Some(state.path()), Some(Path::new("/r"))).unwrap();
        assert_eq!(given.run_dir, PathBuf::from("/r"));
        std::fs::write(state.path().join(LAST_RUN_FILE), "{").unwrap();
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
