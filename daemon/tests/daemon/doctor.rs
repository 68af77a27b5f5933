//! `dflashd doctor` reads what the binary runs on; NCCL (which cudarc opens as `libnccl.so`,
//! while the torch wheel ships `libnccl.so.2`) becomes loadable by following its own hint.
use std::process::Command;

fn doctor(ld_library_path: Option<&std::path::Path>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dflashd"));
    cmd.arg("doctor");
    if let Some(dir) = ld_library_path {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn nccl_line(report: &str) -> &str {
    report
        .lines()
        .find(|l| l.starts_with("nccl:"))
        .unwrap_or_else(|| panic!("no nccl line in:\n{report}"))
}

#[test]
fn doctor_reports_libtorch_and_makes_nccl_loadable_through_its_hint() {
    let report = doctor(None);
    assert!(report.contains("libtorch:        2.11.0"), "{report}");
    let line = nccl_line(&report).to_string();
    if line.contains("(loadable)") {
        return; // this machine has a system NCCL: nothing to link
    }
    // The hint names the wheel's copy; a `libnccl.so` link to it on LD_LIBRARY_PATH must do.
    let wheel = line
        .split("ln -sf ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no `ln -sf PATH` in {line}"));
    assert!(wheel.ends_with("nvidia/nccl/lib/libnccl.so.2"), "{line}");
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(wheel, dir.path().join("libnccl.so")).unwrap();
    let report = doctor(Some(dir.path()));
    let line = nccl_line(&report);
    assert!(
        line.starts_with("nccl:            NCCL 2.") && line.ends_with("(loadable)"),
        "{line}"
    );
}
