//! `dflash-tui attach` in a real pseudo-terminal (openpty), against the test harness: it draws
//! the live console, `q` quits, and the terminal is left as it was found (alternate screen left,
//! raw mode off). The same test against a real `dflashd` waits for the daemon's control plane.
mod support;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dflash_shared::protocol::Response;
use support::incident;
use support::test_daemon::{Script, TestDaemon};

const BIN: &str = env!("CARGO_BIN_EXE_dflash-tui");

struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
}

fn open_pty(rows: u16, cols: u16) -> Pty {
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
    unsafe {
        Pty {
            master: OwnedFd::from_raw_fd(master),
            slave: OwnedFd::from_raw_fd(slave),
        }
    }
}

fn termios(fd: &OwnedFd) -> libc::termios {
    use std::os::fd::AsRawFd;
    // SAFETY: zeroed termios is a valid out-buffer for tcgetattr.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
    t
}

fn set_size(fd: &OwnedFd, rows: u16, cols: u16) {
    use std::os::fd::AsRawFd;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize; the kernel then signals the foreground group.
    assert_eq!(
        unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) },
        0
    );
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

fn wait_for(output: &Arc<Mutex<Vec<u8>>>, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if String::from_utf8_lossy(&output.lock().unwrap()).contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn attach_draws_the_console_in_a_terminal_and_q_restores_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = runtime.block_on(TestDaemon::start(
        &dir.path().join("d.sock"),
        Script::new(incident_status()),
    ));

    let pty = open_pty(32, 110);
    let before = termios(&pty.slave);
    let slave = File::from(pty.slave.try_clone().unwrap());
    let mut child = unsafe {
        Command::new(BIN)
            .args(["attach", "--socket", &daemon.socket.display().to_string()])
            .env("TERM", "xterm-256color")
            .env("NO_COLOR", "1")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            // SAFETY: only async-signal-safe calls between fork and exec.
            .pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .expect("spawn attach")
    };

    let output = Arc::new(Mutex::new(Vec::new()));
    let mut reader = File::from(pty.master.try_clone().unwrap());
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

    assert!(
        wait_for(
            &output,
            "connected (dflashd pid 4242)",
            Duration::from_secs(15)
        ),
        "the console never showed the connection: {}",
        String::from_utf8_lossy(&output.lock().unwrap())
    );
    // Cells are diffed between frames, so check words without spaces: the run name and the
    // baseline from the daemon's status, and the alert level.
    for needle in ["qwen36-27b-dflash", "21.5K", "Crit"] {
        assert!(
            wait_for(&output, needle, Duration::from_secs(5)),
            "{needle} never drawn"
        );
    }
    let during = termios(&pty.slave);
    assert_eq!(during.c_lflag & libc::ICANON, 0, "raw mode while attached");

    // A resize makes the console clear and redraw everything at the new size.
    let drawn_before = String::from_utf8_lossy(&output.lock().unwrap())
        .matches("qwen36-27b-dflash")
        .count();
    set_size(&pty.master, 40, 140);
    let deadline = Instant::now() + Duration::from_secs(10);
    while String::from_utf8_lossy(&output.lock().unwrap())
        .matches("qwen36-27b-dflash")
        .count()
        <= drawn_before
    {
        assert!(Instant::now() < deadline, "no redraw after the resize");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running after the resize"
    );

    let mut writer = File::from(pty.master.try_clone().unwrap());
    writer.write_all(b"q").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "q did not quit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}");
    assert!(wait_for(
        &output,
        "dflashd keeps training",
        Duration::from_secs(5)
    ));

    let screen = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    assert!(
        screen.contains("\x1b[?1049h"),
        "entered the alternate screen"
    );
    assert!(screen.contains("\x1b[?1049l"), "left the alternate screen");
    let after = termios(&pty.slave);
    assert_eq!(after.c_lflag, before.c_lflag, "terminal modes restored");
    assert_ne!(after.c_lflag & libc::ICANON, 0);
    assert_ne!(after.c_lflag & libc::ECHO, 0);
    daemon.stop();
}
