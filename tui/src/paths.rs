//! Where `dflashd` puts its socket and its files, by default. The daemon resolves the same
//! rule (its `runtime::paths`); this copy is small on purpose so the two can be compared line
//! by line.
//!
//! - Socket: `$RUNTIME_DIRECTORY/dflashd.sock` under systemd, else
//!   `$XDG_RUNTIME_DIR/dflash/dflashd.sock`, else the private 0700 directory
//!   `<tmp>/dflash-<uid>/` (servers reached over SSH often have no `XDG_RUNTIME_DIR`).
//! - State: `$XDG_STATE_HOME/dflash` (else `~/.local/state/dflash`), holding `logs/`.
//! - Run dir: `$XDG_DATA_HOME/dflash/runs/default` unless the daemon was given `--run-dir`;
//!   it holds `journal.jsonl` (one event per line) and `recording.jsonl`.
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

pub const APP_DIR: &str = "dflash";
pub const SOCKET_FILE: &str = "dflashd.sock";
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

/// What the socket location depends on, read from the environment by [`default_socket_path`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketInputs<'a> {
    /// `$RUNTIME_DIRECTORY` (systemd `RuntimeDirectory=`), first entry.
    pub systemd_runtime_dir: Option<&'a Path>,
    /// `$XDG_RUNTIME_DIR`.
    pub xdg_runtime_dir: Option<&'a Path>,
    pub temp_dir: &'a Path,
    pub uid: u32,
}

/// The socket path from its inputs; pure so the rule is testable without touching the env.
pub fn socket_path_from(inputs: &SocketInputs) -> PathBuf {
    let absolute = |p: Option<&Path>| p.filter(|p| p.is_absolute()).map(Path::to_path_buf);
    let dir = absolute(inputs.systemd_runtime_dir)
        .or_else(|| absolute(inputs.xdg_runtime_dir).map(|d| d.join(APP_DIR)))
        .unwrap_or_else(|| private_fallback_dir(inputs.temp_dir, inputs.uid));
    dir.join(SOCKET_FILE)
}

/// `<tmp>/dflash-<uid>`: the per-user directory used when there is no runtime dir.
pub fn private_fallback_dir(temp_dir: &Path, uid: u32) -> PathBuf {
    temp_dir.join(format!("{APP_DIR}-{uid}"))
}

/// The socket the daemon listens on unless told otherwise.
pub fn default_socket_path() -> PathBuf {
    let systemd = std::env::var_os("RUNTIME_DIRECTORY").and_then(|v| {
        v.to_str()
            .and_then(|s| s.split(':').next())
            .map(PathBuf::from)
    });
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    socket_path_from(&SocketInputs {
        systemd_runtime_dir: systemd.as_deref(),
        xdg_runtime_dir: xdg.as_deref(),
        temp_dir: &std::env::temp_dir(),
        uid: current_uid(),
    })
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

    /// From `--state-dir` / `--run-dir` when given, else the XDG defaults.
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
            None => dirs()?.data_dir().join("runs").join("default"),
        };
        Ok(Self::new(&state_dir, &run_dir))
    }
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

    fn inputs<'a>(systemd: Option<&'a Path>, xdg: Option<&'a Path>) -> SocketInputs<'a> {
        SocketInputs {
            systemd_runtime_dir: systemd,
            xdg_runtime_dir: xdg,
            temp_dir: Path::new("/tmp"),
            uid: 1234,
        }
    }

    #[test]
    fn systemd_then_xdg_then_a_private_temp_dir() {
        let run = Path::new("/run/dflash");
        let xdg = Path::new("/run/user/1234");
        assert_eq!(
            socket_path_from(&inputs(Some(run), Some(xdg))),
            PathBuf::from("/run/dflash/dflashd.sock")
        );
        assert_eq!(
            socket_path_from(&inputs(None, Some(xdg))),
            PathBuf::from("/run/user/1234/dflash/dflashd.sock")
        );
        let fallback = PathBuf::from("/tmp/dflash-1234/dflashd.sock");
        assert_eq!(socket_path_from(&inputs(None, None)), fallback);
        assert_eq!(
            socket_path_from(&inputs(None, Some(Path::new("rel")))),
            fallback
        );
    }

    #[test]
    fn the_journal_lives_in_the_run_dir_and_logs_in_the_state_dir() {
        let files = DaemonFiles::new(Path::new("/state"), Path::new("/runs/r1"));
        assert_eq!(files.journal, PathBuf::from("/runs/r1/journal.jsonl"));
        assert_eq!(files.logs_dir, PathBuf::from("/state/logs"));
        let given = DaemonFiles::resolve(Some(Path::new("/s")), Some(Path::new("/r"))).unwrap();
        assert_eq!(given, DaemonFiles::new(Path::new("/s"), Path::new("/r")));
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
