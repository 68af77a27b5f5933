//! From micro-batch indices to hidden states on the drafter's device: the dispatcher the
//! target workers share, the item they queue, and the per-rank inbox that puts items back in
//! index order.
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use dflash_shared::metrics::QueueStats;
use tch::{Device, Tensor};

use super::step::ItemTiming;
use crate::model::target::{FeatureRequest, TargetModel};
use crate::train::anchors::AnchorBatch;
use crate::train::labels::BlockLabels;
use crate::train::loader::collate;
use crate::train::micro::{MicroSource, PreparedMicro};
use crate::train::replica::TargetStates;
use crate::train::shard::NodeShard;
use crate::train::throughput;
use crate::train::topology::queue::{ByteSized, HiddenStateQueue};

/// One micro-batch with the target's tap-layer features, ready for its drafter rank.
#[derive(Debug)]
pub struct HiddenItem {
    pub micro: PreparedMicro,
    /// `[B, S, n·H]` on the drafter rank's device.
    pub features: Tensor,
    /// `[B, S, H]` the target's final-normed last hidden state, on the drafter rank's device
    /// in the features' dtype; only when the head needs it
    /// ([`DrafterHead::needs_target_last_hidden`](crate::model::drafter::DrafterHead::needs_target_last_hidden)).
    pub last_hidden: Option<Tensor>,
    pub timing: ItemTiming,
}

impl HiddenItem {
    /// An item of micro-batch `seq` with no samples, carrying only `features`: what a queue
    /// holds when it is exercised on its own (the daemon's sampler tests, this module's).
    pub fn features_only(seq: u64, features: Tensor) -> Self {
        HiddenItem {
            micro: PreparedMicro {
                seq,
                samples: vec![],
                batch: collate(&[], 0, 0),
                anchors: AnchorBatch::from_rows(&[], 0),
                labels: BlockLabels {
                    targets: vec![],
                    weights: vec![],
                    valid: vec![],
                },
            },
            features,
            last_hidden: None,
            timing: ItemTiming {
                producer: 0,
                tokens: 0,
                draft_positions: 0,
                target_flops: 0.0,
                data_ms: 0.0,
                target_ms: 0.0,
            },
        }
    }

    /// What the drafter rank trains on: the features and, when carried, the last hidden state.
    pub fn target_states(&self) -> TargetStates<'_> {
        TargetStates {
            features: &self.features,
            last_hidden: self.last_hidden.as_ref(),
        }
    }
}

impl ByteSized for HiddenItem {
    fn byte_size(&self) -> u64 {
        let last_hidden = self.last_hidden.as_ref().map_or(0, ByteSized::byte_size);
        self.features.byte_size() + last_hidden + self.micro.host_bytes()
    }
}

pub type ItemQueue = HiddenStateQueue<HiddenItem>;

/// Waits for queued CUDA work, so wall times measure the work and not its launch.
pub fn sync(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// Builds micro-batch `seq`, runs the target on it (no grad) for what `request` asks and
/// moves the features (and the last hidden state, when asked) to `dest`. `producer` is the
/// target worker's index (for telemetry).
pub fn produce_item(
    target: &TargetModel,
    source: &MicroSource,
    request: &FeatureRequest,
    seq: u64,
    dest: Device,
    producer: usize,
) -> Result<HiddenItem, String> {
    let t = Instant::now();
    let micro = source.prepare(seq);
    let data_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let (b, s) = (micro.batch.batch as i64, micro.batch.seq_len as i64);
    let ids = Tensor::from_slice(&micro.batch.input_ids).view([b, s]);
    let hidden = target
        .hidden_states(&ids, request)
        .map_err(|e| format!("target forward of micro-batch {seq}: {e}"))?;
    let features = hand_over(&hidden.features, target.device(), dest);
    let last_hidden = hidden
        .last_hidden
        .as_ref()
        .map(|state| hand_over(state, target.device(), dest));
    // Waits for the target's own device only (its forward, for the timing); the copy onto
    // `dest` is merely enqueued there (see `hand_over`).
    sync(target.device());
    let target_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(HiddenItem {
        timing: ItemTiming {
            producer,
            tokens: micro.batch.tokens as u64,
            draft_positions: throughput::draft_positions(&micro, source.spec().block_size as i64),
            target_flops: throughput::target_flops(target.config(), request, &micro),
            data_ms,
            target_ms,
        },
        micro,
        features,
        last_hidden,
    })
}

/// How features go from the target's device to the drafter rank's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Same device: the tensor itself.
    InPlace,
    /// Between two different devices, at least one a GPU: through pinned host memory.
    PinnedStaging,
}

/// The route for features made on `src` and trained on `dest`. Pure.
pub fn handover(src: Device, dest: Device) -> Handover {
    if src == dest {
        Handover::InPlace
    } else {
        Handover::PinnedStaging
    }
}

