//! Summing gradients and loss statistics across the drafter replicas.
//!
//! [`AllReduce`] is one rank's endpoint of a group. [`CpuAllReduce`] sums CPU tensors across
//! threads: every rank deposits its buffer, rank 0 adds them in rank order (so the result is
//! the same bits every run, whatever thread arrives first), and every rank copies the sum back.
//! The CUDA endpoint is NCCL ([`super::nccl`]). A group can be aborted from any thread: ranks
//! waiting in it return [`AllReduceError::Aborted`] instead of waiting for a dead peer forever.
//!
//! Gradients go through [`sum_in_buckets`]: one fixed fp32 bucket of
//! [`ALLREDUCE_BUCKET_ELEMENTS`](crate::collective::bucket::ALLREDUCE_BUCKET_ELEMENTS) reused for slice after slice of the gradients, the sums written back into the gradients
//! themselves, instead of an fp32 flat copy of every gradient (6.4 GiB at the Qwen3.6-27B
//! drafter's 1.7 G parameters).
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tch::{Kind, Tensor};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllReduceError {
    #[error("the all-reduce group was aborted (another worker failed)")]
    Aborted,
    #[error("all-reduce buffer: {0}")]
    BadBuffer(String),
    #[error("NCCL: {0}")]
    Nccl(String),
    /// A cross-process collective ([`crate::dist`]) that got no result within its timeout: a
    /// peer stalled, died without closing its connection, or never called it.
    #[error("rank {rank} of {world}: no all-reduce result within {} ms; a peer stalled or died ({detail})", after.as_millis())]
    Timeout {
        rank: usize,
        world: usize,
        after: std::time::Duration,
        detail: String,
    },
    /// A cross-process collective whose connection to a peer closed (the peer's process died).
    #[error("rank {rank} of {world}: lost {peer} during an all-reduce ({detail})")]
    PeerLost {
        rank: usize,
        world: usize,
        /// `rank N` when it is known, else the address the transport names.
        peer: String,
        detail: String,
    },
    /// Forming a cross-process group (rendezvous, backend set-up) failed.
    #[error("joining the process group: {0}")]
    Join(String),
    /// A cross-process collective failed for another reason (the backend's message).
    #[error("Gloo: {0}")]
    Gloo(String),
}

/// One rank's endpoint. Every rank of a group must make the same calls in the same order.
pub trait AllReduce: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Element-wise sum of `buffer` over all ranks, in place. `buffer` is contiguous fp32 on
    /// this rank's device, the same length on every rank.
    fn sum_tensor(&mut self, buffer: &mut Tensor) -> Result<(), AllReduceError>;
    /// Sum of `values` over all ranks, in place.
    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError>;
    /// What releases this endpoint from another thread (a worker of this process failed, so
    /// its peers here must stop waiting), when the endpoint's group is not aborted as a whole
    /// by its owner: a cross-process group's endpoint. `None` for the in-process groups,
    /// whose owner holds the group's abort.
    fn endpoint_abort(&self) -> Option<Arc<dyn AbortGroup>> {
        None
    }
}

