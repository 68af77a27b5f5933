//! `dflashd config validate/show` (refusing what `start` refuses, on the embedded data too), and
//! locked keys across restarts of a real daemon: a change is refused naming the key, unless an
//! unlock was confirmed (and journaled) on the socket.

use std::path::Path;

use crate::support::binary::{journal, request_and_confirm, run, write_config, Daemon};
use crate::support::in_process::Client;
use dflash_shared::actions::Action;
use dflash_shared::config::{Config, EMBEDDED_DEFAULT_TOML};
use dflash_shared::events::EventKind;
use dflash_shared::protocol::Response;

#[test]
fn validate_names_the_bad_key_and_show_prints_every_default() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let bad = root.join("bad.toml");
    let text = EMBEDDED_DEFAULT_TOML.replace("num_anchors = 16", "num_anchors = \"many\"");
    std::fs::write(&bad, text).unwrap();
    let (code, stdout, stderr) = run(root, &["config", "validate", &bad.display().to_string()]);
    assert_eq!(code, 1, "{stdout}");
    for needle in ["bad.toml", "training.num_anchors", "(line ", "\"many\""] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    std::fs::write(
        &bad,
        EMBEDDED_DEFAULT_TOML.replace("eval_every = 50", "eval_evry = 50"),
    )
    .unwrap();
    let (code, _, stderr) = run(root, &["config", "validate", &bad.display().to_string()]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("training.eval_evry") && stderr.contains("did you mean `eval_every`"),
        "{stderr}"
    );

    let (code, shown, stderr) = run(root, &["config", "show"]);
    assert_eq!(code, 0, "{stderr}");
    let parsed = Config::from_toml_str(&shown, "shown").unwrap();
    assert_eq!(parsed, Config::embedded_default());
    assert!(
        shown.contains("[detectors.throughput]"),
        "defaults are filled in:\n{shown}"
    );
    let good = root.join("good.toml");
    std::fs::write(&good, &shown).unwrap();
    let (code, stdout, _) = run(root, &["config", "validate", &good.display().to_string()]);
    assert_eq!((code, stdout.contains("valid")), (0, true), "{stdout}");
    let (code, again, _) = run(root, &["config", "show", &good.display().to_string()]);
    assert_eq!(code, 0);
    assert_eq!(Config::from_toml_str(&again, "again").unwrap(), parsed);
}

/// `config validate FILE` and `start --config FILE` (one step at most), each `(exit code,
/// stderr)`.
pub(crate) fn validate_and_start(
    root: &Path,
    file: &Path,
) -> ((i32, String), (Option<i32>, String)) {
    let path = file.display().to_string();
    let (code, _, stderr) = run(root, &["config", "validate", &path]);
    let mut d = Daemon::spawn(root, &["--config", &path, "--max-steps", "1"]);
    let status = d.wait_exit();
    ((code, stderr), (status.code(), d.stderr()))
}

#[test]
fn validate_refuses_what_start_refuses_on_the_embedded_data() {
    // 852 training samples: the embedded data's 900 lines, 48 held out. `validate` used to
    // skip its dataset checks for `train_file = "embedded"` and call this config valid.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let file = root.join("huge-batch.toml");
    write_config(&file, |c| c.training.batch_size = 100_000);
    let ((code, validate), (start, started)) = validate_and_start(root, &file);
    let needles = [
        "training.batch_size",
        "at most the 852 training samples (900 in the data, 48 held out)",
        "found 100000",
    ];
    assert_eq!(code, 1, "{validate}");
    assert_ne!(start, Some(0), "{started}");
    for needle in needles {
        assert!(
            validate.contains(needle),
            "validate: {needle:?} missing:\n{validate}"
        );
        assert!(
            started.contains(needle),
            "start: {needle:?} missing:\n{started}"
        );
    }
}

