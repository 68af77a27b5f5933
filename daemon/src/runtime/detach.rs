//! `dflashd start --detach`: the classic double fork, with a readiness pipe.
//!
//! The command forks; the child starts a new session (no controlling terminal) and forks
//! again so the daemon can never reacquire one; the grandchild points stdin at `/dev/null` and
//! stdout/stderr at a log file, and becomes the daemon. The original process waits on a pipe
//! until the daemon says it is ready (its socket accepts connections and training started)
//! or why it is not, prints that, and exits with the daemon's verdict. A daemon that dies
//! before saying anything closes the pipe, and the command says where to look.
//!
//! Must be called while the process has a single thread: before the async runtime, logging
//! or libtorch start any.
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What the command that started the daemon should do.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Exit code of `dflashd start --detach`.
    pub code: u8,
    /// Printed to stdout on success, stderr otherwise.
    pub text: String,
}

pub enum Detached {
    /// This process started the daemon; print the verdict and exit with it.
    Starter(Verdict),
    /// This process is the daemon; report readiness through the handle.
    Daemon(Readiness),
}

/// The daemon's end of the readiness pipe. The first report wins; later ones are ignored.
#[derive(Debug, Default)]
pub struct Readiness {
    pipe: Option<File>,
}

const READY: &str = "ready";

impl Readiness {
    /// A foreground daemon: nobody waits, reports go nowhere.
    pub fn foreground() -> Self {
        Readiness { pipe: None }
    }

    pub fn is_detached(&self) -> bool {
        self.pipe.is_some()
    }

    /// Started: the starter prints `text` and exits 0.
    pub fn ready(&mut self, text: &str) {
        self.send(&format!("{READY}\n{text}"));
    }

    /// Not started: the starter prints `text` to stderr and exits with `code`.
    pub fn failed(&mut self, code: u8, text: &str) {
        self.send(&format!("exit {code}\n{text}"));
    }

    fn send(&mut self, message: &str) {
        if let Some(mut pipe) = self.pipe.take() {
            // The starter may have been killed; the daemon goes on regardless.
            let _ = pipe.write_all(message.as_bytes());
        }
    }
}

/// Parses what the daemon wrote on the pipe (empty: it died before reporting).
pub fn parse_verdict(message: &str, stdio_log: &Path) -> Verdict {
    let (head, text) = message.split_once('\n').unwrap_or((message, ""));
    if head == READY {
        return Verdict {
            code: 0,
            text: text.to_string(),
        };
    }
    if let Some(code) = head
        .strip_prefix("exit ")
        .and_then(|c| c.parse::<u8>().ok())
    {
        return Verdict {
            code: code.max(1),
            text: text.to_string(),
        };
    }
    Verdict {
        code: 1,
        text: format!(
            "dflashd exited during startup without saying why; its output is in {}",
            stdio_log.display()
        ),
    }
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Forks the daemon off. `stdio_log` receives the daemon's stdout and stderr (appended).
pub fn detach(stdio_log: &Path) -> io::Result<Detached> {
    if let Some(dir) = stdio_log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Opened before forking so a bad path is reported by the command, not lost.
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(stdio_log)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", stdio_log.display())))?;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid out-array of two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_err("creating the readiness pipe"));
    }
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is single-threaded here (documented precondition), so the child
    // may go on running Rust code after fork.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(os_err("fork"));
    }
    if child > 0 {
        drop(write_end);
        let mut status = 0;
        // SAFETY: reaping our own child; it exits right after its second fork.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let mut message = String::new();
        let _ = File::from(read_end).read_to_string(&mut message);
        return Ok(Detached::Starter(parse_verdict(&message, stdio_log)));
    }
    drop(read_end);
    // SAFETY: plain syscalls in the (single-threaded) child.
    unsafe {
        if libc::setsid() < 0 {
            libc::_exit(1);
        }
        match libc::fork() {
            0 => {}
            pid if pid > 0 => libc::_exit(0),
            _ => libc::_exit(1),
        }
    }
    redirect_stdio(&log)?;
    Ok(Detached::Daemon(Readiness {
        pipe: Some(File::from(write_end)),
    }))
}

fn redirect_stdio(log: &File) -> io::Result<()> {
    let null = File::open("/dev/null")?;
    // SAFETY: dup2 onto the standard descriptors of this process.
    unsafe {
        if libc::dup2(null.as_raw_fd(), 0) < 0
            || libc::dup2(log.as_raw_fd(), 1) < 0
            || libc::dup2(log.as_raw_fd(), 2) < 0
        {
            return Err(os_err("redirecting stdio"));
        }
    }
    Ok(())
}

/// Where a detached daemon's stdout/stderr go: next to the tracing logs.
pub fn stdio_log_path(log_dir: &Path) -> PathBuf {
    log_dir.join(dflash_shared::run_dir::STDIO_LOG_FILE_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_parse_and_silence_means_failure() {
        let log = Path::new("/s/logs/dflashd-stdio.out");
        assert_eq!(
            parse_verdict("ready\npid 7\nsocket /s", log),
            Verdict {
                code: 0,
                text: "pid 7\nsocket /s".into()
            }
        );
        assert_eq!(parse_verdict("exit 3\ndrift", log).code, 3);
        assert_eq!(
            parse_verdict("exit 0\nodd", log).code,
            1,
            "a failure never exits 0"
        );
        let silent = parse_verdict("", log);
        assert_eq!(silent.code, 1);
        assert!(
            silent.text.contains("/s/logs/dflashd-stdio.out"),
            "{}",
            silent.text
        );
    }
}