/// Sums `grads` over all ranks, in place, through `bucket` (contiguous fp32 on this rank's
/// device; its length is the bucket size): the gradients are read as one stream in order,
/// cut into bucket-sized slices (a tensor may straddle two), each slice copied into the
/// bucket, summed over the ranks and copied back into the gradients in their own dtype.
///
/// Numerics: the sum is accumulated in fp32 on every backend, exactly as the flat fp32 buffer
/// did. With fp32 gradients (CPU) the result is the same bits as that flat buffer's; with
/// bf16 gradients (CUDA) the fp32 sum is rounded to bf16 once when written back (relative
/// error ≤ 2⁻⁹ per element, the precision the gradients already had), before the division by
/// the global Σw, which the optimizer still does once, in fp32. Every gradient must be
/// defined and contiguous, and every rank must pass the same shapes in the same order.
pub fn sum_in_buckets(
    group: &mut dyn AllReduce,
    grads: &mut [Tensor],
    bucket: &mut Tensor,
) -> Result<(), AllReduceError> {
    let cap = bucket.numel() as i64;
    if cap == 0 || bucket.kind() != Kind::Float || !bucket.is_contiguous() {
        return Err(AllReduceError::BadBuffer(format!(
            "the all-reduce bucket must be a non-empty contiguous fp32 tensor, found {:?} of {cap} elements",
            bucket.kind()
        )));
    }
    if let Some(bad) = grads
        .iter()
        .position(|g| !g.defined() || !g.is_contiguous())
    {
        return Err(AllReduceError::BadBuffer(format!(
            "gradient {bad} is {} (every gradient must be defined and contiguous)",
            if grads[bad].defined() {
                "not contiguous"
            } else {
                "undefined"
            }
        )));
    }
    let flat: Vec<Tensor> = grads.iter().map(|g| g.view([-1])).collect();
    let numels: Vec<i64> = flat.iter().map(|g| g.numel() as i64).collect();
    let total: i64 = numels.iter().sum();
    tch::no_grad(|| {
        let mut start = 0;
        while start < total {
            let len = cap.min(total - start);
            let mut slice = bucket.narrow(0, 0, len);
            for_each_segment(&numels, start, len, |i, at, within, n| {
                slice.narrow(0, within, n).copy_(&flat[i].narrow(0, at, n));
            });
            group.sum_tensor(&mut slice)?;
            for_each_segment(&numels, start, len, |i, at, within, n| {
                flat[i].narrow(0, at, n).copy_(&slice.narrow(0, within, n));
            });
            start += len;
        }
        Ok(())
    })
}

/// Calls `f(tensor, offset in tensor, offset in bucket, length)` for every piece of the
/// stream range `[start, start + len)`, the tensors laid end to end with `numels` elements.
fn for_each_segment(numels: &[i64], start: i64, len: i64, mut f: impl FnMut(usize, i64, i64, i64)) {
    let end = start + len;
    let mut lo = 0;
    for (i, &n) in numels.iter().enumerate() {
        let hi = lo + n;
        let (a, b) = (lo.max(start), hi.min(end));
        if a < b {
            f(i, a - lo, a - start, b - a);
        }
        if hi >= end {
            break;
        }
        lo = hi;
    }
}

/// Aborts a whole group from any thread.
pub trait AbortGroup: Send + Sync {
    fn abort(&self);
}

/// The deposits of one collective call. Two alternate (by call parity): a rank can deposit for
/// call `n + 1` while a slower rank is still copying the result of call `n`, but never for
/// `n + 2` before everyone left `n`, since call `n + 1` waits for all ranks.
#[derive(Default)]
struct Round {
    tensors: Vec<Option<Tensor>>,
    scalars: Vec<Vec<f64>>,
    tensor_sum: Option<Tensor>,
    scalar_sum: Vec<f64>,
}

struct GroupState {
    world: usize,
    arrived: usize,
    generation: u64,
    aborted: bool,
    rounds: [Round; 2],
}

/// The shared half of a CPU all-reduce group.
pub struct CpuGroup {
    state: Mutex<GroupState>,
    cv: Condvar,
}

impl CpuGroup {
    /// A group of `world` ranks; returns one endpoint per rank, in rank order.
    pub fn new(world: usize) -> (Arc<CpuGroup>, Vec<CpuAllReduce>) {
        let round = || Round {
            tensors: (0..world).map(|_| None).collect(),
            scalars: vec![Vec::new(); world],
            ..Default::default()
        };
        let group = Arc::new(CpuGroup {
            state: Mutex::new(GroupState {
                world,
                arrived: 0,
                generation: 0,
                aborted: false,
                rounds: [round(), round()],
            }),
            cv: Condvar::new(),
        });
        let ranks = (0..world)
            .map(|rank| CpuAllReduce {
                group: Arc::clone(&group),
                rank,
                calls: 0,
            })
            .collect();
        (group, ranks)
    }

