//! Exact resume on a multi-worker topology: N steps straight equal N/2 steps, a checkpoint, a
//! fresh 2+2 trainer resumed from disk, and N/2 more — bit for bit on CPU.

use std::path::Path;
use std::time::Duration;

use crate::support::topology::{config, copies, cpu_topology, max_abs_diff, trainer, within};
use dflash_engine::train::TrainError;
use dflash_engine::train::{CollectLines, RunOptions, Trainer};

fn run(t: &mut Trainer, steps: u64, root: Option<&Path>) {
    let opts = RunOptions {
        max_steps: Some(steps),
        checkpoint_root: root.map(Path::to_path_buf),
    };
    t.run(&opts, &mut CollectLines::default()).unwrap();
}

#[test]
fn a_resumed_two_plus_two_run_is_bitwise_identical_to_a_straight_one() {
    within(Duration::from_secs(120), || {
        const N: u64 = 6;
        let mut straight = trainer(config(4, 1), cpu_topology(2, 2));
        run(&mut straight, N, None);

        let dir = tempfile::tempdir().unwrap();
        let mut first = trainer(config(4, 1), cpu_topology(2, 2));
        run(&mut first, N / 2, Some(dir.path()));
        let halfway = copies(first.master_weights());
        // Prefetched hidden states die with the first trainer; the checkpoint says where to go on.
        drop(first);

        let mut resumed = trainer(config(4, 1), cpu_topology(2, 2));
        resumed
            .resume_latest(dir.path())
            .unwrap()
            .expect("a checkpoint");
        assert_eq!(resumed.step_count(), N / 2);
        let replicas = resumed.replica_weights().unwrap();
        assert_eq!(max_abs_diff(&replicas[0], &halfway), 0.0);
        assert_eq!(
            max_abs_diff(&replicas[1], &halfway),
            0.0,
            "rank 1 was restored too"
        );
        run(&mut resumed, N / 2, None);

        assert_eq!(resumed.data_position(), straight.data_position());
        for ((name, a), (_, b)) in resumed
            .master_weights()
            .iter()
            .zip(straight.master_weights())
        {
            assert!(a.equal(&b), "{name} differs after resume");
        }
        let replicas = resumed.replica_weights().unwrap();
        assert_eq!(max_abs_diff(&replicas[0], &replicas[1]), 0.0);
        assert!(max_abs_diff(&halfway, &straight.master_weights()) > 0.0);
    });
}

#[test]
fn a_single_device_checkpoint_continues_on_two_ranks_with_the_same_global_batch() {
    within(Duration::from_secs(120), || {
        let dir = tempfile::tempdir().unwrap();
        let mut single = trainer(config(4, 2), cpu_topology(1, 1));
        run(&mut single, 2, Some(dir.path()));
        let mut multi = trainer(config(4, 1), cpu_topology(2, 2));
        multi.resume_latest(dir.path()).unwrap().unwrap();
        assert_eq!(multi.data_position(), single.data_position());
        run(&mut single, 2, None);
        run(&mut multi, 2, None);
        let diff = max_abs_diff(&single.master_weights(), &multi.master_weights());
        assert!(diff <= 1e-5, "max |Δparam| = {diff:e}");

        // Another global batch is refused, with the numbers.
        let mut wrong = trainer(config(4, 2), cpu_topology(2, 2));
        let err = wrong.resume_latest(dir.path()).unwrap_err();
        assert!(matches!(err, TrainError::Incompatible { .. }), "{err}");
        assert!(
            err.to_string().contains("global batch differs")
                && err.to_string().contains("2 drafter rank(s) × grad_accum 2"),
            "{err}"
        );
    });
}