#[test]
fn early_stopping_true_is_refused_by_validate_and_start() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let file = root.join("early.toml");
    std::fs::write(
        &file,
        EMBEDDED_DEFAULT_TOML.replace("early_stopping = false", "early_stopping = true"),
    )
    .unwrap();
    let ((code, validate), (start, started)) = validate_and_start(root, &file);
    assert_eq!(code, 1, "{validate}");
    assert_ne!(start, Some(0), "{started}");
    for needle in [
        "training.early_stopping (line ",
        "6 full epochs and has no early stopping",
        "remove the key, or set it to false",
    ] {
        assert!(
            validate.contains(needle),
            "validate: {needle:?} missing:\n{validate}"
        );
        assert!(
            started.contains(needle),
            "start: {needle:?} missing:\n{started}"
        );
    }
    // `false`, what old configs carry, stays valid.
    let old = root.join("old.toml");
    std::fs::write(&old, EMBEDDED_DEFAULT_TOML).unwrap();
    let (code, stdout, stderr) = run(root, &["config", "validate", &old.display().to_string()]);
    assert_eq!(code, 0, "{stdout}{stderr}");
}

fn confirm(c: &mut Client, action: Action) -> String {
    match request_and_confirm(c, action) {
        (id, Response::Executed { outcome, .. }) => {
            assert!(outcome.contains("unlocked"), "{outcome}");
            id
        }
        (_, other) => panic!("{other:?}"),
    }
}

