//! Child processes of a benchmark: the engine re-invoked on one case (`dflash-bench --child`),
//! and the Python reference scripts. Each prints one JSON object as its last stdout line; a
//! child that hangs is killed after a timeout. Running each case in its own process keeps peak
//! memory per implementation instead of mixing it in one address space.
use std::env;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use super::error::BenchError;

/// Where the reference lives relative to the repository root.
pub const REFERENCE_SUBDIR: &str = "benches/reference";
const MARKER: &str = "bench_step.py";

/// The Python interpreter and the directory of the reference scripts.
#[derive(Debug, Clone, PartialEq)]
pub struct Python {
    pub program: PathBuf,
    pub scripts: PathBuf,
}

fn find_reference_dir(starts: &[PathBuf]) -> Option<PathBuf> {
    starts
        .iter()
        .flat_map(|s| s.ancestors())
        .map(|a| a.join(REFERENCE_SUBDIR))
        .find(|d| d.join(MARKER).is_file())
}

impl Python {
    /// `program`: explicit, else `$DFLASH_PYTHON`, else `<repo>/.venv/bin/python` (the uv
    /// environment `make provision` creates), else `python3`. `scripts`: explicit, else
    /// `benches/reference` above the working directory or the binary.
    pub fn locate(program: Option<PathBuf>, scripts: Option<PathBuf>) -> Result<Self, BenchError> {
        let mut starts = Vec::new();
        if let Ok(cwd) = env::current_dir() {
            starts.push(cwd);
        }
        if let Ok(exe) = env::current_exe() {
            starts.push(exe);
        }
        let scripts = match scripts {
            Some(dir) if dir.join(MARKER).is_file() => dir,
            Some(dir) => return Err(BenchError::case(&dir, format!("no {MARKER} here: not the reference scripts directory"))),
            None => find_reference_dir(&starts).ok_or_else(|| BenchError::Process {
                program: "reference".into(),
                detail: format!(
                    "cannot find {REFERENCE_SUBDIR}/{MARKER} above {}; run from the repository or pass --reference-dir",
                    starts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or ")
                ),
            })?,
        };
        let venv = scripts
            .ancestors()
            .nth(2)
            .map(|root| root.join(".venv/bin/python"));
        let program = program
            .or_else(|| env::var_os("DFLASH_PYTHON").map(PathBuf::from))
            .or_else(|| venv.filter(|p| p.is_file()))
            .unwrap_or_else(|| PathBuf::from("python3"));
        Ok(Self { program, scripts })
    }

    pub fn script(&self, name: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.arg(self.scripts.join(name));
        cmd
    }
}

/// This binary, to re-invoke on one case.
pub fn engine_command() -> Result<Command, BenchError> {
    let exe = env::current_exe().map_err(|e| BenchError::Process {
        program: "dflash-bench".into(),
        detail: format!("cannot locate this binary: {e}"),
    })?;
    Ok(Command::new(exe))
}

/// The last non-empty line of `stdout`, parsed as `T`.
pub fn parse_last_json<T: DeserializeOwned>(stdout: &str) -> Result<T, String> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or("printed nothing on stdout")?;
    serde_json::from_str(line)
        .map_err(|e| format!("last stdout line is not the expected JSON ({e}): {line}"))
}

fn describe(cmd: &Command) -> String {
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!("{} {}", cmd.get_program().to_string_lossy(), args.join(" "))
}

/// Runs `cmd` (stderr passes through to ours), kills it after `timeout`, and parses its last
/// stdout line. A non-zero exit still parses: the scripts report their own errors in the JSON.
pub fn run_json<T: DeserializeOwned>(mut cmd: Command, timeout: Duration) -> Result<T, BenchError> {
    let what = describe(&cmd);
    let fail = |detail: String| BenchError::Process {
        program: what.clone(),
        detail,
    };
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| fail(format!("cannot start: {e}")))?;
    let mut pipe = child
        .stdout
        .take()
        .ok_or_else(|| fail("no stdout pipe".into()))?;
    let reader = thread::spawn(move || {
        let mut out = String::new();
        let _ = pipe.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!(
                    "killed after {} s without finishing",
                    timeout.as_secs()
                )));
            }
            Ok(None) => thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(fail(format!("cannot wait for it: {e}"))),
        }
    };
    let stdout = reader.join().unwrap_or_default();
    parse_last_json(&stdout).map_err(|e| fail(format!("{e} (exit status {status})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Line {
        x: i64,
    }

    #[test]
    fn parses_the_last_non_empty_line_only() {
        assert_eq!(
            parse_last_json::<Line>("progress\n{\"x\": 1}\n{\"x\": 2}\n\n").unwrap(),
            Line { x: 2 }
        );
        assert!(parse_last_json::<Line>("").unwrap_err().contains("nothing"));
        assert!(parse_last_json::<Line>("{\"x\": 1}\ndone\n")
            .unwrap_err()
            .contains("done"));
    }

    #[test]
    fn runs_a_process_and_kills_one_that_hangs() {
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo noise; echo '{\"x\": 7}'"]);
        assert_eq!(
            run_json::<Line>(ok, Duration::from_secs(10)).unwrap(),
            Line { x: 7 }
        );
        let mut hang = Command::new("sleep");
        hang.arg("30");
        let err = run_json::<Line>(hang, Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(err.contains("killed after"), "{err}");
        let missing = run_json::<Line>(Command::new("/nonexistent/python"), Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("cannot start"), "{missing}");
    }

    #[test]
    fn finds_the_reference_scripts_from_inside_the_repository() {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let found = find_reference_dir(&[here]).expect("benches/reference above the daemon crate");
        assert!(found.join(MARKER).is_file());
        let err = Python::locate(None, Some(PathBuf::from("/tmp")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the reference scripts directory"), "{err}");
    }
}
