//! Where the daemon's control socket lives by default: one rule for `dflashd` (which listens
//! there) and `dflash-tui` (which connects there). Pure: the callers read the environment and
//! create or check directories; this only decides.
//!
//! Precedence:
//! 1. `$RUNTIME_DIRECTORY` (systemd, for a unit with `RuntimeDirectory=dflash`; when systemd
//!    lists several directories separated by `:`, ours is the first);
//! 2. `$XDG_RUNTIME_DIR/dflash`;
//! 3. `<temp dir>/dflash-<uid>`: servers reached over SSH often have no `XDG_RUNTIME_DIR`. The
//!    temp dir is shared with every user, so callers must verify this directory (ours, not a
//!    symlink, mode 0700) before trusting it.
//!
//! A relative or empty value is ignored, as if unset: a socket path must not depend on the
//! working directory.
//!
//! [`RuntimeDirVars::from_process`] is the one place either binary reads the two variables (a
//! small environment read, like `run_dir::default_state_dirs`'s, for a default both share).
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

pub const APP_DIR: &str = "dflash";
pub const SOCKET_FILE_NAME: &str = "dflashd.sock";

/// The environment the socket location depends on, as the process found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketEnv<'a> {
    /// `$RUNTIME_DIRECTORY`, raw.
    pub runtime_directory: Option<&'a OsStr>,
    /// `$XDG_RUNTIME_DIR`, raw.
    pub xdg_runtime_dir: Option<&'a OsStr>,
    /// The process temp dir (`std::env::temp_dir()`).
    pub temp_dir: &'a Path,
    /// The effective uid.
    pub uid: u32,
}

/// The two variables the rule reads, as this process found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeDirVars {
    /// `$RUNTIME_DIRECTORY`, raw.
    pub runtime_directory: Option<OsString>,
    /// `$XDG_RUNTIME_DIR`, raw.
    pub xdg_runtime_dir: Option<OsString>,
}

impl RuntimeDirVars {
    /// Read from the process environment.
    pub fn from_process() -> Self {
        RuntimeDirVars {
            runtime_directory: std::env::var_os("RUNTIME_DIRECTORY"),
            xdg_runtime_dir: std::env::var_os("XDG_RUNTIME_DIR"),
        }
    }

    /// The rule's input for these variables, the temp dir and the effective uid.
    pub fn socket_env<'a>(&'a self, temp_dir: &'a Path, uid: u32) -> SocketEnv<'a> {
        SocketEnv {
            runtime_directory: self.runtime_directory.as_deref(),
            xdg_runtime_dir: self.xdg_runtime_dir.as_deref(),
            temp_dir,
            uid,
        }
    }
}

/// Which rule chose the socket directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketDirSource {
    Systemd,
    XdgRuntimeDir,
    /// No runtime dir was set; a per-user directory under the shared temp dir.
    PrivateFallback,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketLocation {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub source: SocketDirSource,
}

impl SocketLocation {
    /// Whether the directory is the temp-dir fallback, which must be verified before use and
    /// announced to the operator.
    pub fn is_fallback(&self) -> bool {
        self.source == SocketDirSource::PrivateFallback
    }
}

/// The default socket location for `env`.
pub fn resolve_socket(env: &SocketEnv<'_>) -> SocketLocation {
    let systemd = env
        .runtime_directory
        .and_then(OsStr::to_str)
        .and_then(|list| list.split(':').next())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let xdg = env
        .xdg_runtime_dir
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let (dir, source) = match (systemd, xdg) {
        (Some(dir), _) => (dir, SocketDirSource::Systemd),
        (None, Some(xdg)) => (xdg.join(APP_DIR), SocketDirSource::XdgRuntimeDir),
        (None, None) => (
            private_fallback_dir(env.temp_dir, env.uid),
            SocketDirSource::PrivateFallback,
        ),
    };
    SocketLocation {
        socket: dir.join(SOCKET_FILE_NAME),
        dir,
        source,
    }
}

/// `<temp dir>/dflash-<uid>`.
pub fn private_fallback_dir(temp_dir: &Path, uid: u32) -> PathBuf {
    temp_dir.join(format!("{APP_DIR}-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(systemd: Option<&'a str>, xdg: Option<&'a str>) -> SocketEnv<'a> {
        SocketEnv {
            runtime_directory: systemd.map(OsStr::new),
            xdg_runtime_dir: xdg.map(OsStr::new),
            temp_dir: Path::new("/tmp"),
            uid: 1234,
        }
    }

    #[test]
    fn systemd_then_xdg_then_a_private_temp_dir() {
        let run = resolve_socket(&env(Some("/run/dflash"), Some("/run/user/1234")));
        assert_eq!(run.socket, PathBuf::from("/run/dflash/dflashd.sock"));
        assert_eq!(
            (run.source, run.is_fallback()),
            (SocketDirSource::Systemd, false)
        );

        let xdg = resolve_socket(&env(None, Some("/run/user/1234")));
        assert_eq!(xdg.dir, PathBuf::from("/run/user/1234/dflash"));
        assert_eq!(
            xdg.socket,
            PathBuf::from("/run/user/1234/dflash/dflashd.sock")
        );
        assert_eq!(xdg.source, SocketDirSource::XdgRuntimeDir);

        let fallback = resolve_socket(&env(None, None));
        assert_eq!(fallback.dir, PathBuf::from("/tmp/dflash-1234"));
        assert_eq!(
            fallback.socket,
            PathBuf::from("/tmp/dflash-1234/dflashd.sock")
        );
        assert!(fallback.is_fallback());
    }

    #[test]
    fn systemd_lists_take_the_first_and_relative_or_empty_values_are_ignored() {
        let listed = resolve_socket(&env(Some("/run/dflash:/run/other"), None));
        assert_eq!(listed.dir, PathBuf::from("/run/dflash"));
        for (systemd, xdg) in [
            (Some("dflash"), None),
            (None, Some("rel")),
            (Some(""), Some("")),
        ] {
            assert!(
                resolve_socket(&env(systemd, xdg)).is_fallback(),
                "{systemd:?} {xdg:?}"
            );
        }
        let relative_systemd = resolve_socket(&env(Some("rel"), Some("/run/user/1")));
        assert_eq!(relative_systemd.source, SocketDirSource::XdgRuntimeDir);
    }
}