#[test]
fn a_locked_key_change_on_resume_is_refused_unless_unlocked() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (old, new, epochs) = (
        root.join("old.toml"),
        root.join("new.toml"),
        root.join("epochs.toml"),
    );
    write_config(&old, |_| {});
    write_config(&new, |c| c.training.num_anchors = 8);
    write_config(&epochs, |c| c.training.epochs = 3);
    let cfg = |p: &Path| p.display().to_string();

    let mut d = Daemon::spawn(root, &["--config", &cfg(&old), "--max-steps", "2"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());

    // Changed locked keys: refused with exit 2, the key and both values named.
    for (file, needle) in [
        (&epochs, "training.epochs: 6 → 3"),
        (&new, "training.num_anchors: 16 → 8"),
    ] {
        let mut d = Daemon::spawn(root, &["--config", &cfg(file), "--max-steps", "1"]);
        let status = d.wait_exit();
        assert_eq!(status.code(), Some(2), "{}", d.stderr());
        assert!(
            d.stderr().contains(needle),
            "{needle:?} missing:\n{}",
            d.stderr()
        );
        assert!(d.stderr().contains("unlock"), "{}", d.stderr());
    }
    let paused = journal(&d.run_dir).into_iter().any(
        |e| matches!(e.kind, EventKind::RunPaused { reason } if reason.contains("training.epochs")),
    );
    assert!(paused, "the refusal is journaled");

    // While the run is up under its old config, an operator unlocks the key on the socket.
    let mut d = Daemon::spawn(root, &["--config", &cfg(&old)]);
    let mut c = d.client();
    let id = confirm(
        &mut c,
        Action::UnlockKey {
            key: "training.num_anchors".into(),
        },
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success());

    // The restart with the new value is accepted, once, and the acceptance is journaled.
    let mut d = Daemon::spawn(root, &["--config", &cfg(&new), "--max-steps", "1"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    let accepted = journal(&d.run_dir).into_iter().any(|e| {
        matches!(&e.kind, EventKind::Note { message } if message.contains("training.num_anchors changed 16 → 8") && message.contains(&id))
    });
    assert!(accepted, "the accepted change names the unlock");
    // The unlocked epochs key was not part of it: still refused.
    let mut d = Daemon::spawn(root, &["--config", &cfg(&epochs), "--max-steps", "1"]);
    assert_eq!(d.wait_exit().code(), Some(2));
}

#[test]
fn an_environment_drift_holds_the_resume_until_its_token_is_given() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut d = Daemon::spawn(root, &["--max-steps", "1"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    // What a swapped libtorch looks like to the next start: the recorded environment differs.
    let path = d.run_dir.join("fingerprint.json");
    let mut fp: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let now = fp["libtorch_version"]
        .as_str()
        .unwrap_or("(absent)")
        .to_string();
    fp["libtorch_version"] = "2.9.1+cu130".into();
    std::fs::write(&path, serde_json::to_vec(&fp).unwrap()).unwrap();

    let mut held = Daemon::spawn(root, &["--max-steps", "1"]);
    assert_eq!(held.wait_exit().code(), Some(3), "{}", held.stderr());
    let err = held.stderr();
    assert!(
        err.contains(&format!("libtorch 2.9.1+cu130 → {now}")),
        "{err}"
    );
    let token = err
        .split("--accept-drift ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no token in: {err}"))
        .to_string();
    let drift = journal(&d.run_dir).into_iter().any(
        |e| matches!(e.kind, EventKind::EnvironmentDrift { ref field, .. } if field == "libtorch"),
    );
    assert!(drift, "the drift is journaled");
    let mut wrong = Daemon::spawn(root, &["--max-steps", "1", "--accept-drift", "0000"]);
    assert_eq!(wrong.wait_exit().code(), Some(3));

    let mut accepted = Daemon::spawn(root, &["--max-steps", "1", "--accept-drift", &token]);
    assert!(accepted.wait_exit().success(), "{}", accepted.stderr());
    assert!(
        accepted.stdout().contains("resumed at step 1"),
        "{}",
        accepted.stdout()
    );
}

#[test]
fn a_new_code_commit_resumes_on_its_own_and_is_journaled() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut d = Daemon::spawn(root, &["--max-steps", "1"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    // What the previous start recorded when it was built at another commit and version.
    let path = d.run_dir.join("fingerprint.json");
    let mut fp: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let old_commit = "0123456789abcdef0123456789abcdef01234567";
    fp["code_git_commit"] = old_commit.into();
    fp["dflashd_version"] = "0.0.1".into();
    std::fs::write(&path, serde_json::to_vec(&fp).unwrap()).unwrap();

    let mut rebuilt = Daemon::spawn(root, &["--max-steps", "2"]);
    assert!(rebuilt.wait_exit().success(), "{}", rebuilt.stderr());
    let out = rebuilt.stdout();
    assert!(
        out.contains("resumed at step 1") && out.contains("changed:  dflashd 0.0.1 → "),
        "{out}"
    );
    assert!(out.contains("code commit 0123456789ab → "), "{out}");
    let events = journal(&d.run_dir);
    let changed = events.iter().any(|e| {
        matches!(&e.kind, EventKind::EnvironmentChanged { field, before, .. }
            if field == "code_git_commit" && before == old_commit)
    });
    assert!(
        changed,
        "the commit change is journaled with before → after"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::EnvironmentDrift { .. })),
        "a commit change is not a drift"
    );

    // The same rebuild next to a swapped torch is still held.
    let mut fp: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    fp["code_git_commit"] = old_commit.into();
    fp["libtorch_version"] = "2.9.1+cu130".into();
    std::fs::write(&path, serde_json::to_vec(&fp).unwrap()).unwrap();
    let mut held = Daemon::spawn(root, &["--max-steps", "3"]);
    assert_eq!(held.wait_exit().code(), Some(3), "{}", held.stderr());
    let err = held.stderr();
    assert!(err.contains("libtorch 2.9.1+cu130 → "), "{err}");
    assert!(
        err.contains("Also changed (informational, does not hold the run): code commit"),
        "{err}"
    );
}

#[test]
fn a_run_keeps_its_objective_a_switch_to_dpace_is_refused_without_an_unlock_offer() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (dflash, dpace) = (root.join("dflash.toml"), root.join("dpace.toml"));
    write_config(&dflash, |_| {});
    write_config(&dpace, |c| {
        c.training.objective = dflash_shared::config::Objective::Dpace;
    });
    let cfg = |p: &Path| p.display().to_string();
    let mut d = Daemon::spawn(root, &["--config", &cfg(&dflash), "--max-steps", "1"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());

    let mut refused = Daemon::spawn(root, &["--config", &cfg(&dpace), "--max-steps", "1"]);
    assert_eq!(refused.wait_exit().code(), Some(2), "{}", refused.stderr());
    let err = refused.stderr();
    assert!(
        err.contains("training.objective") && err.contains("\"dflash\" → \"dpace\""),
        "{err}"
    );
    assert!(err.contains("new run"), "{err}");
    assert!(!err.contains("press U"), "an unlock would not help: {err}");
}

#[test]
fn an_unlocked_epochs_change_resumes_the_checkpoint_and_a_tap_count_change_never_does() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (old, longer, wider) = (
        root.join("old.toml"),
        root.join("longer.toml"),
        root.join("wider.toml"),
    );
    write_config(&old, |_| {});
    write_config(&longer, |c| c.training.epochs = 8);
    write_config(&wider, |c| c.drafter.target_layer_ids = vec![0, 1, 3]);
    let cfg = |p: &Path| p.display().to_string();

    let mut d = Daemon::spawn(root, &["--config", &cfg(&old), "--max-steps", "2"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    let six_epochs = total_steps(&d.stdout());

    // A different number of tap layers cannot carry the weights: refused, no unlock offered.
    let mut refused = Daemon::spawn(root, &["--config", &cfg(&wider), "--max-steps", "1"]);
    assert_eq!(refused.wait_exit().code(), Some(2), "{}", refused.stderr());
    let err = refused.stderr();
    assert!(
        err.contains("drafter.target_layer_ids") && err.contains("fc input"),
        "{err}"
    );
    assert!(!err.contains("press U"), "an unlock would not help: {err}");

    // The operator unlocks epochs on the socket while the run is up under its old config.
    let mut d = Daemon::spawn(root, &["--config", &cfg(&old)]);
    let mut c = d.client();
    let id = confirm(
        &mut c,
        Action::UnlockKey {
            key: "training.epochs".into(),
        },
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success(), "{}", d.stderr());

    // The checkpoint resumes under 8 epochs: its weights and data position carry over and
    // the schedule is recomputed from the new total.
    let mut resumed = Daemon::spawn(root, &["--config", &cfg(&longer), "--max-steps", "1"]);
    assert!(resumed.wait_exit().success(), "{}", resumed.stderr());
    let out = resumed.stdout();
    assert!(out.contains("resumed at step"), "{out}");
    assert_eq!(total_steps(&out), six_epochs / 6 * 8, "{out}");
    let noted = journal(&d.run_dir).into_iter().any(|e| {
        matches!(&e.kind, EventKind::Note { message }
            if message.contains("training.epochs changed 6 → 8") && message.contains(&id))
    });
    assert!(noted, "the accepted change is journaled with its unlock");
    // Later starts under the new value need no further unlock.
    let mut again = Daemon::spawn(root, &["--config", &cfg(&longer), "--max-steps", "1"]);
    assert!(again.wait_exit().success(), "{}", again.stderr());
}

/// "... N steps in total ..." from the start banner.
fn total_steps(banner: &str) -> u64 {
    banner
        .split(" steps in total")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no total in: {banner}"))
}

/// The 1-based line of the first line of `text` that starts with `prefix`.
pub(crate) fn line_of(text: &str, prefix: &str) -> usize {
    text.lines().position(|l| l.starts_with(prefix)).unwrap() + 1
}

/// `config validate` on `text`: its exit code and stderr.
fn validate(root: &Path, name: &str, text: &str) -> (i32, String) {
    let path = root.join(name);
    std::fs::write(&path, text).unwrap();
    let (code, stdout, stderr) = run(root, &["config", "validate", &path.display().to_string()]);
    (code, format!("{stderr}{stdout}"))
}

fn assert_has(out: &str, needles: &[&str]) {
    for needle in needles {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }
}

#[test]
fn validate_refuses_what_start_would_refuse_without_loading_weights_naming_the_toml_key() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // 10 samples (and blank lines, which are not samples).
    let data = root.join("train.jsonl");
    let line =
        "{\"input_ids\":[1,2,3,4,5,6,7,8,9,10,11,12],\"loss_mask\":[1,1,1,1,1,1,1,1,1,1,1,1]}\n";
    std::fs::write(&data, format!("{}\n\n", line.repeat(10))).unwrap();
    let on_file = EMBEDDED_DEFAULT_TOML
        .replace(
            "train_file = \"embedded\"",
            &format!("train_file = \"{}\"", data.display()),
        )
        .replace("held_out_samples = 48", "held_out_samples = 2");

    // The batch size against the data (the 100,000), and a missing telemetry.python.
    let text = on_file.replace("batch_size = 8", "batch_size = 100000")
        + "\n[telemetry]\npython = \"/nonexistent/python3\"\n";
    let (code, out) = validate(root, "batch.toml", &text);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            &format!(
                "training.batch_size (line {})",
                line_of(&text, "batch_size")
            ),
            "at most the 8 training samples (10 in the data, 2 held out)",
            &format!("telemetry.python (line {})", line_of(&text, "python =")),
            "/nonexistent/python3 (no such file)",
        ],
    );
    // The held-out count, named by the key that set it.
    let text = on_file.replace("held_out_samples = 2", "held_out_samples = 5000");
    let (code, out) = validate(root, "held_out.toml", &text);
    assert_eq!(code, 1, "{out}");
    assert_has(&out, &["data.held_out_samples (line ", "5000 held out"]);

    // Chat data on the embedded target is refused with data.tokenizer set too.
    let tokenizer = root.join("tokenizer.json");
    std::fs::write(&tokenizer, "{}").unwrap();
    let text = on_file
        .replace("format = \"pretokenized\"", "format = \"chat\"")
        .replace(
            "[topology]",
            &format!("tokenizer = \"{}\"\n\n[topology]", tokenizer.display()),
        );
    let (code, out) = validate(root, "chat.toml", &text);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[&format!(
            "data.format (line {})",
            line_of(&text, "format =")
        )],
    );

    // A broken array is reported on its own line.
    let text =
        EMBEDDED_DEFAULT_TOML.replace("target_layer_ids = [1, 3]", "target_layer_ids = [1, 3");
    let (code, out) = validate(root, "array.toml", &text);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[&format!("line {}", line_of(&text, "target_layer_ids"))],
    );
    assert!(
        !out.contains(&format!(
            "syntax error at line {}",
            line_of(&text, "target_layer_ids") + 1
        )),
        "{out}"
    );

    // Tap layers and the mask token against the embedded target (6 layers, vocab 512)...
    let text = EMBEDDED_DEFAULT_TOML
        .replace("target_layer_ids = [1, 3]", "target_layer_ids = [1, 9]")
        .replace("mask_token_id = 511", "mask_token_id = 600");
    let (code, out) = validate(root, "embedded_shape.toml", &text);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            &format!(
                "drafter.target_layer_ids[1] (line {})",
                line_of(&text, "target_layer_ids")
            ),
            "9 (the target has 6 layers)",
            &format!(
                "drafter.mask_token_id (line {})",
                line_of(&text, "mask_token_id")
            ),
            "600 (the target's vocabulary has 512)",
        ],
    );
    // ... and against a Hugging Face target's config.json (3 layers, vocab 160), no weights read.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/target/qwen3");
    let text = EMBEDDED_DEFAULT_TOML.replace(
        "model = \"embedded\"",
        &format!("model = \"{}\"", fixture.display()),
    );
    let (code, out) = validate(root, "hf_shape.toml", &text);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            "drafter.target_layer_ids[1] (line ",
            "3 (the target has 3 layers)",
            "511 (the target's vocabulary has 160)",
            "drafter.hidden_size (line ",
        ],
    );
    assert!(
        !out.contains("num_hidden_layers") && !out.contains("vocab_size"),
        "{out}"
    );
}