    // A panic while the lock is held leaves at worst a half-filled round, which an abort
    // (the panicking worker trips one) makes irrelevant.
    fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every rank arrived (or the group was aborted).
    fn barrier<'a>(
        &'a self,
        mut st: MutexGuard<'a, GroupState>,
    ) -> Result<MutexGuard<'a, GroupState>, AllReduceError> {
        if st.aborted {
            return Err(AllReduceError::Aborted);
        }
        let generation = st.generation;
        st.arrived += 1;
        if st.arrived == st.world {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st);
        }
        while st.generation == generation && !st.aborted {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.aborted {
            return Err(AllReduceError::Aborted);
        }
        Ok(st)
    }
}

impl AbortGroup for CpuGroup {
    fn abort(&self) {
        self.lock().aborted = true;
        self.cv.notify_all();
    }
}

pub struct CpuAllReduce {
    group: Arc<CpuGroup>,
    rank: usize,
    calls: u64,
}

impl CpuAllReduce {
    /// Deposit, wait for all, let rank 0 reduce in rank order, wait again, hand back the sum.
    fn collective<T>(
        &mut self,
        deposit: impl FnOnce(&mut Round),
        reduce: impl FnOnce(&mut Round) -> Result<(), AllReduceError>,
        take: impl FnOnce(&Round) -> T,
    ) -> Result<T, AllReduceError> {
        let parity = (self.calls % 2) as usize;
        self.calls += 1;
        let group = Arc::clone(&self.group);
        let mut st = group.lock();
        if st.aborted {
            return Err(AllReduceError::Aborted);
        }
        deposit(&mut st.rounds[parity]);
        let mut st = group.barrier(st)?;
        if self.rank == 0 {
            let outcome = reduce(&mut st.rounds[parity]);
            if let Err(e) = outcome {
                drop(st);
                group.abort();
                return Err(e);
            }
        }
        let st = group.barrier(st)?;
        Ok(take(&st.rounds[parity]))
    }
}

