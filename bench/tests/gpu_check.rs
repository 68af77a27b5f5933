//! `scripts/gpu-check.sh` under `DEVICE=cpu`: its self-test of every step at reduced shapes
//! passes within its budget and writes the JSON document and summary the GPU run will (a
//! minute or more: `make soak` runs it, `#[ignore]`d here); its step limits never add up to
//! more than its budget (`make test`).
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script() -> PathBuf {
    repo().join("scripts/gpu-check.sh")
}

#[test]
fn the_step_limits_fit_the_budget_and_a_smaller_budget_is_refused() {
    let ok = Command::new(script())
        .arg("--check-budget")
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    let tight = Command::new(script())
        .arg("--check-budget")
        .env("BUDGET_S", "300")
        .output()
        .unwrap();
    assert_eq!(tight.status.code(), Some(2), "{tight:?}");
    assert!(String::from_utf8_lossy(&tight.stderr).contains("over the 300 s budget"));
}

#[test]
#[ignore = "soak (make soak): the script's whole CPU self-test, about a minute"]
fn the_cpu_self_test_passes_within_its_budget_and_records_every_step() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_dflash-bench"));
    let dflashd = bench.with_file_name("dflashd");
    assert!(
        dflashd.exists(),
        "{} is not built: run `cargo build --release -p dflashd` first (make test builds the workspace)",
        dflashd.display()
    );
    let python = std::env::var_os("DFLASH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "no Python with torch at {}: run `make provision` or set DFLASH_PYTHON",
        python.display()
    );
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(script())
        .env("DEVICE", "cpu")
        .env("PYTHON", &python)
        .env("DFLASHD", &dflashd)
        .env("DFLASH_BENCH", &bench)
        .env("OUT", out.path())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{log}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("gpu-check.json")).unwrap()).unwrap();
    assert_eq!(doc["ok"], true, "{doc:#}");
    assert!(doc["elapsed_s"].as_u64().unwrap() <= doc["meta"]["budget_s"].as_u64().unwrap());
    let steps = &doc["steps"];
    for (step, status) in [
        ("doctor", "ok"),
        ("parity", "ok"),
        ("drafter_step", "ok"),
        ("target_layers", "ok"),
        ("multi_gpu", "ok"),
        ("two_node", "ok"),
    ] {
        assert_eq!(steps[step]["status"], status, "{step}: {:#}", steps[step]);
    }
    let doctor = &steps["doctor"]["result"];
    assert!(doctor["nccl_version"]
        .as_str()
        .unwrap()
        .starts_with("NCCL 2."));
    assert_eq!(doctor["sdpa"].as_array().unwrap().len(), 2, "{doctor:#}");
    let shapes = steps["parity"]["result"]["shapes"].as_array().unwrap();
    let multi: Vec<bool> = shapes.iter().map(|s| s["multi_chunk"] == true).collect();
    assert_eq!(
        multi,
        [false, true],
        "a single-chunk and a multi-chunk parity"
    );
    assert!(shapes.iter().all(|s| s["ok"] == true), "{shapes:?}");
    let d = &steps["drafter_step"]["result"];
    let records = d["steps"].as_array().unwrap();
    assert!(records.len() >= 3, "{d:#}");
    for key in [
        "wall_ms",
        "tokens_per_s",
        "draft_positions_per_s",
        "mfu",
        "allocated_mb",
        "reserved_mb",
        "peak_allocated_mb",
        "num_alloc_retries",
        "nvml_used_mb",
        "model_predicted_peak_mb",
        "seq_len",
    ] {
        assert!(
            records.iter().all(|r| r.get(key).is_some()),
            "every step records {key}"
        );
    }
    assert!(
        d["sdpa_backend"].is_string() && d["vocab"].is_i64(),
        "{d:#}"
    );
    let kinds: Vec<&str> = steps["target_layers"]["result"]["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["gated_deltanet", "gated_attention"]);
    let multi = &steps["multi_gpu"]["result"];
    assert!(
        multi["all_reduce"]["bus_gb_per_s"].as_f64().unwrap() > 0.0,
        "{multi:#}"
    );
    assert_eq!(multi["two_rank_step"]["ok"], true, "{multi:#}");
    // Two dflashd nodes of one job: 4 steps each with the job's view, weights agreed.
    let two = &steps["two_node"]["result"];
    for node in two["nodes"].as_array().unwrap() {
        assert_eq!(
            (&node["steps"], &node["weights_agree"]),
            (&4.into(), &true.into()),
            "{two:#}"
        );
    }
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(summary.contains("## Drafter step") && summary.contains("## Target layers"));
    assert!(summary.contains("## Two nodes of one job"), "{summary}");
}
