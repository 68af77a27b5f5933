use super::*;
use crate::plan::drafter::drafter_params;
use crate::plan::run::{plan_run, RunSpec};
use crate::plan::shape::{ActivationPrecision, StepShape};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

fn input(params: f64, nnodes: usize, gbps: f64, step: Option<NodeStep>) -> ScalingInput {
    ScalingInput {
        nnodes,
        inter_node_gbps: gbps,
        drafter_params: params,
        drafter_gpus_per_node: 3,
        step,
        min_efficiency: DEFAULT_MIN_EFFICIENCY,
    }
}

/// A drafter-bound node: 1 s of drafter compute per step, 0.2 s of it the last backward, the
/// target 0.3 s, 12 288 tokens.
const DRAFTER_BOUND: NodeStep = NodeStep {
    tokens: 12_288.0,
    target_s: 0.3,
    drafter_compute_s: 1.0,
    last_backward_s: 0.2,
};

#[test]
fn the_ring_factor_is_two_n_minus_one_over_n() {
    assert_eq!(ring_factor(1), 0.0);
    assert_eq!(ring_factor(2), 1.0);
    assert_eq!(ring_factor(4), 1.5);
    assert_eq!(ring_factor(8), 1.75);
    assert_eq!(ring_factor(16), 1.875);
    assert_eq!(ring_factor(6), 10.0 / 6.0);
}

#[test]
fn the_code_all_reduces_fp32_so_a_gradient_element_crosses_as_four_bytes() {
    // sum_in_buckets copies the (bf16 on CUDA) gradients into an fp32 bucket and sums that.
    assert_eq!(ALLREDUCE_BYTES_PER_ELEMENT, 4.0);
    let plan = scaling_plan(&input(1e9, 2, 200.0, None)).unwrap();
    assert_eq!(plan.allreduce_dtype, "fp32");
    assert_eq!(plan.gradient_bytes, 4e9);
}

#[test]
fn the_27b_drafter_reduces_1_73_g_parameters_6_92_gb_in_fp32_twice_the_issues_bf16_figure() {
    let params = drafter_params(&crate::plan::reference::qwen36_27b_drafter());
    // fc 25 600 × 5120 + its norm 2 × 5120, and 5 layers of 319 826 176.
    assert_eq!(params, 1_730_213_120.0);
    assert_eq!(gradient_bytes(params, 4.0), 6_920_852_480.0);
    // The issue's "about 3.5 GB in bf16": what bf16 gradients on the wire would be.
    assert_eq!(gradient_bytes(params, 2.0), 3_460_426_240.0);
    let two = scaling_plan(&input(params, 2, 200.0, None)).unwrap();
    // 2 nodes: ring factor 1, 6.92 GB over 25 GB/s.
    assert!(
        close(two.allreduce_s, 0.276_834_099_2),
        "{}",
        two.allreduce_s
    );
    let sixteen = scaling_plan(&input(params, 16, 400.0, None)).unwrap();
    // 16 nodes: 1.875 × 6.92 GB over 50 GB/s.
    assert!(
        close(sixteen.allreduce_s, 0.259_531_968),
        "{}",
        sixteen.allreduce_s
    );
    assert!(close(sixteen.bytes_per_node, 12_976_598_400.0));
}

#[test]
fn the_all_reduce_time_at_200_and_400_gbps_is_written_out() {
    // 1 G parameters × 4 B = 4 GB; 200 Gb/s = 25 GB/s, 400 Gb/s = 50 GB/s.
    assert_eq!(link_bytes_per_s(200.0), 25e9);
    assert_eq!(link_bytes_per_s(400.0), 50e9);
    for (n, at_200) in [(1, 0.0), (2, 0.16), (4, 0.24), (8, 0.28), (16, 0.3)] {
        let t200 = allreduce_seconds(4e9, n, 200.0);
        let t400 = allreduce_seconds(4e9, n, 400.0);
        assert!(close(t200, at_200), "{n} nodes: {t200}");
        assert!(close(t400, at_200 / 2.0), "{n} nodes: {t400}");
    }
    // One flat ring over 2 × 3 GPUs moves 2·5/6 of the bytes across each node's link.
    assert!(close(
        flat_ring_seconds(4e9, 2, 3, 200.0),
        4e9 * 10.0 / 6.0 / 25e9
    ));
    assert_eq!(flat_ring_seconds(4e9, 1, 3, 200.0), 0.0);
}

