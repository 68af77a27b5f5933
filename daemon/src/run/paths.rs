//! Where the daemon keeps its socket, state and logs.
//!
//! Resolution is split in two: [`PathInputs::from_environment`] reads the environment (the state
//! and data dirs through [`dflash_shared::run_dir::default_state_dirs`], the read the console
//! shares), and [`resolve`] is a pure function of those inputs, so every precedence rule is unit-tested without touching the process env.
//!
//! The socket directory follows the rule shared with `dflash-tui`
//! ([`dflash_shared::socket_path`]): `$RUNTIME_DIRECTORY`, else `$XDG_RUNTIME_DIR/dflash`, else
//! `/tmp/dflash-<uid>`. The fallback is verified (owned by us, not a symlink, mode 0700) before
//! use, because `/tmp` is shared with every other user of the machine.
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use dflash_shared::run_dir;
use dflash_shared::socket_path::{resolve_socket, RuntimeDirVars};
use thiserror::Error;

pub use dflash_shared::socket_path::SocketDirSource;
pub const SOCKET_FILE_NAME: &str = dflash_shared::socket_path::SOCKET_FILE_NAME;
/// `sockaddr_un.sun_path` holds 108 bytes on Linux, including the terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

#[derive(Debug, Error)]
pub enum PathError {
    #[error(
        "cannot determine the home directory (HOME unset?); pass --run-dir and --socket explicitly"
    )]
    NoHome,
    #[error("socket path {path} is {len} bytes; Unix sockets allow at most {max}. Pass a shorter --socket")]
    SocketPathTooLong {
        path: PathBuf,
        len: usize,
        max: usize,
    },
    #[error("{path}: {reason}")]
    UnsafeDirectory { path: PathBuf, reason: String },
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
}

/// Raw inputs to path resolution, as read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInputs {
    /// `$RUNTIME_DIRECTORY` (systemd) and `$XDG_RUNTIME_DIR`, raw.
    pub runtime_dirs: RuntimeDirVars,
    /// `$XDG_STATE_HOME/dflash` or `~/.local/state/dflash`.
    pub state_dir: PathBuf,
    /// `$XDG_DATA_HOME/dflash` or `~/.local/share/dflash`.
    pub data_dir: PathBuf,
    pub uid: u32,
    pub tmp_dir: PathBuf,
}

impl PathInputs {
    pub fn from_environment() -> Result<Self, PathError> {
        let dirs = run_dir::default_state_dirs().ok_or(PathError::NoHome)?;
        Ok(PathInputs {
            runtime_dirs: RuntimeDirVars::from_process(),
            state_dir: dirs.state_dir,
            data_dir: dirs.data_dir,
            uid: current_uid(),
            tmp_dir: std::env::temp_dir(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPaths {
    pub socket_dir: PathBuf,
    pub socket: PathBuf,
    pub socket_dir_source: SocketDirSource,
    pub state_dir: PathBuf,
    pub log_dir: PathBuf,
    pub data_dir: PathBuf,
    /// Default run directory when `--run-dir` is not given.
    pub default_run_dir: PathBuf,
}

impl DaemonPaths {
    /// A sentence for the startup log when the socket location is not the standard one.
    pub fn socket_notice(&self) -> Option<String> {
        match self.socket_dir_source {
            SocketDirSource::PrivateFallback => Some(format!(
                "XDG_RUNTIME_DIR is not set; using the private directory {} (mode 0700) for the control socket",
                self.socket_dir.display()
            )),
            _ => None,
        }
    }
}

/// Pure resolution of the daemon's paths from its inputs.
pub fn resolve(inputs: &PathInputs) -> DaemonPaths {
    let location = resolve_socket(&inputs.runtime_dirs.socket_env(&inputs.tmp_dir, inputs.uid));
    DaemonPaths {
        socket: location.socket,
        socket_dir: location.dir,
        socket_dir_source: location.source,
        log_dir: run_dir::logs_dir(&inputs.state_dir),
        default_run_dir: run_dir::default_run_dir(&inputs.data_dir),
        state_dir: inputs.state_dir.clone(),
        data_dir: inputs.data_dir.clone(),
    }
}

pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

pub fn check_socket_path_len(path: &Path) -> Result<(), PathError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(PathError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
            max: MAX_SOCKET_PATH_BYTES,
        });
    }
    Ok(())
}

/// Creates `dir` (and missing parents) and makes sure it is a private directory of ours:
/// a real directory (not a symlink), owned by the effective uid, with no group/other access.
/// An existing directory with group or other access, or owned by someone else, is refused
/// (they could swap our socket), never chmodded.
pub fn ensure_private_dir(dir: &Path) -> Result<(), PathError> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|source| PathError::Io {
            action: "creating",
            path: parent.to_path_buf(),
            cause: source,
        })?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(PathError::Io {
                action: "creating",
                path: dir.to_path_buf(),
                cause: source,
            });
        }
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|source| PathError::Io {
        action: "inspecting",
        path: dir.to_path_buf(),
        cause: source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(PathError::UnsafeDirectory {
            path: dir.to_path_buf(),
            reason: "is a symlink; refusing to put the control socket behind it".into(),
        });
    }
    if !meta.is_dir() {
        return Err(PathError::UnsafeDirectory {
            path: dir.to_path_buf(),
            reason: "exists but is not a directory".into(),
        });
    }
    let uid = current_uid();
    if meta.uid() != uid {
        return Err(PathError::UnsafeDirectory {
            path: dir.to_path_buf(),
            reason: format!("is owned by uid {}, expected our uid {uid}", meta.uid()),
        });
    }
    if meta.mode() & 0o077 != 0 {
        // Never chmod a directory someone else chose (`--socket /tmp/x.sock` would make /tmp
        // 0700): say what to do instead.
        return Err(PathError::UnsafeDirectory {
            path: dir.to_path_buf(),
            reason: format!(
                "has mode {:04o}, so other users could reach or replace the control socket in \
                 it, and dflashd never changes the mode of a directory it did not create. Put \
                 the socket in a directory of its own (a missing one is created 0700), e.g. \
                 --socket {}, or `chmod 700 {}` if the directory is yours to tighten",
                meta.mode() & 0o7777,
                dir.join("dflashd").join("dflashd.sock").display(),
                dir.display()
            ),
        });
    }
    Ok(())
}

