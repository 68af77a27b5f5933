//! Fixed shapes outside attention (issue 11, piece 4): training pads every row to a multiple
//! of `training.seq_len_multiple` and every row's anchors to `num_anchors` (padding blocks
//! keep = false). Both paddings must be invisible to the loss and every gradient: the padded
//! micro-batch is compared with the one today's code built before it padded anything
//! (rows to the longest row, anchors to `min(num_anchors, most valid positions)`).
use std::sync::Arc;

use dflash_engine::data::Sample;
use dflash_engine::embedded;
use dflash_engine::model::drafter::AttentionBackend;
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::anchors::sample_anchors_per_sample;
use dflash_engine::train::block_objective::LossObjective;
use dflash_engine::train::labels::{block_labels, LabelAlignment, LabelMaskRule};
use dflash_engine::train::loader::collate;
use dflash_engine::train::micro::{MicroSource, MicroSpec, PreparedMicro};
use dflash_engine::train::optim::AdamWConfig;
use dflash_engine::train::replica::{DrafterReplica, MicroStepOptions, TargetStates};
use tch::{Device, Kind, Tensor};

use crate::support::drafter::relative_error;

const NUM_ANCHORS: usize = 32;
const MULTIPLE: usize = 64;

/// Rows of 20 and 27 tokens, the first 4 unsupervised: 15 and 22 valid anchor positions,
/// fewer than `NUM_ANCHORS`, so today's width is 22 and the padded one 32.
fn samples(vocab: i64) -> Arc<Vec<Sample>> {
    Arc::new(
        [20usize, 27]
            .iter()
            .enumerate()
            .map(|(r, &len)| Sample {
                input_ids: (0..len as i64)
                    .map(|t| (7 * t + 3 * r as i64 + 5) % vocab)
                    .collect(),
                loss_mask: (0..len).map(|i| u8::from(i >= 4)).collect(),
            })
            .collect(),
    )
}

fn spec(block_size: usize) -> MicroSpec {
    MicroSpec {
        seed: 11,
        batch_size: 2,
        num_anchors: NUM_ANCHORS,
        block_size,
        gamma: 4.0,
        rule: LabelMaskRule::Independent,
        alignment: LabelAlignment::SamePosition,
        pad_id: 0,
        seq_len_multiple: MULTIPLE,
    }
}

/// Micro-batch `seq` as the code before fixed shapes built it.
fn unpadded(source: &MicroSource, seq: u64) -> PreparedMicro {
    let padded = source.prepare(seq);
    let rows: Vec<&Sample> = padded
        .samples
        .iter()
        .map(|&i| &source.samples()[i])
        .collect();
    let batch = collate(&rows, source.spec().pad_id, padded.batch.epoch);
    let anchors = sample_anchors_per_sample(
        &batch.masks(),
        NUM_ANCHORS,
        source.spec().seed,
        batch.epoch,
        &padded.samples,
    );
    let labels = block_labels(
        batch.rows(),
        &anchors,
        source.spec().block_size,
        Some(source.spec().gamma),
        source.spec().rule,
    );
    PreparedMicro {
        seq,
        samples: padded.samples.clone(),
        batch,
        anchors,
        labels,
    }
}

/// Loss sums and every parameter's gradient of one forward/backward of `micro`.
fn loss_and_grads(
    target: &TargetModel,
    replica: &mut DrafterReplica,
    micro: &PreparedMicro,
) -> (dflash_engine::train::loss::LossSums, Vec<Tensor>) {
    let (b, s) = (micro.batch.batch as i64, micro.batch.seq_len as i64);
    let ids = Tensor::from_slice(&micro.batch.input_ids).view([b, s]);
    let layers = replica.drafter().config().target_layer_ids.clone();
    let features = target.features(&ids, &layers).unwrap();
    let options = MicroStepOptions {
        backend: AttentionBackend::BlockSparse,
        chunk_positions: 2048,
        activation_checkpointing: false,
        objective: LossObjective::Dflash,
        schedule: Default::default(),
        selector_stop_gradient: false,
        dspark: Default::default(),
    };
    let sums = replica.forward_backward(TargetStates::features_only(&features), micro, &options);
    let grads = replica
        .optimizer()
        .param_grads()
        .iter()
        .map(Tensor::copy)
        .collect();
    replica.zero_grad();
    (sums, grads)
}

#[test]
fn padded_rows_and_anchors_leave_the_loss_and_every_gradient_as_they_were() {
    // No random draw outside the replica's own initialisation, which takes the generator's lock.
    crate::support::drafter::single_threaded();
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let cfg = embedded::tiny_drafter_config(target.config());
    let source = MicroSource::new(
        samples(cfg.vocab_size),
        vec![0, 1],
        spec(cfg.block_size as usize),
    );
    let padded = source.prepare(0);
    let plain = unpadded(&source, 0);
    // The fixed shapes: rows padded to the multiple, anchors to num_anchors.
    assert_eq!(plain.batch.seq_len, 27);
    assert_eq!(padded.batch.seq_len, MULTIPLE);
    assert_eq!(plain.anchors.width, 22);
    assert_eq!(padded.anchors.width, NUM_ANCHORS);
    assert_eq!(padded.anchors.kept(), plain.anchors.kept());
    assert_eq!(
        padded.batch.tokens, plain.batch.tokens,
        "padding is not counted as tokens"
    );
    assert_eq!(padded.weight_sum(), plain.weight_sum());

    let mut replica = DrafterReplica::seeded(
        &cfg,
        target.embed_tokens(),
        target.lm_head(),
        Device::Cpu,
        AdamWConfig::default(),
        3,
    );
    let (sums_padded, grads_padded) = loss_and_grads(&target, &mut replica, &padded);
    let (sums_plain, grads_plain) = loss_and_grads(&target, &mut replica, &plain);
    assert_eq!(sums_padded.counted, sums_plain.counted);
    assert_eq!(sums_padded.correct, sums_plain.correct);
    assert_eq!(sums_padded.weight, sums_plain.weight);
    let loss_error =
        (sums_padded.weighted_ce - sums_plain.weighted_ce).abs() / sums_plain.weighted_ce.abs();
    // Stated tolerance: the padded step runs the same arithmetic on the real positions, but
    // its GEMMs have more rows (S and N·bs), which may change how libtorch blocks their
    // reductions; fp32 rounding of that order is ~1e-7 relative.
    const TOLERANCE: f64 = 1e-5;
    assert!(loss_error < TOLERANCE, "Σw·CE differs by {loss_error:e}");
    let names: Vec<String> = replica
        .optimizer()
        .param_names()
        .map(String::from)
        .collect();
    let mut worst = 0.0f64;
    for ((name, a), b) in names.iter().zip(&grads_padded).zip(&grads_plain) {
        assert_eq!(a.defined(), b.defined(), "{name}");
        if !a.defined() {
            continue;
        }
        assert_eq!(a.kind(), Kind::Float);
        let err = relative_error(a, b);
        worst = worst.max(err);
        assert!(err < TOLERANCE, "gradient of {name} differs by {err:e}");
    }
    eprintln!("padded vs unpadded: Σw·CE {loss_error:e}, worst gradient {worst:e} (relative)");
}
