//! The work in one micro-batch, counted so that throughput compares across configs: draft
//! positions (kept anchors × block size) and the analytic FLOPs of each side
//! (`plan/flops.rs`, the convention MFU figures use). A step's MFU divides these by its wall
//! time and by each device's peak ([`DevicePeaks`]).
use std::collections::BTreeMap;

use crate::model::drafter::DrafterConfig;
use crate::model::target::{FeatureRequest, TargetConfig};
use crate::plan::flops::{
    corrected_positions, drafter_step_flops, head_positions, target_forward_flops,
    teacher_positions, StepWork,
};
use crate::train::micro::PreparedMicro;

/// Draft positions the drafter trains on in `micro`: block_size per kept anchor. Padding
/// blocks (keep = false) are not work anyone asked for, so they do not count.
pub fn draft_positions(micro: &PreparedMicro, block_size: i64) -> u64 {
    micro.anchors.keep.iter().filter(|k| **k).count() as u64 * block_size.max(0) as u64
}

/// Forward + backward FLOPs of the drafter on `micro` (useful work only: visible attention
/// pairs of kept blocks, the LM head over its head positions, and the teacher's LM head
/// there when the head distils the target).
pub fn drafter_flops(cfg: &DrafterConfig, micro: &PreparedMicro) -> f64 {
    let weighted = micro.labels.weights.iter().filter(|w| **w > 0.0).count() as i64;
    drafter_step_flops(&StepWork {
        drafter: cfg,
        batch: micro.anchors.batch as i64,
        seq_len: micro.batch.seq_len as i64,
        anchors: &micro.anchors.positions,
        keep: &micro.anchors.keep,
        weighted_positions: weighted,
        corrected_positions: corrected_positions(cfg, &micro.labels.weights),
        head_positions: head_positions(cfg, &micro.labels.weights),
        teacher_positions: teacher_positions(cfg, weighted),
        vocab_size: cfg.vocab_size,
    })
    .total()
}

/// Forward FLOPs of the target's pass for `request` on `micro`, over the batch as its
/// kernels see it (`[B, S]`, right padding included: the target has no mask to skip it), up
/// to the last layer it reads.
pub fn target_flops(target: &TargetConfig, request: &FeatureRequest, micro: &PreparedMicro) -> f64 {
    let (b, s) = (micro.batch.batch as i64, micro.batch.seq_len as i64);
    if b == 0 || s == 0 {
        return 0.0;
    }
    target_forward_flops(target, &request.layers_read(target.num_layers()), b, s)
}

/// Dense peak FLOP/s of each device a run uses, keyed by the engine's device name (`cpu`,
/// `cuda:3`). A device with no entry has no known peak, and a step that uses it reports no
/// MFU for it (never a guessed one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DevicePeaks(BTreeMap<String, f64>);

impl DevicePeaks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `flops_per_s` for `device`; a peak that is not a positive finite number is
    /// not a peak and is ignored.
    pub fn insert(&mut self, device: impl Into<String>, flops_per_s: f64) {
        if flops_per_s.is_finite() && flops_per_s > 0.0 {
            self.0.insert(device.into(), flops_per_s);
        }
    }

    pub fn get(&self, device: &str) -> Option<f64> {
        self.0.get(device).copied()
    }

    /// `flops` done in `secs` on `device`, as a fraction of its peak.
    pub fn mfu(&self, device: &str, flops: f64, secs: f64) -> Option<f64> {
        let peak = self.get(device)?;
        (secs > 0.0).then(|| flops / secs / peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::anchors::AnchorBatch;
    use crate::train::labels::BlockLabels;
    use crate::train::loader::collate;

    #[test]
    fn draft_positions_count_kept_blocks_only() {
        let micro = PreparedMicro {
            seq: 0,
            samples: vec![],
            batch: collate(&[], 0, 0),
            // Two rows of width 3: the second row has one anchor and two padding slots.
            anchors: AnchorBatch::from_rows(&[vec![1, 5, 9], vec![3]], 3),
            labels: BlockLabels {
                targets: vec![],
                weights: vec![],
                valid: vec![],
            },
        };
        assert_eq!(draft_positions(&micro, 16), 4 * 16);
    }

    #[test]
    fn mfu_needs_a_known_positive_peak() {
        let mut peaks = DevicePeaks::new();
        peaks.insert("cpu", 100e9);
        peaks.insert("cuda:0", 0.0);
        peaks.insert("cuda:1", f64::NAN);
        assert_eq!(peaks.mfu("cpu", 50e9, 1.0), Some(0.5));
        assert_eq!(peaks.mfu("cpu", 50e9, 0.0), None);
        assert_eq!(peaks.mfu("cuda:0", 1.0, 1.0), None);
        assert_eq!(peaks.mfu("cuda:1", 1.0, 1.0), None);
        assert_eq!(peaks.mfu("cuda:2", 1.0, 1.0), None);
    }
}
