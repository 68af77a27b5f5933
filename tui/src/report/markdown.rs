//! The status report as markdown, with the sections a hand-over needs.
use std::fmt::Write;

use dflash_shared::format::{format_bytes, format_si};
use dflash_shared::metrics::{chain_and_tree_words, tree_label};

use super::StatusReport;
use crate::app::wording;

fn list(out: &mut String, items: &[String], empty: &str) {
    if items.is_empty() {
        let _ = writeln!(out, "- {empty}");
    }
    for item in items {
        let _ = writeln!(out, "- {item}");
    }
}

/// "objective: D-PACE (α 0.5); drafter head: Domino."
fn recipe_line(run: &super::Run) -> String {
    let unknown = "unknown (the daemon did not report it)";
    format!(
        "objective: {}; drafter head: {}.",
        run.objective.as_deref().unwrap_or(unknown),
        run.drafter_head.as_deref().unwrap_or(unknown)
    )
}

/// "Acceptance: offline τ chain 3.72 · tree@32 4.45; online at step 1,200 (8 prompts, 1.2 s):
/// chain 2.50 · tree@32 3.10; also ddtree_16 3.00, 29% below the offline τ 3.50 of its
/// moment." The tree τ at the serving budget stands beside chain τ, labelled with the budget;
/// a run without tree figures reads "offline τ 3.72" and lists every online method. A Domino
/// drafter's each method comes with its base: "chain 2.50 (base 2.10)".
fn acceptance_line(a: &super::Acceptance) -> String {
    let offline = match (a.offline_tau, a.offline_serve_tree) {
        (Some(t), Some(tree)) => format!(
            "offline τ {}",
            chain_and_tree_words(t, Some((tree.budget, tree.tau)))
        ),
        (Some(t), None) => format!("offline τ {t:.2}"),
        (None, _) => "offline τ unknown".to_string(),
    };
    let Some(o) = &a.online else {
        return format!("Acceptance: {offline}; no online evaluation yet.");
    };
    let methods = online_methods(o);
    let gap = match (o.gap_fraction, o.offline_tau) {
        (Some(g), Some(off)) if g > 0.0 => {
            format!(
                ", {:.0}% below the offline τ {off:.2} of its moment",
                100.0 * g
            )
        }
        (Some(_), Some(off)) => format!(", at or above the offline τ {off:.2} of its moment"),
        _ => String::new(),
    };
    format!(
        "Acceptance: {offline}; online at step {} ({} prompts, {:.1} s): {methods}{gap}.",
        crate::fmt::thousands(o.step),
        o.prompts,
        o.seconds,
    )
}

/// "chain 2.50 · tree@32 3.10; also ddtree_16 3.00, ddtree_64 3.25" where the serving budget
/// was decoded, else "chain 2.50, ddtree_16 3.00". A Domino drafter's each method also decoded
/// from the LM head alone: "chain 2.50 (base 2.10)", the corrected figure first, as everywhere
/// else.
fn online_methods(o: &super::OnlineReport) -> String {
    let words = |name: &str, m: &super::MethodTau| match m.base_tau {
        Some(base) => format!("{name} {:.2} (base {base:.2})", m.tau),
        None => format!("{name} {:.2}", m.tau),
    };
    let Some(serve) = o.serve_tree else {
        let all: Vec<String> = o.methods.iter().map(|m| words(&m.method, m)).collect();
        return all.join(", ");
    };
    let serve_method = format!("ddtree_{}", serve.budget);
    // `methods` lists the chain first, so the headline reads chain, then the tree.
    let (mut headline, mut rest) = (Vec::new(), Vec::new());
    for m in &o.methods {
        if m.method == "chain" {
            headline.push(words(&m.method, m));
        } else if m.method == serve_method {
            headline.push(words(&tree_label(serve.budget), m));
        } else {
            rest.push(words(&m.method, m));
        }
    }
    if rest.is_empty() {
        headline.join(" · ")
    } else {
        format!("{}; also {}", headline.join(" · "), rest.join(", "))
    }
}

