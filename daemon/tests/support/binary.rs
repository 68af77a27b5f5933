//! The real `dflashd` binary as a child process, isolated in a temp dir: its socket, run
//! dir, logs and XDG directories all live there, so nothing touches the user's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dflash_shared::events::Event;
use dflash_shared::protocol::{Request, Response, PROTOCOL_VERSION};
use dflash_shared::status::StatusSnapshot;

use super::in_process::Client;

pub const BIN: &str = env!("CARGO_BIN_EXE_dflashd");
pub const WAIT: Duration = Duration::from_secs(40);

/// The CPU peak the tests' daemons are given (`dflashd start --cpu-peak-flops`, here through
/// its variable), FLOP/s: each start would otherwise time a matmul for about a second. One
/// test starts without it ([`Daemon::spawn_measuring`]) and checks the measurement.
pub const CPU_PEAK_VAR: &str = "DFLASH_CPU_PEAK_FLOPS";
pub const CPU_PEAK_FLOPS: &str = "5e10";

/// A `dflashd` command with the XDG directories inside `root` and the CPU peak given.
pub fn dflashd(root: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    for (var, sub) in [
        ("XDG_RUNTIME_DIR", "xdg-runtime"),
        ("XDG_STATE_HOME", "xdg-state"),
        ("XDG_DATA_HOME", "xdg-data"),
        ("XDG_CONFIG_HOME", "xdg-config"),
    ] {
        cmd.env(var, root.join(sub));
    }
    cmd.env_remove("NOTIFY_SOCKET")
        .env("NO_COLOR", "1")
        .env(CPU_PEAK_VAR, CPU_PEAK_FLOPS);
    // Run under SLURM or torchrun, the launcher's variables would make every test daemon a
    // node of a multi-node job; the tests that want one set them themselves.
    for var in dflash_shared::launch::ENV_VARS {
        cmd.env_remove(var);
    }
    cmd
}

pub struct Daemon {
    pub child: Child,
    pub root: PathBuf,
    pub run_dir: PathBuf,
    pub socket: PathBuf,
    out: PathBuf,
    err: PathBuf,
}

impl Daemon {
    /// `dflashd start --run-dir <root>/run --socket <root>/s/d.sock <extra>` in the foreground.
    pub fn spawn(root: &Path, extra: &[&str]) -> Daemon {
        Self::spawn_in(root, &root.join("run"), extra)
    }

    /// As [`Self::spawn`], without the given CPU peak: the daemon times its matmul peak.
    pub fn spawn_measuring(root: &Path, extra: &[&str]) -> Daemon {
        Self::spawn_with(root, &root.join("run"), extra, |cmd| {
            cmd.env_remove(CPU_PEAK_VAR);
        })
    }

    pub fn spawn_in(root: &Path, run_dir: &Path, extra: &[&str]) -> Daemon {
        Self::spawn_with(root, run_dir, extra, |_| {})
    }

    fn spawn_with(
        root: &Path,
        run_dir: &Path,
        extra: &[&str],
        edit: impl FnOnce(&mut Command),
    ) -> Daemon {
        let socket = root.join("s").join("d.sock");
        let n = std::fs::read_dir(root).map_or(0, |d| d.count());
        let (out, err) = (
            root.join(format!("out-{n}.txt")),
            root.join(format!("err-{n}.txt")),
        );
        let mut cmd = dflashd(root);
        edit(&mut cmd);
        let child = cmd
            .args(["start", "--threads", "1", "--log-every", "0", "--run-dir"])
            .arg(run_dir)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("spawn dflashd");
        Daemon {
            child,
            root: root.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
            socket,
            out,
            err,
        }
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Connects once the socket answers; panics with the daemon's stderr if it never does.
    pub fn client(&mut self) -> Client {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "dflashd exited ({status}) before serving:\n{}",
                    self.stderr()
                );
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                let mut c = Client::connect(&self.socket);
                match c.request(&Request::Hello {
                    version: PROTOCOL_VERSION,
                    client: "daemon-test".into(),
                    access: Default::default(),
                }) {
                    Response::Welcome { .. } => return c,
                    other => panic!("expected a welcome, got {other:?}"),
                }
            }
            assert!(Instant::now() < deadline, "no socket:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn status(&mut self) -> StatusSnapshot {
        match self.client().request(&Request::Status) {
            Response::Status(s) => *s,
            other => panic!("expected status, got {other:?}"),
        }
    }

    /// Waits until status reports a step above `step`; returns it.
    pub fn wait_step_above(&mut self, step: u64) -> u64 {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = self.status().run.step;
            if now > step {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "stuck at step {now}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "dflashd did not exit:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every journal line of a run dir.
pub fn journal(run_dir: &Path) -> Vec<Event> {
    std::fs::read_to_string(run_dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Steps of the published checkpoints of a run dir.
pub fn checkpoint_steps(run_dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(run_dir.join("checkpoints"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    steps.sort();
    steps
}

/// `dflashd <args>` to completion: (exit code, stdout, stderr).
pub fn run(root: &Path, args: &[&str]) -> (i32, String, String) {
    let o = dflashd(root).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A short foreground run: `dflashd start --threads 1 --log-every 0 --max-steps STEPS
/// --run-dir RUN_DIR EXTRA...` to completion: (exit code, stdout, stderr).
pub fn start_for_steps(
    root: &Path,
    run_dir: &Path,
    steps: u64,
    extra: &[&str],
) -> (i32, String, String) {
    let steps = steps.to_string();
    let mut args = vec![
        "start",
        "--threads",
        "1",
        "--log-every",
        "0",
        "--max-steps",
        &steps,
        "--run-dir",
        run_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(root, &args)
}

/// Writes the embedded default, edited, as a config file.
pub fn write_config(path: &Path, edit: impl FnOnce(&mut dflash_shared::config::Config)) {
    let mut cfg = dflash_shared::config::Config::embedded_default();
    edit(&mut cfg);
    std::fs::write(path, cfg.to_toml_string()).unwrap();
}

/// Files `action` and confirms it with the run name; returns (action id, reply).
pub fn request_and_confirm(
    c: &mut Client,
    action: dflash_shared::actions::Action,
) -> (String, Response) {
    let id = match c.request(&Request::RequestAction { action }) {
        Response::Pending { action } => action.id,
        other => panic!("{other:?}"),
    };
    c.set_read_timeout(Duration::from_secs(60));
    let reply = c.request(&Request::Confirm {
        action_id: id.clone(),
        run_name: "tiny-cpu".into(),
        via: "test".into(),
    });
    (id, reply)
}

/// The project venv's Python (`DFLASH_PYTHON` overrides it); missing, the test fails saying
/// what installs it (`remedy`, e.g. "run `make provision`").
pub fn project_python(remedy: &str) -> PathBuf {
    let python = std::env::var_os("DFLASH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .join(".venv/bin/python")
        });
    assert!(
        python.exists(),
        "no Python at {}: {remedy} or set DFLASH_PYTHON",
        python.display()
    );
    python
}
