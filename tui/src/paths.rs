//! Where `dflashd` puts its socket and its files, by default. `dflashd` follows the same rule;
//! keep the two in step (this module is small on purpose so it can be copied or moved verbatim).
//!
//! - Socket: `$XDG_RUNTIME_DIR/dflash/dflashd.sock`. When `XDG_RUNTIME_DIR` is unset (common on
//!   servers) the daemon falls back to a private 0700 directory `<tmp>/dflash-<uid>/`.
//! - State: `$XDG_STATE_HOME/dflash` (else `~/.local/state/dflash`): the journal
//!   `journal.jsonl` and the rolling logs under `logs/`.
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

pub const APP_DIR: &str = "dflash";
pub const SOCKET_FILE: &str = "dflashd.sock";
pub const JOURNAL_FILE: &str = "journal.jsonl";
pub const LOGS_DIR: &str = "logs";

#[derive(Debug, Error)]
pub enum PathError {
    #[error("cannot find a home directory to place the dflash state dir; pass --state-dir")]
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

/// The socket path from its inputs; pure so the rule is testable without touching the environment.
pub fn socket_path_from(xdg_runtime_dir: Option<&Path>, temp_dir: &Path, uid: u32) -> PathBuf {
    match xdg_runtime_dir.filter(|p| p.is_absolute()) {
        Some(runtime) => runtime.join(APP_DIR).join(SOCKET_FILE),
        None => private_fallback_dir(temp_dir, uid).join(SOCKET_FILE),
    }
}

/// `<tmp>/dflash-<uid>`: the per-user directory used when there is no XDG runtime dir.
pub fn private_fallback_dir(temp_dir: &Path, uid: u32) -> PathBuf {
    temp_dir.join(format!("{APP_DIR}-{uid}"))
}

/// The socket the daemon listens on unless told otherwise.
pub fn default_socket_path() -> PathBuf {
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    socket_path_from(runtime.as_deref(), &std::env::temp_dir(), current_uid())
}

/// `$XDG_STATE_HOME/dflash` (or `~/.local/state/dflash`).
pub fn default_state_dir() -> Result<PathBuf, PathError> {
    let dirs = directories::ProjectDirs::from("", "", APP_DIR).ok_or(PathError::NoHome)?;
    Ok(dirs
        .state_dir()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dirs.data_local_dir().to_path_buf()))
}

/// The daemon's durable files inside a state dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateFiles {
    pub state_dir: PathBuf,
    pub journal: PathBuf,
    pub logs_dir: PathBuf,
}

impl StateFiles {
    pub fn in_dir(state_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            journal: state_dir.join(JOURNAL_FILE),
            logs_dir: state_dir.join(LOGS_DIR),
        }
    }

    /// From `--state-dir` when given, else the XDG default.
    pub fn resolve(state_dir: Option<&Path>) -> Result<Self, PathError> {
        match state_dir {
            Some(dir) => Ok(Self::in_dir(dir)),
            None => Ok(Self::in_dir(&default_state_dir()?)),
        }
    }
}

pub fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Before trusting a socket found in the shared temp dir, check that its directory is ours and
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
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o777;
    if meta.uid() != uid || mode & 0o077 != 0 {
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
    fn socket_lives_under_the_xdg_runtime_dir_when_set() {
        let path = socket_path_from(Some(Path::new("/run/user/1000")), Path::new("/tmp"), 1000);
        assert_eq!(path, PathBuf::from("/run/user/1000/dflash/dflashd.sock"));
    }

    #[test]
    fn socket_falls_back_to_a_per_uid_dir_when_runtime_dir_is_unset_or_relative() {
        let expected = PathBuf::from("/tmp/dflash-1234/dflashd.sock");
        assert_eq!(socket_path_from(None, Path::new("/tmp"), 1234), expected);
        assert_eq!(socket_path_from(Some(Path::new("rel/dir")), Path::new("/tmp"), 1234), expected);
    }

    #[test]
    fn state_files_sit_inside_the_state_dir() {
        let files = StateFiles::in_dir(Path::new("/var/lib/x"));
        assert_eq!(files.journal, PathBuf::from("/var/lib/x/journal.jsonl"));
        assert_eq!(files.logs_dir, PathBuf::from("/var/lib/x/logs"));
    }

    #[test]
    fn a_private_dir_passes_and_an_open_or_foreign_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dflash-x");
        assert!(check_private_dir(&dir, current_uid()).is_ok(), "missing dir passes");
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
            Err(PathError::UnsafeSocketDir { found_mode: 0o755, .. })
        ));
    }
}
