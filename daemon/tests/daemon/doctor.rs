//! `dflashd doctor` reads what the binary runs on; NCCL is the torch wheel's own
//! `nvidia/nccl/lib/libnccl.so.2`, opened by dflashd itself with no step by the user.
use std::process::Command;

fn doctor() -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_dflashd"))
        .arg("doctor")
        // Nothing on the search path may help: the wheel's copy is found from libtorch's place.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn line<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} line in:\n{report}"))
}

#[test]
fn doctor_reports_libtorch_and_the_wheel_nccl_it_loaded_with_no_manual_step() {
    let report = doctor();
    assert!(report.contains("libtorch:        2.11.0"), "{report}");
    let dir = line(&report, "libtorch dir:")
        .trim_start_matches("libtorch dir:")
        .trim()
        .to_string();
    let wheel = std::path::Path::new(&dir).join("../../nvidia/nccl/lib/libnccl.so.2");
    let nccl = line(&report, "nccl:");
    assert_eq!(
        nccl,
        format!(
            "nccl:            NCCL 2.28.9 from {}",
            wheel.canonicalize().unwrap().display()
        ),
        "the project's torch==2.11.0 wheel ships NCCL 2.28.9"
    );
    assert!(
        !report.contains("ln -sf") && !report.contains("export "),
        "doctor gives no manual recipe:\n{report}"
    );
}

#[test]
fn doctor_reports_the_multi_node_rendezvous_and_collective_backends() {
    let report = doctor();
    // The wheel's version file says e.g. `2.11.0+cu130`.
    let rendezvous = line(&report, "rendezvous:");
    assert!(
        rendezvous.starts_with("rendezvous:      c10d TCPStore (libtorch 2.11.0")
            && rendezvous.ends_with(')'),
        "{rendezvous}"
    );
    // `make test-deps` installs gloo's headers, so the test build has libtorch's Gloo.
    assert_eq!(
        line(&report, "collective:"),
        "collective:      Gloo via libtorch's ProcessGroupGloo (CPU); NCCL 2.28.9 \
         ncclCommInitRank (CUDA)",
        "{report}"
    );
}
