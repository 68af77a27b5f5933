//! Issue 23: `dflashd start` resolves a multi-node launch from its flags or from torchrun's and
//! SLURM's variables and, until the cross-node collective is wired, refuses more than one node
//! before it opens anything of the run.
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
fn a_two_node_launch_is_refused_naming_the_node_and_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let flags = [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rendezvous",
        "127.0.0.1:29500",
    ];
    let (code, err) = start(root, &flags, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("multi-node training is not wired yet (issue 23)")
            && err.contains(
                "node 1 of 2, rendezvous 127.0.0.1:29500, via --nnodes 2 and --node-rank 1"
            )
            && err.contains("run with --nnodes 1"),
        "{err}"
    );
    assert!(!root.join("s/d.sock").exists(), "no socket was served");
    assert!(!root.join("run/checkpoints").exists(), "nothing trained");

    // The same launch from SLURM's variables.
    let slurm = [
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_NODELIST", "node[01-02]"),
        ("SLURM_JOB_ID", "4242"),
    ];
    let (code, err) = start(root, &[], &slurm);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("node 0 of 2, rendezvous node01:19242, via SLURM_NNODES=2 and SLURM_NODEID=0"),
        "{err}"
    );
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
