//! `dflashd plan` and the memory plan `dflashd start` checks first, with the real binary.

use std::path::{Path, PathBuf};

use crate::support::binary::{journal, run, start_for_steps};
use dflash_shared::events::EventKind;
use serde_json::Value;

fn repo_file(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .display()
        .to_string()
}

fn plan_json(root: &Path, args: &[&str]) -> Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    let (code, out, err) = run(root, &all);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn plan_27b_at_96_gib(root: &Path, config: &str) -> Value {
    plan_27b_at(root, config, "96")
}

fn plan_27b_at(root: &Path, config: &str, gib: &str) -> Value {
    let target = repo_file("configs/targets/qwen3.6-27b.config.json");
    plan_json(
        root,
        &[
            "--config",
            config,
            "--target-config",
            &target,
            "--gpu-memory-gib",
            gib,
            "--seq-len",
            "4096",
            "--peak-tflops",
            "989",
        ],
    )
}

#[test]
fn the_27b_plan_fits_96_gib_with_activation_checkpointing_as_configured() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = plan_27b_at_96_gib(tmp.path(), &repo_file("configs/qwen3.6-27b-8gpu.toml"));
    assert_eq!(
        plan["activation_checkpointing"],
        Value::Bool(true),
        "{plan:#}"
    );
    assert_eq!(plan["fits"], Value::Bool(true), "{plan:#}");
    for d in plan["devices"].as_array().unwrap() {
        assert_eq!(d["fits"], Value::Bool(true), "{d:#}");
    }
}