#[test]
fn behind_a_drafter_bound_step_the_all_reduce_adds_all_of_itself() {
    // 4 nodes at 200 Gb/s: 0.24 s after 1 s of drafter compute; the target's 0.3 s hides none.
    let plan = scaling_plan(&input(1e9, 4, 200.0, Some(DRAFTER_BOUND))).unwrap();
    let s = plan.step.unwrap();
    assert_eq!(s.verdict, Verdict::AddsToStep);
    assert!(!s.overlapped_with_backward);
    assert!(close(s.one_node_step_s, 1.0));
    assert!(close(s.step_s, 1.24));
    assert!(close(s.added_s, 0.24));
    assert!(close(s.efficiency, 1.0 / 1.24));
    assert!(close(s.one_node_tokens_per_s, 12_288.0));
    assert!(close(s.tokens_per_s, 4.0 * 12_288.0 / 1.24));
    // Overlapped with the last backward (0.2 s), only 0.04 s would be left over.
    assert!(close(s.if_overlapped_step_s, 1.04));
}

#[test]
fn a_drafter_that_waits_for_the_target_hides_the_all_reduce_in_that_wait() {
    let target_bound = NodeStep {
        target_s: 1.0,
        drafter_compute_s: 0.5,
        ..DRAFTER_BOUND
    };
    // 0.5 + 0.24 ≤ 1.0: hidden.
    let s = scaling_plan(&input(1e9, 4, 200.0, Some(target_bound)))
        .unwrap()
        .step
        .unwrap();
    assert_eq!(s.verdict, Verdict::Hidden);
    assert_eq!(s.added_s, 0.0);
    assert_eq!(s.efficiency, 1.0);
    // 0.9 + 0.24 > 1.0: 0.14 s more.
    let tighter = NodeStep {
        drafter_compute_s: 0.9,
        ..target_bound
    };
    let s = scaling_plan(&input(1e9, 4, 200.0, Some(tighter)))
        .unwrap()
        .step
        .unwrap();
    assert_eq!(s.verdict, Verdict::AddsToStep);
    assert!(close(s.added_s, 0.14), "{}", s.added_s);
    let one = scaling_plan(&input(1e9, 1, 200.0, Some(tighter)))
        .unwrap()
        .step
        .unwrap();
    assert_eq!(one.verdict, Verdict::NothingToReduce);
    assert_eq!(one.added_s, 0.0);
}

#[test]
fn the_recommendation_is_the_largest_count_still_at_the_efficiency_bar() {
    // No target wait, 1 s of compute, 4 GB at 200 Gb/s: E(n) = 1 / (1 + 0.32·(n−1)/n).
    // E ≥ 0.8 ⇔ (n−1)/n ≤ 0.78125 ⇔ n ≤ 4.57: 4 nodes (E(4) = 0.806, E(5) = 0.796).
    let step = NodeStep {
        target_s: 0.0,
        ..DRAFTER_BOUND
    };
    let plan = scaling_plan(&input(1e9, 2, 200.0, Some(step))).unwrap();
    let r = plan.recommendation.unwrap();
    assert_eq!(r.nodes, Some(4), "{r:?}");
    assert!(close(r.limit_efficiency, 1.0 / 1.32));
    assert!(r.rule.contains("80 %"), "{}", r.rule);
    let efficiency: Vec<(usize, f64)> = plan
        .table
        .iter()
        .map(|row| (row.nodes, row.efficiency.unwrap()))
        .collect();
    assert_eq!(
        efficiency.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![1, 2, 4, 8, 16]
    );
    assert!(close(efficiency[2].1, 1.0 / 1.24));
    assert!(efficiency.windows(2).all(|w| w[1].1 <= w[0].1));
    // At 400 Gb/s E tends to 1/1.16 = 0.86: no count falls below 0.8.
    let fast = scaling_plan(&input(1e9, 2, 400.0, Some(step))).unwrap();
    let r = fast.recommendation.unwrap();
    assert_eq!(r.nodes, None);
    assert!(r.rule.contains("no limit up to 256 nodes"), "{}", r.rule);
    // A stricter bar: E ≥ 0.9 at 200 Gb/s ⇔ 0.32·(n−1)/n ≤ 1/9 ⇔ n ≤ 1.53: one node.
    let strict = ScalingInput {
        min_efficiency: 0.9,
        ..input(1e9, 2, 200.0, Some(step))
    };
    assert_eq!(
        scaling_plan(&strict).unwrap().recommendation.unwrap().nodes,
        Some(1)
    );
}

