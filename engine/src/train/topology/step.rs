//! One optimizer step of the topology: which micro-batches it takes and which drafter rank
//! trains each ([`MicroBatchAssignment`]), how the queue budget splits over the ranks, and how
//! the per-worker timings of a step add up to its telemetry. Pure functions.
use dflash_shared::config::QueueSection;
use dflash_shared::metrics::{DeviceRole, StepTimes, WorkerThroughput};

use crate::train::throughput::DevicePeaks;
use crate::train::topology::queue::QueueConfig;

/// The micro-batch assignment of an optimizer step: `ranks` drafter replicas, each training
/// `accum` micro-batches per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatchAssignment {
    pub ranks: usize,
    pub accum: usize,
}

impl MicroBatchAssignment {
    /// Micro-batches in one optimizer step (the global batch, in micro-batches).
    pub fn micro_per_step(&self) -> u64 {
        (self.ranks * self.accum) as u64
    }

    /// The drafter rank that trains micro-batch `seq` (round-robin, like SpecForge's
    /// per-rank inboxes); fixed, so arrival order never decides who trains what.
    pub fn rank_of(&self, seq: u64) -> usize {
        (seq % self.ranks as u64) as usize
    }

    /// The micro-batches rank `rank` trains in the step that starts at micro-batch `base`,
    /// ascending (the order its gradients accumulate in).
    pub fn rank_seqs(&self, base: u64, rank: usize) -> Vec<u64> {
        (base..base + self.micro_per_step())
            .filter(|&s| self.rank_of(s) == rank)
            .collect()
    }
}

/// Splits the configured queue (`[queue]`: one budget for all hidden states in flight) over
/// `ranks` per-rank queues, keeping `low < high <= capacity` and a byte cap on each.
pub fn per_rank_queue(total: QueueConfig, ranks: usize) -> QueueConfig {
    let ranks = ranks.max(1);
    let high = (total.high_watermark / ranks).max(1);
    QueueConfig {
        capacity: (total.capacity / ranks).max(high),
        high_watermark: high,
        low_watermark: (total.low_watermark / ranks).min(high - 1),
        byte_cap: (total.byte_cap / ranks as u64).max(1),
    }
}

pub fn queue_config(section: &QueueSection) -> QueueConfig {
    QueueConfig {
        capacity: section.capacity,
        high_watermark: section.high_watermark,
        low_watermark: section.low_watermark,
        byte_cap: section.byte_cap.bytes(),
    }
}

/// One micro-batch as its drafter rank saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ItemTiming {
    /// Target worker that produced it.
    pub producer: usize,
    pub tokens: u64,
    /// Kept anchors × block size (`train/throughput.rs::draft_positions`).
    pub draft_positions: u64,
    /// The target forward's analytic FLOPs (`train/throughput.rs::target_flops`).
    pub target_flops: f64,
    pub data_ms: f64,
    pub target_ms: f64,
}

/// One drafter rank's share of a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankTiming {
    pub items: Vec<ItemTiming>,
    /// Analytic forward + backward FLOPs of this rank's micro-batches.
    pub drafter_flops: f64,
    pub queue_wait_ms: f64,
    pub forward_backward_ms: f64,
    pub all_reduce_ms: f64,
    pub optimizer_ms: f64,
}

/// Names of the workers, for telemetry.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerNames {
    pub targets: Vec<String>,
    pub drafters: Vec<String>,
    /// One device runs both roles inline.
    pub inline: bool,
}

/// What one step did, for its metrics line.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTelemetry {
    pub times: StepTimes,
    pub workers: Vec<WorkerThroughput>,
    pub tokens: u64,
    pub draft_positions: u64,
    /// Every worker's FLOPs over the step's wall time and the sum of their devices' peaks
    /// (each device once); `None` unless every device's peak is known.
    pub mfu: Option<f64>,
}

