use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::data::Sample;
use crate::train::labels::{LabelAlignment, LabelMaskRule};
use crate::train::micro::{MicroSource, MicroSpec};

/// Every (nodes, workers, accum) of a small grid, and several step starts, including ones
/// that are not a multiple of the step (a resume after an assignment change).
fn grid() -> impl Iterator<Item = (usize, usize, usize, u64)> {
    (1..=4).flat_map(|nodes| {
        (1..=3).flat_map(move |workers| {
            (1..=3).flat_map(move |accum| [0u64, 1, 12, 37].map(|b| (nodes, workers, accum, b)))
        })
    })
}

#[test]
fn the_nodes_shards_of_a_step_are_disjoint_and_cover_the_global_step() {
    for (nodes, workers, accum, base) in grid() {
        let shards: Vec<NodeShard> = (0..nodes)
            .map(|n| NodeShard::new(nodes, n, workers, accum).unwrap())
            .collect();
        let per_step = (nodes * workers * accum) as u64;
        let mut seen = BTreeSet::new();
        for shard in &shards {
            for seqs in shard.node_seqs(base) {
                assert_eq!(seqs.len(), accum);
                assert!(seqs.windows(2).all(|w| w[0] < w[1]), "ascending: {seqs:?}");
                for s in seqs {
                    assert!(
                        seen.insert(s),
                        "micro-batch {s} trained twice ({nodes}×{workers})"
                    );
                }
            }
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            (base..base + per_step).collect::<Vec<_>>(),
            "{nodes} nodes × {workers} workers × {accum}"
        );
    }
}

/// The threaded topology's routing: the local worker `worker_of` names for a micro-batch is
/// the one whose `worker_seqs` hold it, and a micro-batch of another node has none.
#[test]
fn each_micro_batch_of_a_step_is_routed_to_the_local_worker_that_trains_it() {
    for (nodes, workers, accum, base) in grid() {
        for n in 0..nodes {
            let shard = NodeShard::new(nodes, n, workers, accum).unwrap();
            let per_step = (nodes * workers * accum) as u64;
            let mut routed = 0;
            for seq in base..base + per_step {
                match shard.worker_of(seq) {
                    Some(w) => {
                        assert!(shard.worker_seqs(base, w).contains(&seq));
                        routed += 1;
                    }
                    None => assert!(shard.node_seqs(base).iter().all(|s| !s.contains(&seq))),
                }
            }
            assert_eq!(routed, workers * accum, "node {n}'s shard of the step");
        }
    }
    let whole = NodeShard::single_process(3, 2);
    assert_eq!(whole, NodeShard::new(1, 0, 3, 2).unwrap());
    assert_eq!(
        (0..6).map(|s| whole.worker_of(s)).collect::<Vec<_>>(),
        [0, 1, 2, 0, 1, 2].map(Some)
    );
}

#[test]
fn n_nodes_of_l_workers_train_what_one_node_of_n_times_l_workers_trains() {
    for (nodes, workers, accum, base) in grid() {
        let single = MicroBatchAssignment {
            ranks: nodes * workers,
            accum,
        };
        for n in 0..nodes {
            let shard = NodeShard::new(nodes, n, workers, accum).unwrap();
            assert_eq!(shard.global_assignment(), single);
            for w in 0..workers {
                assert_eq!(
                    shard.worker_seqs(base, w),
                    single.rank_seqs(base, n * workers + w),
                    "node {n} worker {w} is rank {} of the single process",
                    n * workers + w
                );
            }
        }
    }
    // The done-when case: 2 nodes × 1 worker against 1 node × 2 workers.
    let one_by_two = NodeShard::new(1, 0, 2, 2).unwrap();
    for n in 0..2 {
        let two_by_one = NodeShard::new(2, n, 1, 2).unwrap();
        for step in 0..5 {
            let base = two_by_one.step_base(step);
            assert_eq!(base, one_by_two.step_base(step));
            assert_eq!(
                two_by_one.node_seqs(base)[0],
                one_by_two.worker_seqs(base, n)
            );
        }
    }
}

