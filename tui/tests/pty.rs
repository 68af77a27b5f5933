//! The interactive commands in a real pseudo-terminal (openpty), against the test harness:
//! `attach` draws the live console, survives a resize, and leaves the terminal as it found it
//! on `q` and on SIGTERM; `confirm-stop` confirms only after the run name is typed. The same
//! checks against a real `dflashd` wait for the daemon's control plane.
mod support;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::protocol::{Request, Response};
use support::incident;
use support::test_daemon::{Script, TestDaemon};

const BIN: &str = env!("CARGO_BIN_EXE_dflash-tui");

/// A child process whose stdin, stdout and stderr are the slave side of a pty.
struct InPty {
    child: Child,
    master: OwnedFd,
    slave: OwnedFd,
    output: Arc<Mutex<Vec<u8>>>,
    /// The terminal modes before the child started.
    initial: libc::termios,
}

fn open_pty(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave): (RawFd, RawFd) = (-1, -1);
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: out-pointers are valid; name and termios may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two fresh descriptors we now own.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

fn termios_of(fd: &OwnedFd) -> libc::termios {
    // SAFETY: zeroed termios is a valid out-buffer for tcgetattr.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
    t
}

impl InPty {
    fn spawn(args: &[&str]) -> Self {
        let (master, slave) = open_pty(32, 110);
        let initial = termios_of(&slave);
        let tty = File::from(slave.try_clone().unwrap());
        // SAFETY: only async-signal-safe calls (setsid, ioctl) between fork and exec.
        let child = unsafe {
            Command::new(BIN)
                .args(args)
                .env("TERM", "xterm-256color")
                .env("NO_COLOR", "1")
                .env("TZ", "UTC")
                .stdin(Stdio::from(tty.try_clone().unwrap()))
                .stdout(Stdio::from(tty.try_clone().unwrap()))
                .stderr(Stdio::from(tty))
                .pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
                .spawn()
                .expect("spawn in a pty")
        };
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut reader = File::from(master.try_clone().unwrap());
        let sink = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self {
            child,
            master,
            slave,
            output,
            initial,
        }
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.screen().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "never saw {needle:?} in:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn type_text(&self, text: &str) {
        File::from(self.master.try_clone().unwrap())
            .write_all(text.as_bytes())
            .unwrap();
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "did not exit:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn termios(&self) -> libc::termios {
        termios_of(&self.slave)
    }

    fn resize(&self, rows: u16, cols: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize; the kernel then signals the foreground group.
        assert_eq!(
            unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) },
            0
        );
    }
}

impl Drop for InPty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn incident_status() -> dflash_shared::status::StatusSnapshot {
    incident::generate(incident::SEED)
        .into_iter()
        .rev()
        .find_map(|f| match f.frame {
            Response::Status(s) => Some(*s),
            _ => None,
        })
        .unwrap()
}

fn start_daemon(
    runtime: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    script: Script,
) -> TestDaemon {
    runtime.block_on(TestDaemon::start(&dir.join("d.sock"), script))
}

/// Checks the console left the alternate screen and put the terminal modes back.
fn assert_restored(pty: &InPty) {
    let before = &pty.initial;
    let screen = pty.screen();
    assert!(
        screen.contains("\x1b[?1049h"),
        "entered the alternate screen"
    );
    assert!(screen.contains("\x1b[?1049l"), "left the alternate screen");
    let after = pty.termios();
    assert_eq!(after.c_lflag, before.c_lflag, "terminal modes restored");
    assert_ne!(after.c_lflag & libc::ICANON, 0);
    assert_ne!(after.c_lflag & libc::ECHO, 0);
}