#[test]
fn the_27b_plan_without_activation_checkpointing_says_its_drafter_does_not_fit_80_gib() {
    // At 80 GiB only checkpointing makes the drafter fit, at S = 4096 with the Domino head as
    // with DFlash's (the predictions:
    // docs/BENCHMARKS.md#the-real-qwen36-27b-run-predictions-not-measurements).
    let tmp = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(repo_file("configs/qwen3.6-27b-8gpu.toml")).unwrap();
    let off = shipped.replace(
        "activation_checkpointing = true",
        "activation_checkpointing = false",
    );
    assert_ne!(off, shipped, "the shipped config turns checkpointing on");
    let config = tmp.path().join("off.toml");
    std::fs::write(&config, off).unwrap();
    let plan = plan_27b_at(tmp.path(), &config.display().to_string(), "80");
    assert_eq!(plan["activation_checkpointing"], Value::Bool(false));
    let devices = plan["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8, "{plan:#}");
    for d in devices {
        let role = d["role"].as_str().unwrap();
        let fits = d["fits"].as_bool().unwrap();
        assert_eq!(fits, role == "target", "{d:#}");
        assert!(d["device"].as_str().unwrap().starts_with("cuda:"));
        assert!(d["predicted_peak_gib"].as_f64().unwrap() > 50.0, "{d:#}");
        assert_eq!(d["top_consumers"].as_array().unwrap().len(), 3, "{d:#}");
    }
    assert_eq!(plan["fits"], Value::Bool(false));
    assert_eq!(plan["bound_by"], "drafter");
    let f = &plan["flops_per_token"];
    assert!(f["target"].as_f64().unwrap() > 45e9, "{f}");
    assert!(f["drafter"].as_f64().unwrap() > 100e9, "{f}");
    assert!(plan["tokens_per_s_at_mfu"]["run"].as_f64().unwrap() > 0.0);
    let split = &plan["recommended_split"];
    assert!(split["drafter_devices"].as_u64().unwrap() > 3, "{split}");
    assert_eq!(plan["device_memory"]["source"], "--gpu-memory-gib");
}

#[test]
fn the_default_plan_reads_the_data_and_the_hosts_memory_and_fits() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = plan_json(tmp.path(), &[]);
    let source = plan["shape"]["source"].as_str().unwrap();
    assert!(source.starts_with("p95 row length of "), "{source}");
    assert!(
        plan["device_memory"]["source"]
            .as_str()
            .unwrap()
            .starts_with("host memory"),
        "{plan:#}"
    );
    assert_eq!(plan["fits"], Value::Bool(true), "{plan:#}");
    assert_eq!(plan["devices"][0]["role"], "target_and_drafter");
}

#[test]
fn a_plan_without_the_targets_config_says_what_to_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo_file("configs/qwen3.6-27b-8gpu.toml");
    let (code, _, err) = run(
        tmp.path(),
        &["plan", "--config", &config, "--seq-len", "4096"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("--target-config"), "{err}");
}

fn start(root: &Path, extra: &[&str]) -> (i32, String, String, PathBuf) {
    let run_dir = root.join("run");
    let socket = root.join("s/d.sock").display().to_string();
    let mut args = vec!["--socket", &socket];
    args.extend_from_slice(extra);
    let (code, out, err) = start_for_steps(root, &run_dir, 1, &args);
    (code, out, err, run_dir)
}

#[test]
fn start_refuses_a_run_over_the_stated_memory_and_journals_the_override() {
    // The embedded CPU run needs a few MiB: 0.001 GiB (1 MiB) per device cannot hold it.
    let tmp = tempfile::tempdir().unwrap();
    let (code, out, err, run_dir) = start(tmp.path(), &["--gpu-memory-gib", "0.001"]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("cpu (target_and_drafter): needs") && err.contains("has 1.0 MiB"),
        "{err}"
    );
    assert!(err.contains("devices of at least "), "{err}");
    assert!(err.contains("--ignore-memory-plan"), "{err}");
    let stopped = journal(&run_dir).into_iter().any(|e| {
        matches!(e.kind, EventKind::RunStopped { ref reason, .. }
            if reason.contains("memory plan predicts this run does not fit"))
    });
    assert!(stopped, "{:?}", journal(&run_dir));
    let detailed = journal(&run_dir).into_iter().any(|e| {
        matches!(e.kind, EventKind::Note { ref message }
            if message.contains("cpu (target_and_drafter): needs") && message.contains("largest: "))
    });
    assert!(detailed, "{:?}", journal(&run_dir));
    assert!(!run_dir.join("checkpoints").join("latest").exists());

    let tmp = tempfile::tempdir().unwrap();
    let (code, out, err, run_dir) = start(
        tmp.path(),
        &["--gpu-memory-gib", "0.001", "--ignore-memory-plan"],
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let journaled = journal(&run_dir).into_iter().any(|e| {
        matches!(e.kind, EventKind::Note { ref message }
            if message.starts_with("--ignore-memory-plan: starting against the memory plan"))
    });
    assert!(journaled, "{:?}", journal(&run_dir));
}

#[test]
fn a_target_without_config_json_is_named_with_its_os_error_once() {
    // The engine's error printed the OS error in its message and again as its `source()`,
    // so anyhow's chain said "No such file or directory (os error 2)" twice.
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let config = tmp.path().join("run.toml");
    crate::support::binary::write_config(&config, |c| {
        c.target.model = model.display().to_string();
    });
    let (code, out, err) = run(
        tmp.path(),
        &["plan", "--config", &config.display().to_string()],
    );
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    let missing = model.join("config.json").display().to_string();
    assert!(
        err.contains(&missing) && err.contains("--target-config"),
        "{err}"
    );
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
}

/// `plan` of the shipped 27B config at 4096 tokens and 989 TFLOP/s, with `extra` flags.
fn plan_27b_with(root: &Path, extra: &[&str]) -> (i32, String, String) {
    let config = repo_file("configs/qwen3.6-27b-8gpu.toml");
    let target = repo_file("configs/targets/qwen3.6-27b.config.json");
    let mut args = vec![
        "plan",
        "--config",
        &config,
        "--target-config",
        &target,
        "--gpu-memory-gib",
        "141",
        "--seq-len",
        "4096",
        "--peak-tflops",
        "989",
    ];
    args.extend_from_slice(extra);
    run(root, &args)
}

#[test]
fn plan_nnodes_predicts_the_cross_node_all_reduce_and_says_what_is_not_built() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, out, err) =
        plan_27b_with(tmp.path(), &["--nnodes", "2", "--inter-node-gbps", "200"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let section = out
        .split_once("cross-node scaling, 2 nodes at 200 Gb/s")
        .unwrap_or_else(|| panic!("no cross-node section:\n{out}"))
        .1;
    assert!(
        section.contains("one flat group") && section.contains("not built yet"),
        "{section}"
    );
    // 1.814 G parameters (the backbone's 1.730 G and the Domino head's 84 M) in fp32 (what
    // sum_in_buckets sums), 2 nodes: ring factor 1, 25 GB/s.
    assert!(
        section.contains("1.814 G drafter parameters x 4 bytes (fp32"),
        "{section}"
    );
    assert!(section.contains("= 7.26 GB"), "{section}");
    assert!(section.contains("= 290.3 ms"), "{section}");
    assert!(
        section.contains("overlap: none in today's code"),
        "{section}"
    );
    assert!(
        section.contains("adds 290.3 ms to the one-node step"),
        "{section}"
    );
    assert!(section.contains("recommended: 2 nodes"), "{section}");

    let (code, out, err) = plan_27b_with(
        tmp.path(),
        &["--nnodes", "2", "--inter-node-gbps", "200", "--json"],
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    let s = &plan["scaling"];
    assert_eq!(s["allreduce_dtype"], "fp32", "{s:#}");
    assert_eq!(s["gradient_bytes"].as_f64(), Some(7_256_921_088.0), "{s:#}");
    assert_eq!(s["ring_factor"].as_f64(), Some(1.0));
    assert!(s["status"].as_str().unwrap().contains("not built"), "{s:#}");
    assert_eq!(s["step"]["verdict"], "adds_to_step", "{s:#}");
    assert_eq!(s["step"]["overlapped_with_backward"], Value::Bool(false));
    let nodes: Vec<u64> = s["table"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["nodes"].as_u64().unwrap())
        .collect();
    assert_eq!(nodes, vec![1, 2, 4, 8, 16]);
    // The one-node row is the plan's own tokens/s.
    let one = s["table"][0]["tokens_per_s"].as_f64().unwrap();
    let run_rate = plan["tokens_per_s_at_mfu"]["run"].as_f64().unwrap();
    assert!((one / run_rate - 1.0).abs() < 1e-9, "{one} vs {run_rate}");

    // Without --nnodes nothing about nodes is printed.
    let (code, out, _) = plan_27b_with(tmp.path(), &[]);
    assert_eq!(code, 0);
    assert!(!out.contains("cross-node"), "{out}");
    let (_, out, _) = plan_27b_with(tmp.path(), &["--json"]);
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert!(plan.get("scaling").is_none(), "{plan:#}");
}

#[test]
fn plan_nnodes_refuses_bad_figures_saying_what_to_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (
            &["--nnodes", "0", "--inter-node-gbps", "200"],
            "pass e.g. --nnodes 2",
        ),
        (
            &["--nnodes", "2", "--inter-node-gbps", "0"],
            "e.g. --inter-node-gbps 200",
        ),
        (&["--nnodes", "2", "--inter-node-gbps=-200"], "found -200"),
        (&["--nnodes", "2", "--inter-node-gbps", "nan"], "found NaN"),
        (
            &["--nnodes", "2", "--inter-node-gbps", "inf"],
            "positive, finite",
        ),
        (&["--nnodes", "2"], "--nnodes needs --inter-node-gbps B"),
        (
            &["--inter-node-gbps", "200"],
            "--inter-node-gbps needs --nnodes N",
        ),
        (
            &[
                "--nnodes",
                "2",
                "--inter-node-gbps",
                "200",
                "--min-scaling-efficiency",
                "1.5",
            ],
            "expected a fraction in (0, 1]",
        ),
    ];
    for (args, says) in cases {
        let mut all = vec!["plan"];
        all.extend_from_slice(args);
        let (code, out, err) = run(tmp.path(), &all);
        assert_eq!(code, 1, "{args:?}: stdout:\n{out}\nstderr:\n{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed a plan: {out}");
    }
}