/// `features` (made on `src`) on `dest`, without the target side ever waiting on `dest`'s
/// queued work.
///
/// Why pinned staging and not `to_device(dest)`: libtorch's device-to-device copy orders
/// itself on both devices' current streams. The copy waits for everything already queued on
/// the drafter's stream, the drafter's stream then waits for the target's whole forward, and
/// the target thread (which syncs its device afterwards) sits behind the drafter's queue.
/// Here instead:
///
/// 1. device → pinned host: a copy on the target's own stream, which the target thread waits
///    for (it would wait for its forward anyway, to time it). It waits on nothing of the
///    drafter's.
/// 2. pinned host → `dest`: `non_blocking`, so the target thread only enqueues it on the
///    drafter device's current stream and returns. It runs after the drafter's already queued
///    kernels and before anything the drafter queues later, which is the order the drafter
///    needs; libtorch's caching host allocator keeps the pinned block alive until that copy
///    has finished (it records an event on the stream), so dropping `host` here is safe.
///
/// The cost is one more pass over the features through host memory (210 MB per item at the
/// real shape, a few ms over PCIe) instead of a peer copy; a peer copy on a dedicated stream
/// with events would avoid it but needs a stream and event API tch does not have.
///
/// NOT TESTED ON A GPU: on the CPU build machines every route is [`Handover::InPlace`].
pub fn hand_over(features: &Tensor, src: Device, dest: Device) -> Tensor {
    match handover(src, dest) {
        Handover::InPlace => features.shallow_clone(),
        Handover::PinnedStaging => {
            // Pinning needs CUDA; from the CPU the features already are host memory.
            let host = if src.is_cuda() {
                let mut pinned =
                    Tensor::empty(features.size(), (features.kind(), Device::Cpu)).pin_memory(src);
                // Blocking device → host copy: waits for the target's stream only.
                pinned.copy_(features);
                pinned
            } else {
                features.contiguous().pin_memory(dest)
            };
            if dest.is_cuda() {
                host.to_device_(dest, host.kind(), true, false)
            } else {
                host
            }
        }
    }
}

struct DispatchState {
    next: u64,
    /// Indices below this may be handed out.
    limit: u64,
    stopped: bool,
    /// Which indices are this process's, and which local drafter rank trains each.
    shard: NodeShard,
}

/// Hands out micro-batch indices in increasing order to whichever target worker asks, up to
/// a limit the trainer moves forward each step (so target workers run a bounded distance
/// ahead of the drafters, and stop at the end of the schedule). On a node of a job it skips
/// the indices other nodes train.
pub struct Dispatcher {
    state: Mutex<DispatchState>,
    cv: Condvar,
}

impl Dispatcher {
    pub fn new(next: u64, shard: NodeShard) -> Self {
        Self {
            state: Mutex::new(DispatchState {
                next,
                limit: next,
                stopped: false,
                shard,
            }),
            cv: Condvar::new(),
        }
    }

    /// Hands out `shard`'s indices from now on (a trainer joining a job, before any step).
    pub fn set_shard(&self, shard: NodeShard) {
        self.lock().shard = shard;
    }

    fn lock(&self) -> MutexGuard<'_, DispatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next index of this process's shard and the local drafter rank that trains it,
    /// waiting while none may be handed out; `None` once stopped.
    pub fn next(&self) -> Option<(u64, usize)> {
        let mut st = self.lock();
        loop {
            if st.stopped {
                return None;
            }
            while st.next < st.limit {
                let seq = st.next;
                st.next += 1;
                if let Some(rank) = st.shard.worker_of(seq) {
                    return Some((seq, rank));
                }
            }
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Indices below `base` are no longer needed; indices below `limit` may be handed out.
    pub fn advance(&self, base: u64, limit: u64) {
        let mut st = self.lock();
        st.next = st.next.max(base);
        st.limit = limit;
        drop(st);
        self.cv.notify_all();
    }

    /// Starts over at `next` (after a checkpoint restore), which may lie behind.
    pub fn reset(&self, next: u64, limit: u64) {
        let mut st = self.lock();
        st.next = next;
        st.limit = limit;
        drop(st);
        self.cv.notify_all();
    }

    pub fn stop(&self) {
        self.lock().stopped = true;
        self.cv.notify_all();
    }
}

/// A drafter rank's view of its queue: items in index order. Target workers finish out of
/// order; an item that arrives early waits here until its turn, an item older than the one
/// wanted (a duplicate after a restore) is dropped.
pub struct Inbox {
    queue: Arc<ItemQueue>,
    early: BTreeMap<u64, HiddenItem>,
}

impl Inbox {
    pub fn new(queue: Arc<ItemQueue>) -> Self {
        Self {
            queue,
            early: BTreeMap::new(),
        }
    }

    /// Micro-batch `seq`, waiting for it if needed; `None` when the queue was shut down.
    pub fn take(&mut self, seq: u64) -> Option<HiddenItem> {
        self.early.retain(|&s, _| s >= seq);
        if let Some(item) = self.early.remove(&seq) {
            return Some(item);
        }
        loop {
            let item = self.queue.pop()?;
            let s = item.micro.seq;
            if s == seq {
                return Some(item);
            }
            if s > seq {
                self.early.entry(s).or_insert(item);
            }
        }
    }
}

/// Queue statistics for telemetry, readable from any thread while training runs.
#[derive(Clone)]
pub struct QueueMonitor {
    queues: Vec<Arc<ItemQueue>>,
}

impl std::fmt::Debug for QueueMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueMonitor")
            .field("queues", &self.queues.len())
            .finish()
    }
}