/// A step's time breakdown and per-worker throughput from its ranks' reports.
///
/// Target-side phases (data, target forward) are the mean over target workers of the time
/// spent on this step's micro-batches (that work may have overlapped earlier steps); drafter
/// phases are the mean over drafter ranks. Throughput counts the tokens of this step's
/// sequences each worker handled, over the step's wall time; so does each worker's MFU, its
/// side's analytic FLOPs against its device's peak in `peaks`.
pub fn step_telemetry(
    names: &WorkerNames,
    ranks: &[RankTiming],
    wall_ms: f64,
    peaks: &DevicePeaks,
) -> StepTelemetry {
    let secs = (wall_ms / 1e3).max(1e-9);
    let items = || ranks.iter().flat_map(|r| r.items.iter());
    let tokens: u64 = items().map(|i| i.tokens).sum();
    let draft_positions: u64 = items().map(|i| i.draft_positions).sum();
    let n_targets = names.targets.len().max(1) as f64;
    let n_ranks = ranks.len().max(1) as f64;
    let mean = |f: fn(&RankTiming) -> f64| ranks.iter().map(f).sum::<f64>() / n_ranks;
    let times = StepTimes {
        data_wait_ms: items().map(|i| i.data_ms).sum::<f64>() / n_targets,
        target_forward_ms: items().map(|i| i.target_ms).sum::<f64>() / n_targets,
        queue_wait_ms: mean(|r| r.queue_wait_ms),
        drafter_forward_backward_ms: mean(|r| r.forward_backward_ms),
        all_reduce_ms: mean(|r| r.all_reduce_ms),
        optimizer_ms: mean(|r| r.optimizer_ms),
        total_ms: wall_ms,
    };
    // (device, role, tokens, flops) per worker.
    let work: Vec<(String, DeviceRole, u64, f64)> = if names.inline {
        let flops = items().map(|i| i.target_flops).sum::<f64>()
            + ranks.iter().map(|r| r.drafter_flops).sum::<f64>();
        let device = names.drafters.first().cloned().unwrap_or_default();
        vec![(device, DeviceRole::Both, tokens, flops)]
    } else {
        let produced = |w: usize| items().filter(move |i| i.producer == w);
        let targets = names.targets.iter().enumerate().map(|(w, device)| {
            let tokens = produced(w).map(|i| i.tokens).sum();
            let flops = produced(w).map(|i| i.target_flops).sum();
            (device.clone(), DeviceRole::Target, tokens, flops)
        });
        let drafters = names.drafters.iter().zip(ranks).map(|(device, r)| {
            let tokens = r.items.iter().map(|i| i.tokens).sum();
            (device.clone(), DeviceRole::Drafter, tokens, r.drafter_flops)
        });
        targets.chain(drafters).collect()
    };
    let workers: Vec<WorkerThroughput> = work
        .iter()
        .map(|(device, role, tokens, flops)| WorkerThroughput {
            device: device.clone(),
            role: *role,
            tokens_per_s: *tokens as f64 / secs,
            mfu: peaks.mfu(device, *flops, secs),
        })
        .collect();
    // Workers sharing a device (several ranks on one CPU) share its peak: count it once.
    let devices: std::collections::BTreeSet<&str> = work.iter().map(|(d, ..)| d.as_str()).collect();
    let total_peak: Option<f64> = devices.into_iter().map(|d| peaks.get(d)).sum();
    let total_flops: f64 = work.iter().map(|(.., f)| f).sum();
    StepTelemetry {
        times,
        workers,
        tokens,
        draft_positions,
        mfu: total_peak.map(|p| total_flops / secs / p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_micro_batch_of_a_step_goes_to_exactly_one_rank() {
        let assignment = MicroBatchAssignment { ranks: 3, accum: 2 };
        for base in [0u64, 6, 12, 7] {
            let mut all: Vec<u64> = (0..3).flat_map(|r| assignment.rank_seqs(base, r)).collect();
            for r in 0..3 {
                let seqs = assignment.rank_seqs(base, r);
                assert_eq!(seqs.len(), 2);
                assert!(seqs.iter().all(|&s| assignment.rank_of(s) == r));
                assert!(seqs.windows(2).all(|w| w[0] < w[1]));
            }
            all.sort_unstable();
            assert_eq!(all, (base..base + 6).collect::<Vec<_>>());
        }
        assert_eq!(
            MicroBatchAssignment { ranks: 1, accum: 4 }.rank_seqs(8, 0),
            vec![8, 9, 10, 11]
        );
    }

    #[test]
    fn per_rank_queues_share_the_budget_and_stay_valid() {
        let total = QueueConfig {
            capacity: 16,
            high_watermark: 12,
            low_watermark: 4,
            byte_cap: 8 << 30,
        };
        assert_eq!(per_rank_queue(total, 1), total);
        let three = per_rank_queue(total, 3);
        assert_eq!(
            (three.capacity, three.high_watermark, three.low_watermark),
            (5, 4, 1)
        );
        assert_eq!(three.byte_cap, (8 << 30) / 3);
        for ranks in 1..=20 {
            per_rank_queue(total, ranks).validate().unwrap();
            let tiny = QueueConfig {
                capacity: 2,
                high_watermark: 2,
                low_watermark: 1,
                byte_cap: 10,
            };
            per_rank_queue(tiny, ranks).validate().unwrap();
        }
    }

    #[test]
    fn telemetry_splits_tokens_by_worker_and_averages_phases() {
        let names = WorkerNames {
            targets: vec!["cuda:0".into(), "cuda:1".into()],
            drafters: vec!["cuda:2".into(), "cuda:3".into()],
            inline: false,
        };
        let item = |producer, tokens| ItemTiming {
            producer,
            tokens,
            draft_positions: tokens * 2,
            target_flops: tokens as f64 * 1e6,
            data_ms: 1.0,
            target_ms: 10.0,
        };
        let ranks = vec![
            RankTiming {
                items: vec![item(0, 100), item(1, 300)],
                drafter_flops: 4e9,
                queue_wait_ms: 4.0,
                forward_backward_ms: 20.0,
                all_reduce_ms: 2.0,
                optimizer_ms: 1.0,
            },
            RankTiming {
                items: vec![item(0, 100)],
                drafter_flops: 1e9,
                queue_wait_ms: 0.0,
                forward_backward_ms: 30.0,
                all_reduce_ms: 4.0,
                optimizer_ms: 1.0,
            },
        ];
        let mut peaks = DevicePeaks::new();
        for d in ["cuda:0", "cuda:1", "cuda:2"] {
            peaks.insert(d, 1e12);
        }
        let StepTelemetry {
            times,
            workers,
            tokens,
            draft_positions,
            mfu,
        } = step_telemetry(&names, &ranks, 500.0, &peaks);
        assert_eq!((tokens, draft_positions), (500, 1000));
        // cuda:3 has no known peak: it gets no MFU, and neither does the step.
        let mfus: Vec<Option<f64>> = workers.iter().map(|w| w.mfu).collect();
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
        assert!(close(mfus[0], 4e-4) && close(mfus[1], 6e-4) && close(mfus[2], 8e-3));
        assert_eq!(mfus[3], None);
        assert_eq!(mfu, None);
        peaks.insert("cuda:3", 1e12);
        let all_known = step_telemetry(&names, &ranks, 500.0, &peaks).mfu.unwrap();
        // (5e8 target + 5e9 drafter FLOPs) / 0.5 s / 4e12.
        assert!((all_known - 2.75e-3).abs() < 1e-12, "{all_known}");
        assert_eq!(times.target_forward_ms, 15.0);
        assert_eq!(times.data_wait_ms, 1.5);
        assert_eq!(times.queue_wait_ms, 2.0);
        assert_eq!(times.drafter_forward_backward_ms, 25.0);
        assert_eq!(times.all_reduce_ms, 3.0);
        let tps: Vec<(DeviceRole, f64)> =
            workers.iter().map(|w| (w.role, w.tokens_per_s)).collect();
        assert_eq!(
            tps,
            vec![
                (DeviceRole::Target, 400.0),
                (DeviceRole::Target, 600.0),
                (DeviceRole::Drafter, 800.0),
                (DeviceRole::Drafter, 200.0)
            ]
        );
        let inline = WorkerNames {
            targets: vec!["cpu".into()],
            drafters: vec!["cpu".into()],
            inline: true,
        };
        let mut cpu = DevicePeaks::new();
        cpu.insert("cpu", 1e10);
        let step = step_telemetry(&inline, &ranks[..1], 1000.0, &cpu);
        let workers = &step.workers;
        assert_eq!(workers.len(), 1);
        assert_eq!(
            (workers[0].role, workers[0].tokens_per_s),
            (DeviceRole::Both, 400.0)
        );
        // One device runs both sides: its MFU counts both (4e8 target + 4e9 drafter).
        assert!(close(workers[0].mfu, 0.44) && close(step.mfu, 0.44));
    }
}
