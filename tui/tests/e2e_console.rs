//! End to end: the real `dflash-tui` against the real `dflashd` training the embedded CPU
//! default. `attach` runs in a tmux pane (a real pseudo-terminal whose rendered screen tmux
//! can print): the overview shows live tok/s, and `q` leaves the terminal as it found it (no
//! alternate screen, canonical mode and echo back). Then `confirm-stop` without a terminal
//! refuses and changes nothing while training goes on, and the audited
//! `confirm-stop --token ID --yes-i-know` stops the daemon and reports its checkpoint.
//!
//! `dflashd` is the binary built next to `dflash-tui` (`cargo test --workspace` and `make test`
//! build it), or `$DFLASHD_BIN`.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dflash_shared::protocol::{decode_response, encode_frame, hello, Request, Response};
use dflash_shared::status::StatusSnapshot;
use dflash_tui::ui::bignum;

const TUI: &str = env!("CARGO_BIN_EXE_dflash-tui");
const WAIT: Duration = Duration::from_secs(40);

fn dflashd_bin() -> PathBuf {
    let bin = std::env::var_os("DFLASHD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(TUI).with_file_name("dflashd"));
    assert!(
        bin.is_file(),
        "the end-to-end test needs the dflashd binary at {} (build it with `cargo build --release -p dflashd`, or set DFLASHD_BIN)",
        bin.display()
    );
    bin
}

/// The daemon, isolated in `root` (socket, run dir, XDG dirs).
struct Daemon {
    child: Child,
    socket: PathBuf,
    run_dir: PathBuf,
    stderr: PathBuf,
}

impl Daemon {
    fn start(root: &Path) -> Daemon {
        let (socket, run_dir, stderr) = (
            root.join("s/d.sock"),
            root.join("run"),
            root.join("dflashd.err"),
        );
        let mut cmd = Command::new(dflashd_bin());
        for (var, sub) in [
            ("XDG_RUNTIME_DIR", "rt"),
            ("XDG_STATE_HOME", "state"),
            ("XDG_DATA_HOME", "data"),
        ] {
            cmd.env(var, root.join(sub));
        }
        let child = cmd
            .env_remove("NOTIFY_SOCKET")
            .args(["start", "--threads", "1", "--log-every", "0", "--socket"])
            .arg(&socket)
            .arg("--run-dir")
            .arg(&run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn dflashd");
        Daemon {
            child,
            socket,
            run_dir,
            stderr,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn try_status(&self) -> Option<StatusSnapshot> {
        let mut s = UnixStream::connect(&self.socket).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(&encode_frame(&hello("e2e")).ok()?).ok()?;
        s.write_all(&encode_frame(&Request::Status).ok()?).ok()?;
        for line in BufReader::new(s).lines() {
            if let Ok(Response::Status(status)) = decode_response(line.ok()?.as_bytes()) {
                return Some(*status);
            }
        }
        None
    }

    /// Waits for status to report a step above `step`.
    fn wait_step_above(&mut self, step: u64) -> StatusSnapshot {
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "dflashd exited:\n{}",
                self.log()
            );
            if let Some(s) = self.try_status().filter(|s| s.run.step > step) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no step above {step}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private tmux server holding one pane.
struct Tmux {
    server: String,
}

impl Tmux {
    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        // -u and a UTF-8 locale: the block font must come back as drawn, not as '_'.
        c.args(["-u", "-L", &self.server, "-f", "/dev/null"])
            .env_remove("TMUX")
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8");
        c
    }

    fn start(command: &str) -> Tmux {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let t = Tmux {
            server: format!("dflash-e2e-{}-{nanos}", std::process::id()),
        };
        let out = t
            .tmux()
            .args([
                "new-session",
                "-d",
                "-s",
                "e2e",
                "-x",
                "110",
                "-y",
                "34",
                command,
            ])
            .env("TERM", "xterm-256color")
            .env("NO_COLOR", "1")
            .output()
            .expect("tmux is installed");
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    fn screen(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-t", "e2e"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn display(&self, format: &str) -> String {
        let out = self
            .tmux()
            .args(["display-message", "-p", "-t", "e2e", format])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn keys(&self, keys: &str) {
        assert!(self
            .tmux()
            .args(["send-keys", "-t", "e2e", keys])
            .status()
            .unwrap()
            .success());
    }

    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "never saw {what} in:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").output();
    }
}

/// Reads the block-font headline under the "Throughput (tok/s)" title back into text.
fn headline(screen: &str) -> Option<String> {
    let lines: Vec<&str> = screen.lines().collect();
    let title = lines
        .iter()
        .position(|l| l.contains("Throughput (tok/s)"))?;
    let rows: Vec<Vec<char>> = lines
        .get(title + 1..title + 4)?
        .iter()
        .map(|l| {
            let inner = l.split('│').nth(1).unwrap_or("");
            inner.chars().skip(1).collect()
        })
        .collect();
    let width = rows.iter().map(Vec::len).max()?;
    let cell = |r: usize, x: usize| rows[r].get(x).copied().unwrap_or(' ');
    let mut text = String::new();
    let mut x = 0;
    'scan: while x < width {
        for c in [
            'M', 'K', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'G', '—', '.',
        ] {
            let glyph = bignum::render(&c.to_string())?;
            let fits = glyph
                .iter()
                .enumerate()
                .all(|(r, g)| g.chars().enumerate().all(|(i, gc)| cell(r, x + i) == gc));
            let blank = glyph.iter().all(|g| g.trim().is_empty());
            if fits && !blank {
                text.push(c);
                x += glyph[0].chars().count() + 1;
                continue 'scan;
            }
        }
        if (0..3).all(|r| cell(r, x) == ' ') {
            x += 1;
            continue;
        }
        return None;
    }
    Some(text)
}

/// "1.8K" → 1800.
fn parse_si(text: &str) -> Option<f64> {
    let (number, scale) = match text.chars().last()? {
        'K' => (&text[..text.len() - 1], 1e3),
        'M' => (&text[..text.len() - 1], 1e6),
        _ => (text, 1.0),
    };
    number.parse::<f64>().ok().map(|v| v * scale)
}

fn tui(args: &[&str]) -> Output {
    Command::new(TUI)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run dflash-tui")
}

#[test]
fn the_console_on_a_real_daemon_shows_live_throughput_quits_cleanly_and_stops_only_when_confirmed()
{
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut daemon = Daemon::start(root);
    let first = daemon.wait_step_above(0);
    let socket = daemon.socket.display().to_string();

    let stty = root.join("stty.txt");
    let pane = format!(
        "sh -c '{TUI} attach --socket {socket}; echo ATTACH_EXIT=$?; stty -a > {}; echo E2E_DONE; sleep 60'",
        stty.display()
    );
    let tmux = Tmux::start(&pane);
    let screen = tmux.wait_for("the overview with a tok/s headline", |s| {
        s.contains("tiny-cpu")
            && s.contains("Training")
            && headline(s).and_then(|h| parse_si(&h)).is_some()
    });
    let shown = parse_si(&headline(&screen).unwrap()).unwrap();
    let live = daemon
        .wait_step_above(first.run.step)
        .throughput
        .tokens_per_s;
    assert!(
        shown > 0.0 && shown > live / 4.0 && shown < live * 4.0,
        "the overview shows {shown} tok/s, the daemon {live}:\n{screen}"
    );
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "1",
        "attached in the alternate screen"
    );
    // Throughput that compares across configs: draft positions/s, and MFU against the CPU
    // peak the daemon measured at start.
    let rates = tmux.wait_for("draft positions/s and MFU", |s| {
        s.contains(" draft pos/s") && s.contains(" MFU ") && s.contains('%')
    });
    assert!(
        !rates.contains("MFU —"),
        "the CPU's peak is known:\n{rates}"
    );

    tmux.keys("q");
    let after = tmux.wait_for("the console's exit", |s| s.contains("E2E_DONE"));
    assert!(after.contains("ATTACH_EXIT=0"), "{after}");
    assert!(after.contains("dflashd keeps training"), "{after}");
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "0",
        "left the alternate screen"
    );
    let modes = std::fs::read_to_string(&stty).unwrap();
    let flags: Vec<&str> = modes.split_whitespace().collect();
    for flag in ["icanon", "echo", "isig"] {
        assert!(flags.contains(&flag), "{flag} restored:\n{modes}");
    }

    // A stop request, then confirm-stop without a terminal: refused, nothing changes.
    let filed = tui(&["stop", "--socket", &socket]);
    let filed = String::from_utf8_lossy(&filed.stdout).into_owned();
    let id = filed
        .split("Filed pending request ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no request id in: {filed}"))
        .to_string();
    let refused = tui(&["confirm-stop", "--socket", &socket]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("needs an interactive terminal"),
        "{refused:?}"
    );
    let before = daemon.wait_step_above(0);
    let still = daemon.wait_step_above(before.run.step + 1);
    assert!(
        still.pending_actions.iter().any(|p| p.id == id),
        "the stop is still pending"
    );

    let confirmed = tui(&[
        "confirm-stop",
        "--socket",
        &socket,
        "--token",
        &id,
        "--yes-i-know",
        "--wait",
        "60",
    ]);
    let out = String::from_utf8_lossy(&confirmed.stdout).into_owned();
    assert!(
        confirmed.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&confirmed.stderr)
    );
    let checkpoint = out
        .split("final checkpoint: ")
        .nth(1)
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|| panic!("no checkpoint reported: {out}"));
    assert!(
        checkpoint.starts_with(&daemon.run_dir.display().to_string()),
        "{checkpoint}"
    );
    assert!(
        Path::new(&checkpoint).join("manifest.json").is_file(),
        "{checkpoint}"
    );
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "dflashd still running:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", daemon.log());
    let journal = std::fs::read_to_string(daemon.run_dir.join("journal.jsonl")).unwrap();
    assert!(
        journal.contains(&format!(
            "\"action_id\":\"{id}\",\"via\":\"run name matched on full connection"
        )) && journal.contains("\"client_says\":\"token\""),
        "the scripted confirmation is audited: how dflashd saw it arrive, and the client's word \
         apart"
    );

    // With the daemon gone and no --run-dir, `status` finds the run through the daemon's
    // last-run record in the state dir (the run dir here is not the XDG default).
    let report = Command::new(TUI)
        .args(["status", "--format", "json", "--socket", &socket])
        .env("XDG_STATE_HOME", root.join("state"))
        .env("XDG_DATA_HOME", root.join("data"))
        .stdin(Stdio::null())
        .output()
        .expect("run dflash-tui status");
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).expect("status JSON");
    assert_eq!(json["daemon"]["reachable"], false, "{json}");
    assert_eq!(
        json["files"]["run_dir"].as_str(),
        Some(daemon.run_dir.display().to_string().as_str()),
        "{json}"
    );
    assert_eq!(json["run"]["name"], "tiny-cpu", "{json}");
}
