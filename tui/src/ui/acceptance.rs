//! Acceptance figures as the Overview words them: chain τ with the tree τ at the serving budget
//! beside it ("τ chain 3.72 · tree@32 4.45"), held-out and online. The drafter is served with
//! DDTree, so wherever chain τ is shown the tree figure it is judged by stands beside it,
//! labelled with its budget.
use dflash_shared::metrics::{chain_and_tree_words, OnlineAcceptance, TreeOracleTau};

use crate::app::App;

/// The held-out figures of the Run panel's loss row: "τ chain 3.72 · tree@32 4.45"; "τ 3.72"
/// when the evaluation scored no tree (a daemon older than the tree figures); "τ —" before
/// the first evaluation.
pub fn held_out_words(tau: Option<f64>, tree: Option<&TreeOracleTau>) -> String {
    match (tau, tree.and_then(TreeOracleTau::at_serve_budget)) {
        (Some(chain), Some(tree)) => format!("τ {}", chain_and_tree_words(chain, Some(tree))),
        (Some(chain), None) => format!("τ {chain:.2}"),
        (None, _) => "τ —".into(),
    }
}

/// An online evaluation's methods: "chain 2.50 · tree@32 3.10" where the serving budget was
/// decoded (the other budgets are in the τ chart and `dflash-tui status`); otherwise every
/// method by its `dflashd eval --online` name, "chain 2.50 · ddtree_16 2.75".
pub fn online_words(a: &OnlineAcceptance) -> String {
    match a.serve_tau_ddtree() {
        Some(tree) => chain_and_tree_words(a.tau_chain, Some(tree)),
        None => a
            .methods()
            .iter()
            .map(|(m, t)| format!("{m} {t:.2}"))
            .collect::<Vec<_>>()
            .join(" · "),
    }
}

/// The run-ending panel's acceptance row: "final τ: held-out chain 3.91 · tree@32 4.45;
/// online chain 2.50 · tree@32 3.10 (step 31,000)". `None` when the run ended before any
/// evaluation. The last metrics line is the run's last word; the last status may predate it.
pub fn ending_words(app: &App) -> Option<String> {
    let status = app.status.as_ref();
    let last = app.telemetry.last_metrics.as_ref();
    let (tau, tree) = match last.and_then(|m| m.tau.map(|t| (t, m.tau_tree.as_ref()))) {
        Some((tau, tree)) => (Some(tau), tree),
        None => (
            status.and_then(|s| s.last_tau),
            status.and_then(|s| s.last_tau_tree.as_ref()),
        ),
    };
    let held_out = tau.map(|chain| {
        let tree = tree.and_then(TreeOracleTau::at_serve_budget);
        format!("held-out {}", chain_and_tree_words(chain, tree))
    });
    let online = app.last_online().map(|o| {
        format!(
            "online {} (step {})",
            online_words(&o.acceptance),
            crate::fmt::thousands(o.step)
        )
    });
    let words = match (held_out, online) {
        (Some(h), Some(o)) => format!("{h}; {o}"),
        (h, o) => h.or(o)?,
    };
    Some(format!("final τ: {words}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn online(serve_tree_budget: Option<usize>) -> OnlineAcceptance {
        OnlineAcceptance {
            tau_chain: 2.5,
            tau_ddtree: BTreeMap::from([(16, 2.75), (32, 3.25)]),
            serve_tree_budget,
            offline_tau: None,
            base: None,
            prompts: 8,
            seconds: 1.0,
        }
    }

    #[test]
    fn held_out_tau_carries_the_tree_figure_at_the_serving_budget_when_scored() {
        let tree = TreeOracleTau {
            serve_budget: 32,
            by_budget: BTreeMap::from([(8, 3.5), (32, 4.446)]),
        };
        assert_eq!(
            held_out_words(Some(3.724), Some(&tree)),
            "τ chain 3.72 · tree@32 4.45"
        );
        assert_eq!(held_out_words(Some(3.724), None), "τ 3.72");
        assert_eq!(held_out_words(None, Some(&tree)), "τ —");
    }

    #[test]
    fn online_methods_lead_with_the_serving_budget_or_list_every_method_without_it() {
        assert_eq!(online_words(&online(Some(32))), "chain 2.50 · tree@32 3.25");
        assert_eq!(
            online_words(&online(None)),
            "chain 2.50 · ddtree_16 2.75 · ddtree_32 3.25"
        );
        assert_eq!(
            online_words(&online(Some(64))),
            "chain 2.50 · ddtree_16 2.75 · ddtree_32 3.25",
            "a serving budget that was not decoded has no figure to show"
        );
    }
}