pub fn render(report: &StatusReport) -> String {
    let mut out = String::new();
    let name = report.run.name.as_deref().unwrap_or("unknown run");
    let _ = writeln!(out, "# dflash status: {name}\n");
    let _ = writeln!(out, "_Generated {}._\n", report.generated_at);

    let _ = writeln!(out, "## Goal\n\n{}\n", report.goal);

    let _ = writeln!(out, "## Constraints & Preferences\n");
    list(&mut out, &report.constraints, "none recorded");

    write_progress(&mut out, report);
    write_key_decisions(&mut out, report);
    let _ = writeln!(out, "\n## Next Steps\n");
    list(&mut out, &report.next_steps, "none");

    write_critical_context(&mut out, report);
    write_alerts(&mut out, report);
    write_resources(&mut out, report);
    write_timeline(&mut out, report);
    write_relevant_files(&mut out, report);
    out
}

fn write_progress(out: &mut String, report: &StatusReport) {
    let _ = writeln!(out, "\n## Progress\n\n### Done\n");
    list(out, &report.progress.done, "nothing recorded yet");
    let _ = writeln!(out, "\n### In Progress\n");
    list(out, &report.progress.in_progress, "nothing running");
    let _ = writeln!(out, "\n### Blocked\n");
    list(out, &report.progress.blocked, "nothing");
}

fn write_key_decisions(out: &mut String, report: &StatusReport) {
    let _ = writeln!(out, "\n## Key Decisions\n");
    let decisions: Vec<String> = report
        .key_decisions
        .iter()
        .map(|e| format!("{}: {}", e.at, e.text))
        .collect();
    list(out, &decisions, "no operator action recorded");
    if !report.unconfirmed_requests.is_empty() {
        let _ = writeln!(out, "\n### Requested, never confirmed (no decision)\n");
        list(out, &report.unconfirmed_requests, "none");
    }
}

/// Throughput, the recipe, the job and the acceptance: the first lines of Critical Context.
fn write_critical_context(out: &mut String, report: &StatusReport) {
    let _ = writeln!(out, "\n## Critical Context\n");
    let t = &report.throughput;
    let throughput = match (t.tokens_per_s, t.baseline_tokens_per_s) {
        (Some(now), Some(base)) => format!(
            "Throughput {} tok/s against a baseline of {} ({:.0}%).",
            format_si(now),
            format_si(base),
            100.0 * now / base.max(f64::MIN_POSITIVE)
        ),
        (Some(now), None) => format!("Throughput {} tok/s; no baseline yet.", format_si(now)),
        _ => "Throughput unknown (no status from the daemon).".into(),
    };
    let _ = writeln!(out, "- {throughput}");
    if let Some(clock) = record_clock_line(t) {
        let _ = writeln!(out, "- {clock}");
    }
    if let Some(record) = &report.healthy_record_summary {
        let _ = writeln!(out, "- {record}");
    }
    if let Some(positions) = t.draft_positions_per_s.filter(|p| *p > 0.0) {
        let mfu = t.mfu.map_or_else(
            || "MFU unknown (no peak for a device)".to_string(),
            |m| format!("MFU {:.1}%", 100.0 * m),
        );
        let _ = writeln!(out, "- {} draft positions/s; {mfu}.", format_si(positions));
    }
    let _ = writeln!(out, "- {}", recipe_line(&report.run));
    if let Some(job) = &report.run.job {
        let _ = writeln!(out, "- Job: {}.", job.words());
    }
    let _ = writeln!(out, "- {}", acceptance_line(&report.acceptance));
    if let Some(d) = &report.acceptance.domino {
        let _ = writeln!(
            out,
            "- {} on the training batch at step {} (teacher-forced: the metrics' \
             `base_accept_len` → `accept_len`).",
            d.words(),
            crate::fmt::thousands(d.step)
        );
    }
    if let Some(d) = &report.acceptance.dspark {
        let _ = writeln!(
            out,
            "- DSpark {}; {} on the training batch at step {} (the metrics' \
             `base_tau_probabilistic` → `tau_probabilistic`).",
            d.acceptance_words(),
            d.calibration_words(),
            crate::fmt::thousands(d.step)
        );
    }
}

