//! The whole job's view of a multi-node run (issue 23), pure: each node's figures for one
//! step, how they travel in one small all-reduce, and the straggler rule.
//!
//! Every node contributes its figures at its own slot of a zeroed buffer of
//! `nnodes × FIGURES_PER_NODE` numbers; one sum over the job's gradient group (the transport
//! the step already uses, no new one) gives every node every node's figures ([`pack`],
//! [`unpack`]).
//!
//! **Who holds the job back.** The nodes of a data-parallel step wait for each other in the
//! gradient all-reduce, so their step wall times are equal and say nothing. What differs is the
//! time each node spends on its own work before that wait: the step less its all-reduce
//! ([`NodeFigures::busy_ms`]). The node with the most is the one the others wait for. It is
//! named a straggler when its busy time exceeds the next slowest node's by at least a fraction,
//! `detectors.straggler.behind_frac` ([`STRAGGLER_BEHIND_FRAC`] by default;
//! [`JobView::straggler`]): were it as fast as that node, the job's step would shrink by that
//! much, so the comparison is what the job loses to this one node.
use serde::{Deserialize, Serialize};

/// Numbers each node contributes per step: tokens/s, draft positions/s, busy ms, step ms and
/// its queue-wait share (negative when the node has no queue: target and drafter inline).
pub const FIGURES_PER_NODE: usize = 5;

/// How much longer than the next slowest node's a node's own work must take before it is
/// named as holding the job back, by default (`detectors.straggler.behind_frac`): a fifth.
/// Below that, ordinary step-to-step noise on a shared machine (a few percent) and data-length
/// variation between shards never name a node; above it, the job loses at least a sixth of its
/// throughput waiting for one node.
pub const STRAGGLER_BEHIND_FRAC: f64 = 0.2;

/// One node's figures for one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFigures {
    pub node: u32,
    /// Training tokens this node consumed per second of the step.
    pub tokens_per_s: f64,
    pub draft_positions_per_s: f64,
    /// The step's wall time less the time spent in the cross-node all-reduce: this node's own
    /// work (data, target forward, drafter forward and backward, optimizer).
    pub busy_ms: f64,
    /// The step's wall time on this node.
    pub step_ms: f64,
    /// The share of the step the node's drafter workers waited for hidden states; `None` for a
    /// node that runs target and drafter inline (no queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait_share: Option<f64>,
}

/// The node the others wait for, when it is far enough behind to name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub node: u32,
    pub busy_ms: f64,
    /// The next slowest node's busy time: the pace the job would keep without this node.
    pub next_busy_ms: f64,
    /// `busy_ms / next_busy_ms − 1`.
    pub behind_frac: f64,
}

impl Straggler {
    /// "node 1 holds the job back: its own work takes 2.10 s a step, the next slowest
    /// node's 1.40 s (+50 %)".
    pub fn sentence(&self) -> String {
        format!(
            "node {} holds the job back: its own work takes {} a step, the next slowest \
             node's {} (+{:.0} %)",
            self.node,
            step_time(self.busy_ms),
            step_time(self.next_busy_ms),
            self.behind_frac * 100.0
        )
    }
}

/// A step's duration at the precision steps need: `850 ms`, `2.10 s`.
pub fn step_time(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// The job as every node sees it after one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The node this view was read on.
    pub this_node: u32,
    /// Every node's figures, by node.
    pub nodes: Vec<NodeFigures>,
    /// The job's training tokens per second: the nodes' sum.
    pub tokens_per_s: f64,
    pub draft_positions_per_s: f64,
    /// The node holding the job back, when one is (`behind_frac` of [`JobView::from_nodes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straggler: Option<Straggler>,
}

impl JobView {
    /// The view from every node's figures (in any order); a node whose own work exceeds the
    /// next slowest node's by at least `behind_frac` of it is the straggler
    /// (`detectors.straggler.behind_frac`, [`STRAGGLER_BEHIND_FRAC`] by default).
    pub fn from_nodes(this_node: u32, mut nodes: Vec<NodeFigures>, behind_frac: f64) -> Self {
        nodes.sort_by_key(|n| n.node);
        JobView {
            this_node,
            tokens_per_s: nodes.iter().map(|n| n.tokens_per_s).sum(),
            draft_positions_per_s: nodes.iter().map(|n| n.draft_positions_per_s).sum(),
            straggler: straggler(&nodes, behind_frac),
            nodes,
        }
    }

    /// The slowest node against the next slowest, named or not: how far behind the node the
    /// job waits for is, for a one-line summary.
    pub fn lag(&self) -> Option<Straggler> {
        lag(&self.nodes)
    }
}

/// The node whose own work exceeds the next slowest node's by `behind_frac`.
fn straggler(nodes: &[NodeFigures], behind_frac: f64) -> Option<Straggler> {
    lag(nodes).filter(|s| s.behind_frac >= behind_frac)
}

/// The slowest node against the next slowest; `None` for fewer than two nodes or no figure.
fn lag(nodes: &[NodeFigures]) -> Option<Straggler> {
    let mut by_busy: Vec<&NodeFigures> = nodes.iter().collect();
    by_busy.sort_by(|a, b| b.busy_ms.total_cmp(&a.busy_ms));
    let (slowest, next) = match by_busy[..] {
        [slowest, next, ..] => (slowest, next.busy_ms),
        _ => return None,
    };
    if !(next > 0.0 && slowest.busy_ms.is_finite()) {
        return None;
    }
    Some(Straggler {
        node: slowest.node,
        busy_ms: slowest.busy_ms,
        next_busy_ms: next,
        behind_frac: slowest.busy_ms / next - 1.0,
    })
}

