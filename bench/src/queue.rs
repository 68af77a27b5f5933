//! Hidden-state queue throughput: producer threads (target workers) push feature tensors of the
//! training shape through [`HiddenStateQueue`] to consumer threads (drafter workers), with the
//! queue's bounds (watermarks, byte cap) active.
//!
//! The tensors are allocated once and pushed as shallow clones, so what is timed is the queue
//! (locking, waiting, byte accounting, hand-off between threads), not the allocator: the cost
//! the queue adds on top of the workers' own compute.
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::BenchError;
use dflash_engine::train::topology::queue::{ByteSized, HiddenStateQueue, PushError, QueueConfig};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueueCase {
    /// One item: `[1, seq_len, features]` fp32, like a `[B, S, n·H]` feature block.
    pub seq_len: i64,
    pub features: i64,
    pub items: usize,
    pub producers: usize,
    pub consumers: usize,
    pub capacity: usize,
    pub high_watermark: usize,
    pub low_watermark: usize,
    /// In items; the byte cap is this many items' bytes.
    pub byte_cap_items: u64,
}

impl QueueCase {
    /// 2048 tokens × 5 taps × hidden 1024 (40 MiB per item), 2 producers, 2 consumers, a queue
    /// of 8 with watermarks 6/2 and room for 4 items' bytes, so the byte cap binds.
    pub fn default_for(items: usize) -> Self {
        Self {
            seq_len: 2048,
            features: 5 * 1024,
            items,
            producers: 2,
            consumers: 2,
            capacity: 8,
            high_watermark: 6,
            low_watermark: 2,
            byte_cap_items: 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueRun {
    pub case: QueueCase,
    pub item_bytes: u64,
    pub elapsed_ms: f64,
    pub items_per_s: f64,
    /// Bytes of feature tensors handed over per second (handles move; data is not copied).
    pub gib_per_s: f64,
    /// Mean wall time per item across the whole pipeline.
    pub us_per_item: f64,
    pub producer_blocked_ms: f64,
    pub consumer_starved_ms: f64,
    pub error: Option<String>,
}

pub fn run_queue(case: QueueCase) -> Result<QueueRun, BenchError> {
    let pool: Vec<Tensor> = (0..case.capacity + 2)
        .map(|i| {
            Tensor::full(
                [1, case.seq_len, case.features],
                i as f64,
                (Kind::Float, Device::Cpu),
            )
        })
        .collect();
    let item_bytes = pool[0].byte_size();
    let cfg = QueueConfig {
        capacity: case.capacity,
        high_watermark: case.high_watermark,
        low_watermark: case.low_watermark,
        byte_cap: item_bytes * case.byte_cap_items,
    };
    let queue = Arc::new(HiddenStateQueue::new(cfg).map_err(|e| BenchError::Process {
        program: "queue".into(),
        detail: e.to_string(),
    })?);
    let start = Instant::now();
    let producers: Vec<_> = (0..case.producers)
        .map(|p| {
            // Tensors are Send but not Sync: each producer owns shallow clones of the pool.
            let queue = Arc::clone(&queue);
            let pool: Vec<Tensor> = pool.iter().map(Tensor::shallow_clone).collect();
            let share = case.items / case.producers + usize::from(p < case.items % case.producers);
            thread::spawn(move || -> Result<(), String> {
                for i in 0..share {
                    queue
                        .push(pool[(p + i) % pool.len()].shallow_clone())
                        .map_err(|e: PushError<Tensor>| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    let consumers: Vec<_> = (0..case.consumers)
        .map(|_| {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                let mut n = 0usize;
                while let Some(t) = queue.pop() {
                    std::hint::black_box(t.numel());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut error = None;
    for p in producers {
        if let Ok(Err(e)) | Err(e) = p.join().map_err(|_| "a producer panicked".to_string()) {
            error = Some(e);
        }
    }
    queue.close();
    let consumed: usize = consumers.into_iter().map(|c| c.join().unwrap_or(0)).sum();
    let elapsed = start.elapsed().as_secs_f64();
    if error.is_none() && consumed != case.items {
        error = Some(format!("{consumed} items consumed, {} pushed", case.items));
    }
    let stats = queue.stats();
    Ok(QueueRun {
        case,
        item_bytes,
        elapsed_ms: elapsed * 1e3,
        items_per_s: consumed as f64 / elapsed,
        gib_per_s: consumed as f64 * item_bytes as f64 / elapsed / (1u64 << 30) as f64,
        us_per_item: elapsed * 1e6 / consumed.max(1) as f64,
        producer_blocked_ms: stats.producer_blocked_ms,
        consumer_starved_ms: stats.consumer_starved_ms,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_crosses_the_queue_under_a_binding_byte_cap() {
        let case = QueueCase {
            seq_len: 16,
            features: 8,
            items: 500,
            ..QueueCase::default_for(500)
        };
        let run = run_queue(case).unwrap();
        assert_eq!(run.error, None);
        assert_eq!(run.item_bytes, 16 * 8 * 4);
        assert!(run.items_per_s > 0.0 && run.us_per_item > 0.0);
    }
}
