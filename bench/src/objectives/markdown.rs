//! The tournament's tables: one row per objective (median and min–max over seeds), one row per
//! run, and the verdict.
use std::fmt::Write;

use super::summary::{ContenderSummary, LossCurve, Spread};
use super::ObjectivesResult;

fn spread(s: Option<Spread>, digits: usize) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits),
        Some(s) => format!("{:.d$}", s.median, d = digits),
        None => "–".into(),
    }
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The training loss curves: each epoch's mean loss, median (min–max) over seeds. Objectives
/// weigh positions differently (D-PACE's sum is per sequence), so a curve is read against its
/// own objective's, not across.
fn loss_by_epoch(r: &ObjectivesResult) -> String {
    let epochs = r
        .summaries
        .iter()
        .map(|s| s.loss_by_epoch.len())
        .max()
        .unwrap_or(0);
    if epochs == 0 {
        return String::new();
    }
    let mut md = String::from(
        "Training loss, mean per epoch (median over seeds, min–max):\n\n| objective |",
    );
    for e in 1..=epochs {
        let _ = write!(md, " epoch {e} |");
    }
    let _ = writeln!(md, "\n|{}", "---|".repeat(epochs + 1));
    for s in &r.summaries {
        let _ = write!(md, "| {} |", s.contender.label());
        for e in 0..epochs {
            let _ = write!(md, " {} |", spread(s.loss_by_epoch.get(e).copied(), 3));
        }
        md.push('\n');
    }
    md.push('\n');
    md
}

/// One row per objective, best first by the figure the tournament ranks by (an objective
/// without it last, in the tournament's order).
fn summary_table(r: &ObjectivesResult) -> String {
    let o = &r.options;
    let budgets = &o.tree_budgets;
    let oracle_budgets: Vec<usize> = r
        .summaries
        .iter()
        .flat_map(|s| s.offline_tree_oracle.keys().copied())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let recall_ks = [1usize, 2, 4];
    let mut head = format!(
        "| rank ({}) | objective | seeds | held-out offline τ | online chain τ |",
        String::from(o.rank_by)
    );
    for b in budgets {
        let _ = write!(head, " online ddtree_{b} τ |");
    }
    for b in &oracle_budgets {
        let _ = write!(head, " oracle τ@{b} |");
    }
    let _ = write!(
        head,
        " top-{} recall |",
        recall_ks.map(|k| k.to_string()).join(" / ")
    );
    head.push_str(
        " loss first / median / last | step ms (median) | peak RSS MiB | base τ (LM head alone) offline / online chain |",
    );
    let mut md = format!(
        "{head}\n|{}\n",
        "---|".repeat(10 + budgets.len() + oracle_budgets.len())
    );
    let mut order: Vec<_> = r.summaries.iter().collect();
    let key = |s: &&ContenderSummary| s.ranked(o.rank_by).map(|x| x.median);
    order.sort_by(|a, b| match (key(a), key(b)) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    for (rank, s) in order.into_iter().enumerate() {
        let mut row = format!(
            "| {} | {} | {} | {} | {} |",
            rank + 1,
            s.contender.label(),
            s.seeds.len(),
            spread(s.offline_tau, 3),
            spread(s.online_chain_tau, 3)
        );
        for b in budgets {
            let _ = write!(row, " {} |", spread(s.online_ddtree_tau.get(b).copied(), 3));
        }
        for b in &oracle_budgets {
            let _ = write!(
                row,
                " {} |",
                spread(s.offline_tree_oracle.get(b).copied(), 3)
            );
        }
        let recalls: Vec<String> = recall_ks
            .iter()
            .map(|k| opt(s.offline_topk_recall.get(k).map(|x| x.median), 3))
            .collect();
        let _ = write!(
            row,
            " {} | {} / {} / {} | {} | {} | {} / {} |",
            recalls.join(" / "),
            spread(s.loss_first, 3),
            spread(s.loss_median, 3),
            spread(s.loss_last, 3),
            spread(s.median_step_ms, 1),
            spread(s.peak_rss_mib, 0),
            spread(s.offline_base_tau, 3),
            spread(s.online_chain_base_tau, 3)
        );
        let _ = writeln!(md, "{row}");
    }
    md
}

/// One row per training run.
fn runs_table(r: &ObjectivesResult) -> String {
    let mut md = String::from(
        "| objective | seed | steps | offline τ (trainer's last, at step) | online chain τ | lossless | loss first / median / last | step ms | peak RSS MiB | wall s | error |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for run in &r.runs {
        let curve = LossCurve::of(&run.loss).map_or("–".into(), |l| {
            format!("{:.3} / {:.3} / {:.3}", l.first, l.median, l.last)
        });
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} ({} at {}) | {} | {} | {curve} | {} | {} | {} | {} |",
            run.contender.map_or("?", |c| c.label()),
            run.seed,
            run.steps,
            opt(run.offline_tau, 3),
            opt(run.trainer_tau, 3),
            run.trainer_tau_step.map_or("–".into(), |s| s.to_string()),
            opt(run.online_chain_tau, 3),
            run.online_lossless
                .map_or("–", |l| if l { "yes" } else { "no" }),
            opt(run.median_step_ms, 1),
            opt(run.peak_rss_mib, 0),
            opt(run.wall_s, 0),
            run.error.as_deref().unwrap_or("")
        );
    }
    md
}

pub fn render(r: &ObjectivesResult) -> String {
    let o = &r.options;
    let mut md = format!(
        "### Objective tournament ({} data; {}; seeds {:?}; {} epoch(s), at most {} steps per run; ranked by {})\n\n",
        r.data,
        r.dflashd_version,
        o.seeds,
        o.epochs,
        o.max_steps,
        o.rank_by.figure()
    );
    md.push_str(&summary_table(r));
    let _ = writeln!(md, "\n**Verdict:** {}.\n", r.verdict.sentence());
    for gain in &r.tree_gains {
        let _ = writeln!(md, "- {gain}.");
    }
    if !r.tree_gains.is_empty() {
        md.push('\n');
    }
    if let Some(g) = &r.regeneration {
        let _ = writeln!(
            md,
            "Regenerated data: `{}` ({:.0} s): {} of {} conversations changed; {} rows loaded; \
             supervised tokens {} → {}.\n",
            g.command,
            g.wall_s,
            g.rows_changed,
            g.conversations,
            g.rows,
            g.supervised_tokens_original,
            g.supervised_tokens_regenerated
        );
    }
    md.push_str(&loss_by_epoch(r));
    md.push_str(&runs_table(r));
    md.push('\n');
    md
}