impl QueueMonitor {
    pub fn new(queues: Vec<Arc<ItemQueue>>) -> Self {
        Self { queues }
    }

    /// One reading per drafter rank's queue. Rates cover the time since the previous reading
    /// of that queue (by this or [`Self::stats`]).
    pub fn per_rank(&self) -> Vec<QueueStats> {
        self.queues.iter().map(|q| q.stats()).collect()
    }

    /// All queues together: depths, bytes, caps, watermarks, rates and waits summed. The
    /// configured `[queue]` budget is split evenly over the ranks (rounded down, at least one
    /// item each), so the summed caps are that budget or a little under it.
    pub fn stats(&self) -> QueueStats {
        let parts = self.per_rank();
        let mut total = QueueStats {
            ts_ms: dflash_shared::clock::now_ms(),
            depth: 0,
            capacity: 0,
            high_watermark: 0,
            low_watermark: 0,
            bytes_resident: 0,
            byte_cap: 0,
            producer_rate: 0.0,
            consumer_rate: 0.0,
            producer_blocked_ms: 0.0,
            consumer_starved_ms: 0.0,
        };
        for p in parts {
            total.depth += p.depth;
            total.capacity += p.capacity;
            total.high_watermark += p.high_watermark;
            total.low_watermark += p.low_watermark;
            total.bytes_resident += p.bytes_resident;
            total.byte_cap += p.byte_cap;
            total.producer_rate += p.producer_rate;
            total.consumer_rate += p.consumer_rate;
            total.producer_blocked_ms += p.producer_blocked_ms;
            total.consumer_starved_ms += p.consumer_starved_ms;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::topology::queue::QueueConfig;
    use std::time::Duration;
    use tch::Kind;

    fn item(seq: u64) -> HiddenItem {
        HiddenItem::features_only(seq, Tensor::zeros([4], (Kind::Float, Device::Cpu)))
    }

    fn queue() -> Arc<ItemQueue> {
        Arc::new(
            ItemQueue::new(QueueConfig {
                capacity: 16,
                high_watermark: 16,
                low_watermark: 1,
                byte_cap: 1 << 20,
            })
            .unwrap(),
        )
    }

    fn tiny_source() -> MicroSource {
        use crate::data::Sample;
        use crate::train::labels::LabelMaskRule;
        use crate::train::micro::MicroSpec;
        let samples: Vec<Sample> = (0..4)
            .map(|i| Sample {
                input_ids: (0..(9 + i) as i64).map(|t| 7 * t + i as i64).collect(),
                loss_mask: vec![1; 9 + i],
            })
            .collect();
        let spec = MicroSpec {
            seed: 5,
            batch_size: 2,
            num_anchors: 2,
            block_size: 4,
            gamma: 4.0,
            rule: LabelMaskRule::Independent,
            pad_id: 0,
            seq_len_multiple: 1,
            alignment: Default::default(),
        };
        MicroSource::new(Arc::new(samples), (0..4).collect(), spec)
    }

    /// Today's heads ask for the taps alone: the item carries no last hidden state, and the
    /// target's FLOPs are its forward up to the highest tap, as before.
    #[test]
    fn an_item_carries_the_last_hidden_state_only_when_asked() {
        use crate::model::target::TargetConfig;
        use crate::plan::flops::target_forward_flops;
        let target = TargetModel::random(TargetConfig::tiny_default(), Device::Cpu, Kind::Float, 4);
        let n = target.config().num_layers();
        let drafter = crate::embedded::tiny_drafter_config(target.config());
        assert!(!drafter.head.needs_target_last_hidden());
        let (source, cpu) = (tiny_source(), Device::Cpu);
        let taps = drafter.feature_request();
        let plain = produce_item(&target, &source, &taps, 1, cpu, 0).unwrap();
        assert!(plain.last_hidden.is_none());
        assert!(plain.target_states().last_hidden.is_none());
        let (b, s) = (
            plain.micro.batch.batch as i64,
            plain.micro.batch.seq_len as i64,
        );
        let ids = Tensor::from_slice(&plain.micro.batch.input_ids).view([b, s]);
        assert!(plain
            .features
            .equal(&target.features(&ids, &drafter.target_layer_ids).unwrap()));
        let taps_flops = target_forward_flops(target.config(), &drafter.target_layer_ids, b, s);
        assert_eq!(plain.timing.target_flops, taps_flops);

        let request = FeatureRequest {
            last_hidden: true,
            ..taps
        };
        let carried = produce_item(&target, &source, &request, 1, cpu, 0).unwrap();
        assert!(carried.features.equal(&plain.features));
        let last_hidden = carried.last_hidden.as_ref().expect("asked for");
        assert!(last_hidden.equal(&target.features(&ids, &[n - 1]).unwrap()));
        let states = carried.target_states();
        assert_eq!(
            states.last_hidden.map(Tensor::data_ptr),
            Some(last_hidden.data_ptr())
        );
        let all: Vec<usize> = (0..n).collect();
        let full = target_forward_flops(target.config(), &all, b, s);
        assert!(full > taps_flops);
        assert_eq!(carried.timing.target_flops, full);
        // The queue's byte bound sees the carried state: exactly `B · S · H` elements more.
        let h = target.config().hidden_size();
        assert_eq!(
            carried.byte_size() - plain.byte_size(),
            (b * s * h) as u64 * Kind::Float.elt_size_in_bytes() as u64
        );
    }

    #[test]
    fn features_stay_in_place_on_one_device_and_go_through_pinned_memory_between_two() {
        assert_eq!(handover(Device::Cpu, Device::Cpu), Handover::InPlace);
        assert_eq!(
            handover(Device::Cuda(2), Device::Cuda(2)),
            Handover::InPlace
        );
        assert_eq!(
            handover(Device::Cuda(0), Device::Cuda(5)),
            Handover::PinnedStaging
        );
        assert_eq!(
            handover(Device::Cpu, Device::Cuda(1)),
            Handover::PinnedStaging
        );
        // In place really is the same storage, not a copy.
        let f = Tensor::ones([2, 3], (Kind::Float, Device::Cpu));
        let same = hand_over(&f, Device::Cpu, Device::Cpu);
        assert_eq!(same.data_ptr(), f.data_ptr());
    }

    #[test]
    fn the_inbox_restores_index_order_and_drops_stale_items() {
        let q = queue();
        for s in [4u64, 2, 0, 2, 6] {
            q.push(item(s)).unwrap();
        }
        let mut inbox = Inbox::new(Arc::clone(&q));
        let got: Vec<u64> = [0u64, 2, 4, 6]
            .iter()
            .map(|&s| inbox.take(s).unwrap().micro.seq)
            .collect();
        assert_eq!(got, vec![0, 2, 4, 6]);
        assert_eq!(q.depth(), 0, "the duplicate 2 was consumed and dropped");
        q.shutdown();
        assert!(inbox.take(8).is_none());
    }

    #[test]
    fn the_dispatcher_hands_out_each_index_once_up_to_its_limit() {
        let d = Arc::new(Dispatcher::new(10, NodeShard::single_process(2, 1)));
        d.advance(10, 14);
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(s) = d.next() {
                        got.push(s);
                    }
                    got
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        d.advance(12, 17);
        std::thread::sleep(Duration::from_millis(30));
        d.stop();
        let mut all: Vec<(u64, usize)> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        all.sort_unstable();
        let want: Vec<(u64, usize)> = (10..17).map(|s| (s, (s % 2) as usize)).collect();
        assert_eq!(all, want);
        let r = Dispatcher::new(5, NodeShard::single_process(1, 1));
        r.reset(2, 4);
        assert_eq!((r.next(), r.next()), (Some((2, 0)), Some((3, 0))));
    }

    /// Node 1 of 2 nodes × 2 workers: of every 4 indices it hands out the 2 its workers
    /// train (global ranks 2 and 3, local 0 and 1), never another node's.
    #[test]
    fn on_a_node_of_a_job_the_dispatcher_hands_out_only_that_nodes_shard() {
        let d = Dispatcher::new(0, NodeShard::single_process(1, 1));
        d.set_shard(NodeShard::new(2, 1, 2, 1).unwrap());
        d.advance(0, 9);
        let got: Vec<(u64, usize)> = (0..4).map(|_| d.next().unwrap()).collect();
        assert_eq!(got, vec![(2, 0), (3, 1), (6, 0), (7, 1)]);
        // Index 8 is node 0's: nothing more below the limit, so the next call would wait.
        d.stop();
        assert_eq!(d.next(), None);
    }
}