impl AllReduce for CpuAllReduce {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.lock().world
    }

    fn sum_tensor(&mut self, buffer: &mut Tensor) -> Result<(), AllReduceError> {
        if buffer.kind() != Kind::Float || !buffer.is_contiguous() {
            return Err(AllReduceError::BadBuffer(format!(
                "expected a contiguous fp32 tensor, found {:?} (contiguous: {})",
                buffer.kind(),
                buffer.is_contiguous()
            )));
        }
        let rank = self.rank;
        let sum = self.collective(
            |round| round.tensors[rank] = Some(buffer.shallow_clone()),
            |round| {
                let parts: Vec<Tensor> = round.tensors.iter_mut().flat_map(Option::take).collect();
                let numel = parts[0].numel();
                if let Some(bad) = parts.iter().position(|t| t.numel() != numel) {
                    return Err(AllReduceError::BadBuffer(format!(
                        "rank {bad} has {} elements, rank 0 has {numel}",
                        parts[bad].numel()
                    )));
                }
                let total = tch::no_grad(|| {
                    let mut acc = parts[0].copy();
                    for part in &parts[1..] {
                        acc += part;
                    }
                    acc
                });
                round.tensor_sum = Some(total);
                Ok(())
            },
            |round| round.tensor_sum.as_ref().map(Tensor::shallow_clone),
        )?;
        let sum = sum.ok_or(AllReduceError::Aborted)?;
        tch::no_grad(|| buffer.copy_(&sum));
        Ok(())
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError> {
        let rank = self.rank;
        let sum = self.collective(
            |round| round.scalars[rank] = values.to_vec(),
            |round| {
                let len = round.scalars[0].len();
                if let Some(bad) = round.scalars.iter().position(|v| v.len() != len) {
                    return Err(AllReduceError::BadBuffer(format!(
                        "rank {bad} sums {} values, rank 0 sums {len}",
                        round.scalars[bad].len()
                    )));
                }
                let mut total = vec![0.0; len];
                for part in &round.scalars {
                    for (t, v) in total.iter_mut().zip(part) {
                        *t += v;
                    }
                }
                round.scalar_sum = total;
                Ok(())
            },
            |round| round.scalar_sum.clone(),
        )?;
        values.copy_from_slice(&sum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tch::Device;

    fn run_group<T: Send + 'static>(
        world: usize,
        body: impl Fn(CpuAllReduce) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let (_, ranks) = CpuGroup::new(world);
        let body = Arc::new(body);
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                let body = Arc::clone(&body);
                std::thread::spawn(move || body(r))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn sums_tensors_and_scalars_identically_on_every_rank_many_times() {
        let results = run_group(3, |mut ar| {
            let rank = ar.rank() as f64;
            let mut out = Vec::new();
            for call in 0..20 {
                let mut t = Tensor::from_slice(&[rank, 10.0 * rank + call as f64, 0.1])
                    .to_kind(Kind::Float);
                ar.sum_tensor(&mut t).unwrap();
                let mut s = [rank, 1.0];
                ar.sum_f64(&mut s).unwrap();
                out.push((Vec::<f32>::try_from(&t).unwrap(), s));
            }
            out
        });
        for (call, (t, s)) in results[0].iter().enumerate() {
            assert_eq!(t[0], 3.0);
            assert_eq!(t[1], 30.0 + 3.0 * call as f32);
            assert_eq!(s, &[3.0, 3.0]);
        }
        assert!(results.iter().all(|r| r == &results[0]), "ranks disagree");
    }

    #[test]
    fn the_sum_is_the_same_bits_whatever_order_ranks_arrive_in() {
        let values: Vec<f32> = (0..64).map(|i| 1.0 / (i as f32 + 3.0)).collect();
        let reference = {
            let parts: Vec<Tensor> = (0..4)
                .map(|r| Tensor::from_slice(&values) * (r as f64 + 0.37))
                .collect();
            let mut acc = parts[0].copy();
            for p in &parts[1..] {
                acc += p;
            }
            Vec::<f32>::try_from(&acc).unwrap()
        };
        for delays in [[0u64, 5, 10, 15], [15, 10, 5, 0]] {
            let v = values.clone();
            let got = run_group(4, move |mut ar| {
                std::thread::sleep(Duration::from_millis(delays[ar.rank()]));
                let mut t = Tensor::from_slice(&v) * (ar.rank() as f64 + 0.37);
                ar.sum_tensor(&mut t).unwrap();
                Vec::<f32>::try_from(&t).unwrap()
            });
            for g in got {
                assert!(g
                    .iter()
                    .zip(&reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn bucketed_sums_equal_the_flat_sum_bit_for_bit_with_tensors_straddling_buckets() {
        // Three ranks, gradients of 5 + 1 + 12 + 3 elements through a bucket of 4: every
        // bucket boundary cuts some tensor, one bucket holds three tensors' pieces, the last
        // bucket is partial. The reference is the flat fp32 buffer of the whole stream.
        const SHAPES: [&[i64]; 4] = [&[5], &[1], &[3, 4], &[3]];
        let grads_of = |rank: usize| -> Vec<Tensor> {
            SHAPES
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let n: i64 = s.iter().product();
                    let t = (Tensor::arange(n, (Kind::Float, Device::Cpu)) * (0.1 + i as f64)
                        + 1.0)
                        .reciprocal()
                        * (rank as f64 + 0.37);
                    t.view(*s)
                })
                .collect()
        };
        let flat = run_group(3, move |mut ar| {
            let mut buf = Tensor::cat(
                &grads_of(ar.rank())
                    .iter()
                    .map(|g| g.reshape([-1]))
                    .collect::<Vec<_>>(),
                0,
            );
            ar.sum_tensor(&mut buf).unwrap();
            Vec::<f32>::try_from(&buf).unwrap()
        });
        let bucketed = run_group(3, move |mut ar| {
            let mut grads = grads_of(ar.rank());
            let mut bucket = Tensor::zeros([4], (Kind::Float, Device::Cpu));
            sum_in_buckets(&mut ar, &mut grads, &mut bucket).unwrap();
            let pieces: Vec<Tensor> = grads.iter().map(|g| g.reshape([-1])).collect();
            (
                Vec::<f32>::try_from(&Tensor::cat(&pieces, 0)).unwrap(),
                grads.iter().map(Tensor::size).collect::<Vec<_>>(),
            )
        });
        for (values, sizes) in &bucketed {
            assert_eq!(values.len(), 21);
            assert!(
                values
                    .iter()
                    .zip(&flat[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{values:?} vs {:?}",
                flat[0]
            );
            let want: Vec<Vec<i64>> = SHAPES.iter().map(|s| s.to_vec()).collect();
            assert_eq!(sizes, &want, "the gradients keep their shapes");
        }
    }

    #[test]
    fn bf16_gradients_are_summed_in_fp32_and_rounded_once() {
        // bf16 steps by 2⁻⁷ at 1. 1 + 2⁻⁸ + 2⁻⁸ is 1 + 2⁻⁷ in fp32 (exact in bf16), while
        // sums in bf16 would round each 1 + 2⁻⁸ (a tie) to even, i.e. to 1, and give 1.
        let got = run_group(3, |mut ar| {
            let v = if ar.rank() == 0 { 1.0 } else { 2f64.powi(-8) };
            let mut grads = vec![Tensor::from_slice(&[v as f32]).to_kind(Kind::BFloat16)];
            let mut bucket = Tensor::zeros([8], (Kind::Float, Device::Cpu));
            sum_in_buckets(&mut ar, &mut grads, &mut bucket).unwrap();
            (grads[0].kind(), grads[0].double_value(&[0]))
        });
        for (kind, v) in got {
            assert_eq!(kind, Kind::BFloat16);
            assert_eq!(v, 1.0 + 2f64.powi(-7));
        }
    }

    #[test]
    fn an_undefined_gradient_or_a_bad_bucket_is_an_error_not_a_wrong_sum() {
        let (_, mut ranks) = CpuGroup::new(1);
        let mut bucket = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let mut grads = vec![Tensor::new()];
        let err = sum_in_buckets(&mut ranks[0], &mut grads, &mut bucket).unwrap_err();
        assert!(err.to_string().contains("undefined"), "{err}");
        let mut grads = vec![Tensor::zeros([2], (Kind::Float, Device::Cpu))];
        let mut half = Tensor::zeros([4], (Kind::Half, Device::Cpu));
        assert!(matches!(
            sum_in_buckets(&mut ranks[0], &mut grads, &mut half),
            Err(AllReduceError::BadBuffer(_))
        ));
    }

    #[test]
    fn an_abort_releases_ranks_waiting_for_a_dead_peer() {
        let (group, mut ranks) = CpuGroup::new(2);
        let mut rank0 = ranks.remove(0);
        let waiter = std::thread::spawn(move || {
            let mut t = Tensor::zeros([4], (Kind::Float, Device::Cpu));
            rank0.sum_tensor(&mut t)
        });
        std::thread::sleep(Duration::from_millis(30));
        group.abort();
        assert_eq!(waiter.join().unwrap(), Err(AllReduceError::Aborted));
        let mut t = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        assert_eq!(ranks[0].sum_tensor(&mut t), Err(AllReduceError::Aborted));
    }

    #[test]
    fn mismatched_buffers_are_an_error_not_a_wrong_sum() {
        let results = run_group(2, |mut ar| {
            let n = 3 + ar.rank() as i64;
            let mut t = Tensor::zeros([n], (Kind::Float, Device::Cpu));
            ar.sum_tensor(&mut t)
        });
        assert!(results.iter().all(Result::is_err), "{results:?}");
        let (_, mut ranks) = CpuGroup::new(1);
        let mut t = Tensor::zeros([2], (Kind::Double, Device::Cpu));
        assert!(matches!(
            ranks[0].sum_tensor(&mut t),
            Err(AllReduceError::BadBuffer(_))
        ));
    }
}