/// The worst alert with what preceded it; the others by their headline (Progress lists them
/// all).
fn write_alerts(out: &mut String, report: &StatusReport) {
    for (i, alert) in report.alerts.iter().enumerate() {
        let text = if i == 0 {
            &alert.explanation
        } else {
            &alert.headline
        };
        let _ = writeln!(
            out,
            "- {} alert: {}",
            wording::severity_word(alert.level),
            text
        );
    }
}

/// GPUs, the queue and the caches.
fn write_resources(out: &mut String, report: &StatusReport) {
    match &report.gpus_unavailable {
        Some(reason) => {
            let _ = writeln!(out, "- GPUs: {reason}.");
        }
        None => {
            let _ = writeln!(out, "- GPUs: {} reporting.", report.gpus.len());
        }
    }
    let q = &report.queue;
    let depth = match (q.depth, q.capacity, q.low_watermark, q.high_watermark) {
        (Some(d), Some(c), Some(lo), Some(hi)) => {
            format!("depth {d} of {c} (watermarks {lo}/{hi})")
        }
        _ => "depth unknown".into(),
    };
    let _ = writeln!(out, "- Queue: {depth}; {}.", q.bound_by);
    for cache in &report.caches {
        let note = report
            .cache_notes
            .iter()
            .find(|(name, _)| *name == cache.name)
            .map_or_else(String::new, |(_, note)| format!(" ({note})"));
        let _ = writeln!(
            out,
            "- {}: {}, {}, {}{note}.",
            wording::cache_label(&cache.name),
            if cache.present { "present" } else { "missing" },
            format_bytes(cache.size_bytes),
            if cache.warm { "warm" } else { "cold" }
        );
    }
}

fn write_timeline(out: &mut String, report: &StatusReport) {
    let _ = writeln!(
        out,
        "\n### Timeline of changes (environment, caches, restarts, throughput)\n"
    );
    let timeline: Vec<String> = report
        .timeline
        .iter()
        .map(|e| format!("{} [{}] {}", e.at, e.category.word(), e.text))
        .collect();
    list(out, &timeline, "no change recorded in the journal");
}

fn write_relevant_files(out: &mut String, report: &StatusReport) {
    let _ = writeln!(out, "\n## Relevant Files\n");
    let f = &report.files;
    let unknown = || "unknown".to_string();
    let _ = writeln!(
        out,
        "- Config: {}",
        f.config
            .clone()
            .unwrap_or_else(|| "embedded default".into())
    );
    let _ = writeln!(
        out,
        "- Run dir: {}",
        f.run_dir.clone().unwrap_or_else(unknown)
    );
    let _ = writeln!(
        out,
        "- Checkpoints: {} (latest: {})",
        f.checkpoints.len(),
        f.latest_checkpoint.clone().unwrap_or_else(|| "none".into())
    );
    let best = match (&f.best_checkpoint, &f.no_best_checkpoint) {
        (Some(b), _) => format!("{} ({})", b.words(), b.path),
        (None, Some(why)) => format!("none, {why}"),
        (None, None) => "none recorded".into(),
    };
    let _ = writeln!(out, "- Best checkpoint: {best}");
    let _ = writeln!(out, "- Journal: {}", f.journal);
    let _ = writeln!(out, "- Logs: {}", f.logs);
    if f.data.is_empty() {
        let _ = writeln!(out, "- Data: see the config");
    } else {
        let _ = writeln!(out, "- Data: {}", f.data.join(", "));
    }
}

/// Where the healthy record's clock stands: when the stretch began and when the record falls
/// due, or when it was last written.
fn record_clock_line(t: &super::Throughput) -> Option<String> {
    let since = t.stable_since.as_deref()?;
    let mut line = format!("Healthy since {since}");
    if t.drop_timed {
        line.push_str("; a drop below the Warn line is being timed, and the record waits");
    } else if let Some(due) = &t.healthy_record_due {
        line.push_str(&format!("; the healthy record is due at {due}"));
    } else if let Some(written) = &t.healthy_record_written {
        line.push_str(&format!(
            "; the healthy record was last written at {written}"
        ));
    }
    Some(format!("{line}."))
}