#[test]
fn attach_draws_the_console_survives_a_resize_and_q_restores_the_terminal() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = start_daemon(&runtime, dir.path(), Script::new(incident_status()));
    let mut pty = InPty::spawn(&["attach", "--socket", &daemon.socket.display().to_string()]);

    pty.wait_for("connected (dflashd pid 4242)");
    // Cells are diffed between frames, so look for words without spaces: the run name and the
    // baseline from the daemon's status, and the alert level.
    for needle in ["qwen36-27b-dflash", "21.5K", "Crit"] {
        pty.wait_for(needle);
    }
    assert_eq!(
        pty.termios().c_lflag & libc::ICANON,
        0,
        "raw mode while attached"
    );

    // A resize makes the console clear and redraw everything at the new size.
    let drawn = pty.screen().matches("qwen36-27b-dflash").count();
    pty.resize(40, 140);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pty.screen().matches("qwen36-27b-dflash").count() <= drawn {
        assert!(Instant::now() < deadline, "no redraw after the resize");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        pty.child.try_wait().unwrap().is_none(),
        "still running after the resize"
    );

    pty.type_text("q");
    assert!(pty.wait_exit().success());
    pty.wait_for("dflashd keeps training");
    // The test binary is not on PATH: the hint must name it by path, with the same socket.
    pty.wait_for("/dflash-tui attach --socket ");
    assert_restored(&pty);
    daemon.stop();
}

#[test]
fn sigterm_leaves_the_console_cleanly_too() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = start_daemon(&runtime, dir.path(), Script::new(incident_status()));
    let mut pty = InPty::spawn(&[
        "attach",
        "--read-only",
        "--socket",
        &daemon.socket.display().to_string(),
    ]);
    pty.wait_for("read-only");
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(pty.child.id() as i32, libc::SIGTERM) },
        0
    );
    assert!(pty.wait_exit().success());
    assert_restored(&pty);
    daemon.stop();
}

fn pending_stop() -> PendingAction {
    PendingAction {
        id: "act-9".into(),
        action: Action::StopRun,
        requested_by_uid: 1000,
        created_ms: incident::end_ms(),
        expires_ms: i64::MAX / 2,
        consequences: vec!["last checkpoint 0 min ago".into()],
    }
}

#[test]
fn confirm_stop_on_a_terminal_needs_the_exact_run_name() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut script = Script::new(incident_status());
    script.pending = vec![pending_stop()];
    script.after_confirm = vec![Response::Event(Box::new(dflash_shared::events::Event {
        seq: 9_001,
        ts_ms: incident::end_ms(),
        severity: dflash_shared::events::Severity::Info,
        kind: dflash_shared::events::EventKind::RunStopped {
            reason: "confirmed stop act-9".into(),
            checkpoint: Some("/srv/ckpt/step-00031690".into()),
        },
    }))];
    let daemon = start_daemon(&runtime, dir.path(), script);
    let socket = daemon.socket.display().to_string();

    let mut wrong = InPty::spawn(&["confirm-stop", "--socket", &socket, "--wait", "5"]);
    wrong.wait_for("Type the run name (qwen36-27b-dflash) to confirm act-9");
    wrong.type_text("qwen36\n");
    assert_eq!(wrong.wait_exit().code(), Some(2));
    wrong.wait_for("nothing was confirmed");
    assert!(!daemon
        .requests()
        .iter()
        .any(|r| matches!(r, Request::Confirm { .. })));

    let mut right = InPty::spawn(&["confirm-stop", "--socket", &socket, "--wait", "5"]);
    right.wait_for("Type the run name");
    right.type_text("qwen36-27b-dflash\n");
    right.wait_for("Confirmed act-9");
    assert!(right.wait_exit().success());
    right.wait_for("final checkpoint: /srv/ckpt/step-00031690");
    assert!(daemon.requests().contains(&Request::Confirm {
        action_id: "act-9".into(),
        run_name: incident::RUN_NAME.into(),
        via: "tty".into(),
    }));
    daemon.stop();
}

#[test]
fn replay_plays_the_incident_to_the_end_and_flags_it() {
    let mut pty = InPty::spawn(&["replay", incident::FIXTURE, "--speed", "7200"]);
    pty.wait_for("end");
    pty.wait_for("CRIT");
    pty.wait_for("20:52");
    pty.type_text("2");
    pty.wait_for("VOLATILE");
    pty.type_text("q");
    assert!(pty.wait_exit().success());
    assert_restored(&pty);
}
