//! 2 target workers + 2 drafter ranks (real threads, real tensors, CPU) train exactly what one
//! device trains on the same global batch, and the drafter replicas stay identical.

use std::time::Duration;

use crate::support::topology::{config, copies, cpu_topology, max_abs_diff, trainer, within};
use dflash_engine::train::config::Objective;
use dflash_shared::metrics::DeviceRole;

const STEPS: usize = 6;
/// Stated tolerance on the largest parameter difference after STEPS steps. The gradient sums
/// happen in the same order either way (rank 0's micro-batch, then rank 1's), so on CPU the
/// two runs agree to the bit; the tolerance leaves room for libraries that reorder sums.
const TOLERANCE: f64 = 1e-5;

#[test]
fn two_plus_two_equals_single_device_training_on_the_same_global_batch() {
    within(Duration::from_secs(120), || {
        // One device: 2 micro-batches of 4 sequences per step. Two ranks: 1 micro-batch each.
        let mut single = trainer(config(4, 2), cpu_topology(1, 1));
        let mut multi = trainer(config(4, 1), cpu_topology(2, 2));
        assert_eq!(single.total_steps(), multi.total_steps());
        assert_eq!(multi.drafter_ranks(), 2);
        assert_eq!(multi.micro_batches_per_step(), 2);
        assert!(
            single.queue_stats().is_none(),
            "the inline topology has no queue"
        );

        let start = max_abs_diff(&single.master_weights(), &multi.master_weights());
        assert_eq!(start, 0.0, "both start from the same initialisation");

        let mut worst = 0.0f64;
        let (mut t_single, mut t_multi) = (Vec::new(), Vec::new());
        for step in 1..=STEPS {
            let a = single.train_step().unwrap();
            let b = multi.train_step().unwrap();
            t_single.push(a.times.total_ms);
            t_multi.push(b.times.total_ms);
            assert_eq!((a.step, b.step), (step as u64, step as u64));
            assert!(
                (a.loss - b.loss).abs() < 1e-6 && (a.grad_norm - b.grad_norm).abs() < 1e-6,
                "step {step}: single {a:?}\nmulti {b:?}"
            );
            assert_eq!(single.data_position(), multi.data_position());

            let replicas = multi.replica_weights().unwrap();
            assert_eq!(replicas.len(), 2);
            for (name, t) in &replicas[1] {
                let r0 = &replicas[0].iter().find(|(n, _)| n == name).unwrap().1;
                assert!(
                    r0.equal(t),
                    "step {step}: replica 1 differs from rank 0 in {name}"
                );
            }
            let diff = max_abs_diff(&single.master_weights(), &replicas[0]);
            worst = worst.max(diff);
            assert!(diff <= TOLERANCE, "step {step}: max |Δparam| = {diff:e}");

            // Telemetry of the threaded topology: every worker is listed with its role.
            let roles: Vec<DeviceRole> = b.workers.iter().map(|w| w.role).collect();
            assert_eq!(
                roles,
                vec![
                    DeviceRole::Target,
                    DeviceRole::Target,
                    DeviceRole::Drafter,
                    DeviceRole::Drafter
                ]
            );
            let drafter_tps: f64 = b.workers[2..].iter().map(|w| w.tokens_per_s).sum();
            assert!((drafter_tps - b.tokens_per_s).abs() < 1e-6 * b.tokens_per_s.max(1.0));
            assert!(b.times.target_forward_ms > 0.0 && b.times.drafter_forward_backward_ms > 0.0);
            assert_eq!(a.workers.len(), 1);
            assert_eq!(a.workers[0].role, DeviceRole::Both);
        }
        // The run really trained (a test that cannot fail is no test).
        let moved = max_abs_diff(
            &copies(multi.master_weights()),
            &copies(trainer(config(4, 1), cpu_topology(2, 2)).master_weights()),
        );
        assert!(moved > 1e-4, "weights moved by only {moved}");
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        eprintln!(
            "max |Δparam| single vs 2+2 over {STEPS} steps: {worst:e} (tolerance {TOLERANCE:e}); \
             median step time (2 micro-batches of 4): 1+1 {:.1} ms, 2+2 {:.1} ms",
            median(&mut t_single),
            median(&mut t_multi)
        );
    });
}

/// D-PACE divides by sequences, not by Σw: summed over two ranks' micro-batches and divided
/// once by the global count, the update is the one device's on the same global batch.
#[test]
fn two_plus_two_trains_dpace_exactly_as_one_device_does() {
    within(Duration::from_secs(120), || {
        let dpace = |batch, accum| {
            let mut cfg = config(batch, accum);
            cfg.training.objective = Objective::Dpace;
            cfg
        };
        let mut single = trainer(dpace(4, 2), cpu_topology(1, 1));
        let mut multi = trainer(dpace(4, 1), cpu_topology(2, 2));
        let dflash = trainer(config(4, 2), cpu_topology(1, 1))
            .train_step()
            .unwrap();
        for step in 1..=3 {
            let a = single.train_step().unwrap();
            let b = multi.train_step().unwrap();
            if step == 1 {
                // The objective is really D-PACE: a sum per sequence over its anchors' blocks,
                // many times DFlash's mean per position on the same first batch.
                assert!(
                    a.loss > 5.0 * dflash.loss,
                    "D-PACE {} vs DFlash {}",
                    a.loss,
                    dflash.loss
                );
            }
            assert!(
                (a.loss - b.loss).abs() < 1e-6 * a.loss.abs().max(1.0)
                    && (a.grad_norm - b.grad_norm).abs() < 1e-6,
                "step {step}: single {a:?}\nmulti {b:?}"
            );
            let diff = max_abs_diff(&single.master_weights(), &multi.master_weights());
            assert!(diff <= TOLERANCE, "step {step}: max |Δparam| = {diff:e}");
        }
        let moved = max_abs_diff(
            &copies(multi.master_weights()),
            &copies(trainer(dpace(4, 1), cpu_topology(2, 2)).master_weights()),
        );
        assert!(moved > 1e-4, "weights moved by only {moved}");
    });
}