fn source(n_samples: usize, seed: u64, batch_size: usize) -> MicroSource {
    let samples: Vec<Sample> = (0..n_samples)
        .map(|i| Sample {
            input_ids: (0..(5 + i % 4) as i64)
                .map(|t| t + 100 * i as i64)
                .collect(),
            loss_mask: vec![1; 5 + i % 4],
        })
        .collect();
    let train: Vec<usize> = (0..n_samples).filter(|i| i % 5 != 4).collect();
    let spec = MicroSpec {
        seed,
        batch_size,
        num_anchors: 2,
        block_size: 2,
        gamma: 2.0,
        rule: LabelMaskRule::Independent,
        alignment: LabelAlignment::SamePosition,
        pad_id: 0,
        seq_len_multiple: 1,
    };
    MicroSource::new(Arc::new(samples), train, spec)
}

/// The dataset rows each node trains in `epoch`, walking the steps from a fresh start.
fn epoch_rows(
    src: &MicroSource,
    nodes: usize,
    workers: usize,
    accum: usize,
    epoch: u64,
) -> Vec<Vec<usize>> {
    let per_epoch = src.batches_per_epoch();
    let (first, last) = (epoch * per_epoch, (epoch + 1) * per_epoch);
    (0..nodes)
        .map(|n| {
            let shard = NodeShard::new(nodes, n, workers, accum).unwrap();
            let mut rows = Vec::new();
            let mut step = 0;
            while shard.step_base(step) < last {
                for seqs in shard.node_seqs(shard.step_base(step)) {
                    for s in seqs.into_iter().filter(|s| (first..last).contains(s)) {
                        rows.extend(src.prepare(s).samples);
                    }
                }
                step += 1;
            }
            rows
        })
        .collect()
}

#[test]
fn over_an_epoch_the_nodes_read_disjoint_rows_that_cover_the_training_split_once() {
    for (nodes, workers, accum, batch) in [(2, 1, 1, 2), (2, 2, 1, 3), (3, 1, 2, 1), (4, 2, 2, 2)] {
        let src = source(23, 7, batch);
        let train: Vec<usize> = (0..23).filter(|i| i % 5 != 4).collect();
        for epoch in 0..2 {
            let rows = epoch_rows(&src, nodes, workers, accum, epoch);
            let mut all: Vec<usize> = rows.concat();
            all.sort_unstable();
            assert_eq!(
                all, train,
                "epoch {epoch}: every training row once, {nodes} nodes"
            );
            // Deterministic: a node alone, with its own source, reads the same rows.
            let again = epoch_rows(&source(23, 7, batch), nodes, workers, accum, epoch);
            assert_eq!(rows, again);
        }
        // A new epoch is a new order, and so is a new seed.
        let e0 = epoch_rows(&src, nodes, workers, accum, 0);
        assert_ne!(e0, epoch_rows(&src, nodes, workers, accum, 1));
        assert_ne!(
            e0,
            epoch_rows(&source(23, 8, batch), nodes, workers, accum, 0)
        );
    }
}

#[test]
fn a_resume_from_the_checkpointed_data_position_continues_the_same_shards() {
    let src = source(23, 3, 2);
    for (nodes, workers, accum) in [(2, 1, 1), (2, 2, 3), (3, 1, 2)] {
        for n in 0..nodes {
            let shard = NodeShard::new(nodes, n, workers, accum).unwrap();
            let straight: Vec<Vec<Vec<u64>>> = (0..12)
                .map(|s| shard.node_seqs(shard.step_base(s)))
                .collect();
            for stop in [1u64, 5, 11] {
                // What the checkpoint stores and the resume reads back: the data position of
                // the cursor, not the step.
                let position = src.position_of(shard.step_base(stop));
                let mut cursor = src.consumed_at(position).unwrap();
                let per_step = shard.global_assignment().micro_per_step();
                for expected in &straight[stop as usize..] {
                    assert_eq!(
                        &shard.node_seqs(cursor),
                        expected,
                        "node {n} resumed at {stop}"
                    );
                    cursor += per_step;
                }
            }
        }
    }
}

#[test]
fn impossible_shards_are_refused_naming_the_key() {
    for (args, key) in [
        ((0, 0, 1, 1), "nnodes"),
        ((2, 2, 1, 1), "node_rank"),
        ((2, 0, 0, 1), "topology.drafter_devices"),
        ((2, 1, 1, 0), "training.grad_accum"),
    ] {
        let (nodes, node, workers, accum) = args;
        let err = NodeShard::new(nodes, node, workers, accum)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{args:?}: {err}");
    }
}
