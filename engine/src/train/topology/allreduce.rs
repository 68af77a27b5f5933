//! Summing gradients and loss statistics across the drafter replicas.
//!
//! [`AllReduce`] is one rank's endpoint of a group. [`CpuAllReduce`] sums CPU tensors across
//! threads: every rank deposits its buffer, rank 0 adds them in rank order (so the result is
//! the same bits every run, whatever thread arrives first), and every rank copies the sum back.
//! The CUDA endpoint is NCCL ([`super::nccl`]). A group can be aborted from any thread: ranks
//! waiting in it return [`AllReduceError::Aborted`] instead of waiting for a dead peer forever.
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
