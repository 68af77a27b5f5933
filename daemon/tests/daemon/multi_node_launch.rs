//! Issue 23: `dflashd start` resolves a multi-node launch from its flags or from torchrun's and
//! SLURM's variables; a node whose peers never come refuses within its collective timeout,
//! naming what it waited for (`multi_node_training` runs real pairs of nodes).
use std::path::Path;
use std::process::Command;

use dflash_shared::launch::ENV_VARS;

use crate::support::binary::dflashd;

/// `dflashd start` in `root` with the launch variables of this test's own environment
/// removed and `vars` set; returns (exit code, stderr).
fn start(root: &Path, flags: &[&str], vars: &[(&str, &str)]) -> (i32, String) {
    let mut cmd: Command = dflashd(root);
    for var in ENV_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(vars.iter().copied());
    let run_dir = root.join("run");
    let socket = root.join("s/d.sock");
    cmd.arg("start")
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("--socket")
        .arg(&socket)
        .arg("--max-steps")
        .arg("1")
        .args(flags);
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_node_whose_peers_never_come_refuses_within_its_timeout_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // A port nothing listens on: node 0 of this job is never started.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rendezvous = format!("127.0.0.1:{port}");
    let flags = [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rendezvous",
        &rendezvous,
        "--collective-timeout-s",
        "2",
    ];
    let started = std::time::Instant::now();
    let (code, err) = start(root, &flags, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("node 1 could not meet the job at {rendezvous}")),
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    assert!(!root.join("run/checkpoints").exists(), "nothing trained");

    // The same launch from SLURM's variables: node 0 serves and waits for node 1.
    let slurm = [
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_NODELIST", "localhost"),
        ("SLURM_JOB_ID", "4242"),
        ("MASTER_PORT", &port.to_string()),
    ];
    let (code, err) = start(root, &["--collective-timeout-s", "2"], &slurm);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the run did not start: node 0: "), "{err}");
}

#[test]
fn an_ambiguous_or_contradictory_launch_is_refused_saying_what_to_set() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // torchrun with one process per GPU: several dflashd on one node.
    let torchrun = [
        ("LOCAL_WORLD_SIZE", "8"),
        ("WORLD_SIZE", "16"),
        ("RANK", "3"),
    ];
    let (code, err) = start(root, &[], &torchrun);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--nproc-per-node 1"), "{err}");
    // A flag against the launcher's variable.
    let (code, err) = start(root, &["--nnodes", "1"], &[("NNODES", "2")]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--nnodes 1 but NNODES=2") && err.contains("unset the variable"),
        "{err}"
    );
    assert!(!root.join("s/d.sock").exists());
}