/// This node's figures at its slot of a zeroed buffer for `nnodes` nodes.
pub fn pack(nnodes: u32, figures: &NodeFigures) -> Vec<f64> {
    let mut buffer = vec![0.0; nnodes as usize * FIGURES_PER_NODE];
    let at = figures.node as usize * FIGURES_PER_NODE;
    buffer[at..at + FIGURES_PER_NODE].copy_from_slice(&[
        figures.tokens_per_s,
        figures.draft_positions_per_s,
        figures.busy_ms,
        figures.step_ms,
        figures.queue_wait_share.unwrap_or(-1.0),
    ]);
    buffer
}

/// Every node's figures from the summed buffer.
pub fn unpack(summed: &[f64]) -> Vec<NodeFigures> {
    summed
        .chunks_exact(FIGURES_PER_NODE)
        .enumerate()
        .map(|(node, f)| NodeFigures {
            node: node as u32,
            tokens_per_s: f[0],
            draft_positions_per_s: f[1],
            busy_ms: f[2],
            step_ms: f[3],
            queue_wait_share: (f[4] >= 0.0).then_some(f[4]),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(node: u32, tokens_per_s: f64, busy_ms: f64) -> NodeFigures {
        NodeFigures {
            node,
            tokens_per_s,
            draft_positions_per_s: tokens_per_s / 2.0,
            busy_ms,
            step_ms: 1000.0,
            queue_wait_share: None,
        }
    }

    #[test]
    fn each_node_packs_at_its_slot_and_the_sum_unpacks_to_every_node() {
        let mut a = node(0, 1000.0, 800.0);
        a.queue_wait_share = Some(0.25);
        let b = node(1, 900.0, 950.0);
        let summed: Vec<f64> = pack(2, &a)
            .iter()
            .zip(pack(2, &b))
            .map(|(x, y)| x + y)
            .collect();
        assert_eq!(unpack(&summed), [a, b]);
    }

    #[test]
    fn the_job_sums_the_nodes_and_names_a_node_a_fifth_behind_the_others() {
        let view = JobView::from_nodes(
            0,
            vec![node(1, 900.0, 1300.0), node(0, 1000.0, 1000.0)],
            STRAGGLER_BEHIND_FRAC,
        );
        assert_eq!(view.nodes[0].node, 0, "sorted by node");
        assert_eq!(view.tokens_per_s, 1900.0);
        assert_eq!(view.draft_positions_per_s, 950.0);
        let s = view.straggler.clone().expect("30 % behind");
        assert_eq!((s.node, s.next_busy_ms), (1, 1000.0));
        assert!((s.behind_frac - 0.3).abs() < 1e-12);
        assert_eq!(
            s.sentence(),
            "node 1 holds the job back: its own work takes 1.30 s a step, the next slowest \
             node's 1.00 s (+30 %)"
        );
        // Just under the bar: nobody is named.
        let close = JobView::from_nodes(
            0,
            vec![node(0, 1.0, 1000.0), node(1, 1.0, 1199.0)],
            STRAGGLER_BEHIND_FRAC,
        );
        assert_eq!(close.straggler, None);
        assert_eq!(close.lag().map(|s| s.node), Some(1));
        // Against the next slowest: one fast node makes no normal node a straggler, and two
        // equally slow nodes are no single node's fault.
        let fast_one = vec![
            node(0, 1.0, 500.0),
            node(1, 1.0, 1000.0),
            node(2, 1.0, 1050.0),
        ];
        assert_eq!(
            JobView::from_nodes(2, fast_one, STRAGGLER_BEHIND_FRAC).straggler,
            None
        );
        let two_slow = vec![
            node(0, 1.0, 500.0),
            node(1, 1.0, 1000.0),
            node(2, 1.0, 1000.0),
        ];
        assert_eq!(
            JobView::from_nodes(2, two_slow, STRAGGLER_BEHIND_FRAC).straggler,
            None
        );
        let one_slow = vec![
            node(0, 1.0, 1000.0),
            node(1, 1.0, 1500.0),
            node(2, 1.0, 1000.0),
        ];
        assert_eq!(
            JobView::from_nodes(0, one_slow, STRAGGLER_BEHIND_FRAC)
                .straggler
                .map(|s| s.node),
            Some(1)
        );
        // A configured bar: 30 % behind is no straggler against a bar of 0.5, 10 % is one
        // against a bar of 0.1.
        let behind_30 = vec![node(0, 1.0, 1000.0), node(1, 1.0, 1300.0)];
        assert_eq!(JobView::from_nodes(0, behind_30, 0.5).straggler, None);
        let behind_10 = vec![node(0, 1.0, 1000.0), node(1, 1.0, 1100.0)];
        assert_eq!(
            JobView::from_nodes(0, behind_10, 0.1)
                .straggler
                .map(|s| s.node),
            Some(1)
        );
        // One node is no job.
        assert_eq!(
            JobView::from_nodes(0, vec![node(0, 1.0, 1.0)], STRAGGLER_BEHIND_FRAC).straggler,
            None
        );
    }
}
