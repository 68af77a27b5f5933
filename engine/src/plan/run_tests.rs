use super::*;
use crate::plan::flops::teacher_head_flops;

#[test]
fn the_best_split_balances_the_two_sides() {
    // The drafter costs 3× the target per token: of 8 devices, 2 target + 6 drafter.
    assert_eq!(best_split(8, 1.0, 3.0), Some((2, 6)));
    assert_eq!(best_split(8, 1.0, 1.0), Some((4, 4)));
    assert_eq!(best_split(1, 1.0, 1.0), None);
}

pub(crate) fn qwen36_27b() -> TargetConfig {
    TargetConfig::Qwen3_5(crate::plan::reference::qwen36_27b_text())
}

pub(crate) fn real_drafter() -> DrafterConfig {
    crate::plan::reference::qwen36_27b_drafter()
}

fn real_spec(seq_len: i64, memory_gib: f64) -> RunSpec {
    let drafter = real_drafter();
    let step = StepShape::typical(&drafter, 1, seq_len, 1024, 0.85, 2048);
    RunSpec {
        target: qwen36_27b(),
        step,
        drafter,
        target_devices: (0..5).map(|i| format!("cuda:{i}")).collect(),
        drafter_devices: (5..8).map(|i| format!("cuda:{i}")).collect(),
        precision: ActivationPrecision::Bf16Cuda,
        activation_checkpointing: false,
        queued_items_per_rank: 5,
        device_memory_bytes: Some(memory_gib * GIB),
        runtime_reserve_bytes: 0.0,
        peak_flops: None,
        mfu: 0.4,
    }
}

#[test]
fn at_the_real_shape_the_plain_drafter_needs_most_of_a_96_gb_card_and_the_target_fits() {
    // Without checkpointing the drafter fits with little to spare: K/V is never repeated per
    // query head
    // (docs/BENCHMARKS-history.md#lean-attention-for-the-real-shape-issue-11-branch-lean-attn).
    let plan = plan_run(&real_spec(4096, 96.0));
    let tight = plan_run(&real_spec(4096, 80.0));
    assert_eq!(tight.fits, Some(false), "{:#?}", tight.devices);
    assert_eq!(plan.draft_positions_per_sequence, 32_768);
    let drafter = plan
        .devices
        .iter()
        .find(|d| d.role == Role::Drafter)
        .unwrap();
    let target = plan
        .devices
        .iter()
        .find(|d| d.role == Role::Target)
        .unwrap();
    eprintln!(
        "plain drafter at S 4096: {:.1} GiB",
        drafter.predicted_peak_gib
    );
    assert_eq!(drafter.fits, Some(true), "{drafter:#?}");
    assert!(drafter.predicted_peak_gib > 80.0, "{drafter:#?}");
    assert_eq!(target.fits, Some(true), "{target:#?}");
    // The target's weights are the whole bf16 checkpoint text part: 26-27 B parameters.
    let weights = target
        .consumers
        .iter()
        .find(|c| c.name == "target weights")
        .unwrap();
    assert!(weights.gib > 48.0 && weights.gib < 52.0, "{weights:?}");
    // The 5 + 3 split is drafter-bound, and a drafter-heavier split is recommended.
    assert_eq!(plan.bound_by, Role::Drafter);
    let split = plan.recommended_split.unwrap();
    assert!(
        split.drafter_devices > 3 && split.speedup_over_configured > 1.0,
        "{split:?}"
    );
    // Per token, the drafter step costs more than the target forward (review §1: ~121 against
    // ~48 GFLOP at S = 4096).
    let f = plan.flops_per_token;
    assert!(f.target > 45e9 && f.target < 52e9, "{f:?}");
    assert!(f.drafter > 100e9 && f.drafter < 140e9, "{f:?}");
}

#[test]
fn activation_checkpointing_keeps_the_activations_of_one_layer_at_the_real_shape() {
    let drafter_peak = |plan: &RunPlan| {
        plan.devices
            .iter()
            .find(|d| d.role == Role::Drafter)
            .unwrap()
            .predicted_peak_gib
    };
    let plain = plan_run(&real_spec(4096, 96.0));
    let recomputed = plan_run(&RunSpec {
        activation_checkpointing: true,
        ..real_spec(4096, 96.0)
    });
    assert!(!plain.activation_checkpointing && recomputed.activation_checkpointing);
    // Four of the five layers' saved activations (about 7.5 GiB each in bf16 at 32,768 draft
    // positions) and K/V copies (about 2.5 GiB each for the sliding layers, one kv head per
    // group) go; their inputs (0.3 GiB each) stay.
    let saved = drafter_peak(&plain) - drafter_peak(&recomputed);
    eprintln!(
        "checkpointing saves {saved:.1} GiB; {:.1} GiB with it",
        drafter_peak(&recomputed)
    );
    assert!(saved > 35.0 && saved < 45.0, "{saved} GiB saved");
    // The loss chunk still peaks after the last layer's forward.
    assert_eq!(recomputed.drafter_peak_phase, "loss");
}