/// Creates an ordinary directory (state, logs, run dir) if missing.
pub fn ensure_dir(dir: &Path) -> Result<(), PathError> {
    std::fs::create_dir_all(dir).map_err(|source| PathError::Io {
        action: "creating",
        path: dir.to_path_buf(),
        cause: source,
    })
}

/// A config path that could not be expanded, naming its key.
#[derive(Debug, Clone, Error)]
#[error("{key} = {value:?}: {detail}")]
pub struct ConfigPathError {
    pub key: &'static str,
    pub value: String,
    pub detail: String,
}

/// Resolves a config path: `~` and `${VAR}` expanded, relative to the config's directory.
pub fn resolve_path(
    key: &'static str,
    value: &str,
    config_path: Option<&Path>,
    run_dir: &Path,
) -> Result<PathBuf, ConfigPathError> {
    let home = std::env::var("HOME").ok();
    let run_dir_text = run_dir.display().to_string();
    let env = |k: &str| std::env::var(k).ok();
    let ctx = dflash_shared::config::PathContext {
        home: home.as_deref(),
        run_dir: Some(&run_dir_text),
        env: &env,
    };
    let expanded =
        dflash_shared::config::expand_path(value, &ctx).map_err(|e| ConfigPathError {
            key,
            value: value.into(),
            detail: e.to_string(),
        })?;
    let path = PathBuf::from(expanded);
    if path.is_absolute() {
        return Ok(path);
    }
    let base = config_path
        .and_then(Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    Ok(base.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn inputs() -> PathInputs {
        PathInputs {
            runtime_dirs: RuntimeDirVars {
                runtime_directory: None,
                xdg_runtime_dir: Some("/run/user/1000".into()),
            },
            state_dir: "/home/a/.local/state/dflash".into(),
            data_dir: "/home/a/.local/share/dflash".into(),
            uid: 1000,
            tmp_dir: "/tmp".into(),
        }
    }

    #[test]
    fn xdg_runtime_dir_holds_the_socket() {
        let p = resolve(&inputs());
        assert_eq!(
            p.socket,
            PathBuf::from("/run/user/1000/dflash/dflashd.sock")
        );
        assert_eq!(p.socket_dir_source, SocketDirSource::XdgRuntimeDir);
        assert!(p.socket_notice().is_none());
        assert_eq!(p.log_dir, PathBuf::from("/home/a/.local/state/dflash/logs"));
        assert_eq!(
            p.default_run_dir,
            PathBuf::from("/home/a/.local/share/dflash/runs/default")
        );
    }

    #[test]
    fn systemd_runtime_directory_wins() {
        let mut i = inputs();
        i.runtime_dirs.runtime_directory = Some("/run/dflash".into());
        let p = resolve(&i);
        assert_eq!(p.socket, PathBuf::from("/run/dflash/dflashd.sock"));
        assert_eq!(p.socket_dir_source, SocketDirSource::Systemd);
    }

    #[test]
    fn missing_xdg_runtime_dir_falls_back_to_a_private_tmp_dir_and_says_so() {
        let mut i = inputs();
        i.runtime_dirs.xdg_runtime_dir = None;
        let p = resolve(&i);
        assert_eq!(p.socket, PathBuf::from("/tmp/dflash-1000/dflashd.sock"));
        let notice = p.socket_notice().expect("fallback must be announced");
        assert!(notice.contains("/tmp/dflash-1000"), "{notice}");
    }

    #[test]
    fn private_dir_is_created_0700_and_a_loose_existing_one_is_refused_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sock");
        ensure_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        ensure_private_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = ensure_private_dir(&dir).unwrap_err().to_string();
        assert!(
            err.contains("has mode 1777") && err.contains("never changes"),
            "{err}"
        );
        assert!(
            err.contains(&format!("--socket {}/dflashd/dflashd.sock", dir.display())),
            "{err}"
        );
        assert_eq!(
            std::fs::metadata(&dir).unwrap().mode() & 0o7777,
            0o1777,
            "left as it was"
        );
    }

    #[test]
    fn symlinked_private_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = ensure_private_dir(&link).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }

    #[test]
    fn overlong_socket_path_is_named_in_the_error() {
        let long = PathBuf::from(format!("/tmp/{}/dflashd.sock", "x".repeat(120)));
        let err = check_socket_path_len(&long).unwrap_err();
        assert!(err.to_string().contains("at most 107"), "{err}");
        check_socket_path_len(Path::new("/run/user/1000/dflash/dflashd.sock")).unwrap();
    }
}
