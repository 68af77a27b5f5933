//! One daemon per run directory.
//!
//! The lock is an `flock(LOCK_EX)` on `<run_dir>/dflashd.lock`, held for the daemon's lifetime.
//! The kernel drops an flock when its holder dies, so a lock we can take is by definition not
//! held by a live daemon: whatever pid the file still names is stale, and we say so. The pid in
//! the file is only for messages; the flock is the truth.
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use dflash_shared::run_dir::LOCK_FILE_NAME;

#[derive(Debug, Error)]
pub enum LockError {
    #[error("another dflashd (pid {pid}) is already running on this run dir (lock {path} is held); stop it first or use another --run-dir")]
    AlreadyRunning { pid: String, path: PathBuf },
    #[error("{action} lock file {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
}

/// What we found in the lock file when we took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Takeover {
    /// No previous holder recorded (new file, or a clean shutdown emptied it).
    Fresh,
    /// The file named a pid that no longer runs: a daemon that crashed or was killed.
    StaleDeadPid(u32),
    /// The file named a live pid that does not hold the lock (pid reuse, or an unrelated
    /// process); the flock proves it is not a dflashd on this run dir.
    StaleLivePidWithoutLock(u32),
    /// The file held something that is not a pid.
    Unreadable(String),
}

impl Takeover {
    /// A sentence for the log, or `None` when there is nothing to say.
    pub fn notice(&self, path: &Path) -> Option<String> {
        match self {
            Takeover::Fresh => None,
            Takeover::StaleDeadPid(pid) => Some(format!(
                "took over stale lock {} left by pid {pid}, which is no longer running",
                path.display()
            )),
            Takeover::StaleLivePidWithoutLock(pid) => Some(format!(
                "took over lock {}: it named pid {pid}, which is alive but does not hold the lock",
                path.display()
            )),
            Takeover::Unreadable(content) => Some(format!(
                "took over lock {} whose content {content:?} is not a pid",
                path.display()
            )),
        }
    }
}

/// Holds the run-dir lock until dropped.
#[derive(Debug)]
pub struct RunDirLock {
    file: File,
    path: PathBuf,
    takeover: Takeover,
}

impl RunDirLock {
    /// Takes the lock of `run_dir` (created if missing) or explains who holds it.
    pub fn acquire(run_dir: &Path) -> Result<Self, LockError> {
        let path = run_dir.join(LOCK_FILE_NAME);
        let io_err = |action: &'static str| {
            let path = path.clone();
            move |source| LockError::Io {
                action,
                path,
                cause: source,
            }
        };
        std::fs::create_dir_all(run_dir).map_err(io_err("creating the directory of"))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_err("opening"))?;
        // SAFETY: flock on a valid, owned file descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        let mut previous = String::new();
        file.read_to_string(&mut previous)
            .map_err(io_err("reading"))?;
        let previous = previous.lines().next().unwrap_or("").trim().to_string();
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::WouldBlock {
                let pid = if previous.is_empty() {
                    "unknown".to_string()
                } else {
                    previous
                };
                return Err(LockError::AlreadyRunning { pid, path });
            }
            return Err(LockError::Io {
                action: "locking",
                path,
                cause: err,
            });
        }
        let takeover = classify_previous(&previous);
        file.set_len(0).map_err(io_err("truncating"))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err("seeking"))?;
        writeln!(file, "{}", std::process::id()).map_err(io_err("writing our pid to"))?;
        file.sync_data().map_err(io_err("syncing"))?;
        Ok(RunDirLock {
            file,
            path,
            takeover,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn takeover(&self) -> &Takeover {
        &self.takeover
    }
}

impl Drop for RunDirLock {
    fn drop(&mut self) {
        // Empty the pid on a clean exit so the next start has no stale pid to report. The
        // file itself stays: unlinking a lock file races with a concurrent opener.
        let _ = self.file.set_len(0);
    }
}

fn classify_previous(previous: &str) -> Takeover {
    if previous.is_empty() {
        return Takeover::Fresh;
    }
    match previous.parse::<u32>() {
        Ok(pid) if pid == std::process::id() => Takeover::Fresh,
        Ok(pid) if pid_is_alive(pid) => Takeover::StaleLivePidWithoutLock(pid),
        Ok(pid) => Takeover::StaleDeadPid(pid),
        Err(_) => Takeover::Unreadable(previous.chars().take(40).collect()),
    }
}

pub fn pid_is_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks existence and permission; it sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_the_same_run_dir_names_the_live_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunDirLock::acquire(dir.path()).unwrap();
        assert_eq!(first.takeover(), &Takeover::Fresh);
        let err = RunDirLock::acquire(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("already running"), "{msg}");
        drop(first);
        acquire_after_drop(dir.path());
    }

    /// Another test spawning a child at the moment we drop a lock briefly shares our
    /// (close-on-exec) descriptor between its fork and exec, which keeps the flock held for
    /// that window; retry instead of failing on it.
    fn acquire_after_drop(dir: &Path) -> RunDirLock {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match RunDirLock::acquire(dir) {
                Ok(lock) => return lock,
                Err(e) => assert!(
                    std::time::Instant::now() < deadline,
                    "lock still held after drop: {e}"
                ),
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn stale_lock_from_a_dead_pid_is_taken_over_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE_NAME), format!("{dead_pid}\n")).unwrap();
        let lock = RunDirLock::acquire(dir.path()).unwrap();
        assert_eq!(lock.takeover(), &Takeover::StaleDeadPid(dead_pid));
        let notice = lock.takeover().notice(lock.path()).unwrap();
        assert!(notice.contains(&dead_pid.to_string()) && notice.contains("no longer running"));
        let content = std::fs::read_to_string(lock.path()).unwrap();
        assert_eq!(content.trim(), std::process::id().to_string());
    }

    #[test]
    fn live_pid_without_the_flock_is_not_mistaken_for_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        // pid 1 is always alive and never holds our flock.
        std::fs::write(dir.path().join(LOCK_FILE_NAME), "1\n").unwrap();
        let lock = RunDirLock::acquire(dir.path()).unwrap();
        assert_eq!(lock.takeover(), &Takeover::StaleLivePidWithoutLock(1));
    }

    #[test]
    fn clean_drop_leaves_no_stale_pid() {
        let dir = tempfile::tempdir().unwrap();
        drop(RunDirLock::acquire(dir.path()).unwrap());
        let again = acquire_after_drop(dir.path());
        assert_eq!(again.takeover(), &Takeover::Fresh);
    }
}