fn consumer_bytes(plan: &RunPlan, role: Role, prefix: &str) -> f64 {
    let device = plan.devices.iter().find(|d| d.role == role).unwrap();
    device
        .consumers
        .iter()
        .find(|c| c.name.starts_with(prefix))
        .map_or(0.0, |c| c.gib * GIB)
}

#[test]
fn no_current_head_carries_the_last_hidden_state_so_the_plan_is_as_before() {
    let spec = real_spec(4096, 96.0);
    assert!(!spec.drafter.head.needs_target_last_hidden());
    let plan = plan_run(&spec);
    assert_eq!(plan, plan_carrying(&spec, false));
    // The counts as they were before the carry existed: the taps' forward, the features
    // alone in each queued item, no teacher.
    let (d, s) = (&spec.drafter, &spec.step);
    let tokens = (s.batch * s.seq_len) as f64;
    let target = target_forward_flops(&spec.target, &d.target_layer_ids, s.batch, s.seq_len);
    assert_eq!(plan.flops_per_token.target, target / tokens);
    assert_eq!(
        queue_item_bytes(d, s.batch, s.seq_len, spec.precision, false),
        (s.batch * s.seq_len * d.feature_size()) as f64 * spec.precision.bytes()
    );
    let queued = consumer_bytes(&plan, Role::Drafter, "queued hidden-state items");
    let item = (s.batch * s.seq_len * d.feature_size()) as f64 * 2.0;
    assert!(
        (queued - 5.0 * item).abs() < 1.0,
        "{queued} vs {}",
        5.0 * item
    );
}

#[test]
fn carrying_the_last_hidden_state_adds_the_target_tail_the_teacher_and_one_state_per_item() {
    let spec = real_spec(4096, 96.0);
    let (d, s) = (&spec.drafter, &spec.step);
    let (plain, carried) = (plan_carrying(&spec, false), plan_carrying(&spec, true));
    let n = spec.target.num_layers();
    let h = spec.target.hidden_size();
    assert_eq!(d.target_hidden_size, h);
    let tokens = (s.batch * s.seq_len) as f64;
    // The target runs all its layers, not only up to the highest tap.
    let all: Vec<usize> = (0..n).collect();
    let full = target_forward_flops(&spec.target, &all, s.batch, s.seq_len);
    let taps = target_forward_flops(&spec.target, &d.target_layer_ids, s.batch, s.seq_len);
    assert!(full > taps);
    assert_eq!(carried.flops_per_token.target, full / tokens);
    assert_eq!(
        carried.flops_per_sequence.target - plain.flops_per_sequence.target,
        (full - taps) / s.batch as f64
    );
    // The drafter computes the teacher's logits at every weighted position, forward only.
    let teacher = teacher_head_flops(s.weighted_positions, h, d.vocab_size);
    assert!(teacher > 0.0);
    let drafter_gain = carried.flops_per_sequence.drafter - plain.flops_per_sequence.drafter;
    assert!((drafter_gain - teacher / s.batch as f64).abs() <= 1e-6 * teacher);
    assert_eq!(
        carried.drafter_backward_flops_per_token,
        plain.drafter_backward_flops_per_token
    );
    // Each queued item holds one more `[B, S, H]`, and so does the target's pass.
    let state = tokens * h as f64 * spec.precision.bytes();
    assert_eq!(
        queue_item_bytes(d, s.batch, s.seq_len, spec.precision, true)
            - queue_item_bytes(d, s.batch, s.seq_len, spec.precision, false),
        state
    );
    let gain = |role: Role, name: &str| {
        consumer_bytes(&carried, role, name) - consumer_bytes(&plain, role, name)
    };
    assert!((gain(Role::Drafter, "queued hidden-state items") - 5.0 * state).abs() < 1.0);
    assert!((gain(Role::Target, "tapped hidden states") - state).abs() < 1.0);
}