#[test]
fn a_count_outside_the_standard_table_gets_its_own_row() {
    let plan = scaling_plan(&input(1e9, 3, 200.0, None)).unwrap();
    let nodes: Vec<usize> = plan.table.iter().map(|r| r.nodes).collect();
    assert_eq!(nodes, vec![1, 2, 3, 4, 8, 16]);
    assert!(plan.table.iter().all(|r| r.step_s.is_none()));
    assert!(plan.step.is_none() && plan.recommendation.is_none());
    assert!(plan.missing.unwrap().contains("--peak-tflops"));
    assert!(plan.status.contains("not built"));
}

#[test]
fn bad_input_is_an_error_that_says_what_to_pass() {
    let err = scaling_plan(&input(1e9, 0, 200.0, None)).unwrap_err();
    assert_eq!(err, ScalingError::NoNodes(0));
    assert!(err.to_string().contains("--nnodes 2"), "{err}");
    for bad in [0.0, -200.0, f64::NAN, f64::INFINITY] {
        let err = scaling_plan(&input(1e9, 2, bad, None)).unwrap_err();
        assert!(matches!(err, ScalingError::BadBandwidth(_)), "{bad}: {err}");
        assert!(err.to_string().contains("--inter-node-gbps 200"), "{err}");
    }
    for bad in [0.0, 1.5, f64::NAN] {
        let e = ScalingInput {
            min_efficiency: bad,
            ..input(1e9, 2, 200.0, None)
        };
        assert!(matches!(
            scaling_plan(&e),
            Err(ScalingError::BadEfficiency(_))
        ));
    }
    assert!(matches!(
        scaling_plan(&input(0.0, 2, 200.0, None)),
        Err(ScalingError::NoParameters(_))
    ));
}

fn real_spec(peak: Option<f64>, inline: bool) -> RunSpec {
    let drafter = crate::plan::reference::qwen36_27b_drafter();
    RunSpec {
        target: crate::model::target::TargetConfig::Qwen3_5(
            crate::plan::reference::qwen36_27b_text(),
        ),
        step: StepShape::typical(&drafter, 1, 4096, 1024, 0.85, 2048),
        drafter,
        target_devices: if inline {
            Vec::new()
        } else {
            (0..5).map(|i| format!("cuda:{i}")).collect()
        },
        drafter_devices: (5..8).map(|i| format!("cuda:{i}")).collect(),
        precision: ActivationPrecision::Bf16Cuda,
        activation_checkpointing: true,
        queued_items_per_rank: 5,
        device_memory_bytes: None,
        runtime_reserve_bytes: 0.0,
        peak_flops: peak,
        mfu: 0.4,
    }
}

#[test]
fn a_node_step_is_the_plans_own_tokens_per_s() {
    for inline in [false, true] {
        let spec = real_spec(Some(989e12), inline);
        let plan = plan_run(&spec);
        let run = plan.tokens_per_s_at_mfu.run.unwrap();
        for accum in [1, 3] {
            let s = node_step(&spec, &plan, accum).unwrap();
            let ranks = if inline { 1.0 } else { 3.0 };
            assert_eq!(s.tokens, ranks * accum as f64 * 4096.0);
            let rate = s.tokens / s.one_node_s();
            assert!((rate / run - 1.0).abs() < 1e-12, "{rate} vs {run}");
            // The backward of one micro-batch is part of one micro-batch's drafter work.
            let micro = 4096.0 * plan.flops_per_token.drafter / (989e12 * 0.4);
            assert!(s.last_backward_s > 0.5 * micro && s.last_backward_s < micro);
        }
    }
    // 5 + 3 at 4096: the drafter bounds the run, so the all-reduce adds to the step.
    let spec = real_spec(Some(989e12), false);
    let s = node_step(&spec, &plan_run(&spec), 1).unwrap();
    assert!(s.drafter_compute_s > s.target_s, "{s:?}");
    assert!(node_step(&real_spec(None, false), &plan_run(&spec), 1).is_none());
}
