//! The bounded hidden-state queue between target workers (producers) and drafter workers
//! (consumers), on std threads.
//!
//! Bounds: producers block once depth reaches the high watermark and stay blocked until it
//! falls to the low watermark (hysteresis: target workers resume in bursts instead of
//! ping-ponging on every pop), and whenever an item would push the resident bytes past the
//! byte cap. Depth therefore never exceeds `high_watermark <= capacity`.
//!
//! Stats say which side waits: cumulative producer-blocked and consumer-starved time
//! (including waits still in progress), and push/pop rates since the previous sample.
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dflash_shared::metrics::QueueStats;
use thiserror::Error;

/// Bytes an item holds resident (device or host memory).
pub trait ByteSized {
    fn byte_size(&self) -> u64;
}

impl ByteSized for tch::Tensor {
    fn byte_size(&self) -> u64 {
        (self.numel() * self.kind().elt_size_in_bytes()) as u64
    }
}

impl<T: ByteSized> ByteSized for Vec<T> {
    fn byte_size(&self) -> u64 {
        self.iter().map(ByteSized::byte_size).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    pub capacity: usize,
    pub high_watermark: usize,
    pub low_watermark: usize,
    pub byte_cap: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueueConfigError {
    #[error("queue watermarks must satisfy 0 <= low_watermark < high_watermark <= capacity; found low {low}, high {high}, capacity {capacity}")]
    Watermarks {
        low: usize,
        high: usize,
        capacity: usize,
    },
    #[error("queue byte_cap must be > 0")]
    ZeroByteCap,
}

impl QueueConfig {
    pub fn validate(&self) -> Result<(), QueueConfigError> {
        if !(self.low_watermark < self.high_watermark && self.high_watermark <= self.capacity) {
            return Err(QueueConfigError::Watermarks {
                low: self.low_watermark,
                high: self.high_watermark,
                capacity: self.capacity,
            });
        }
        if self.byte_cap == 0 {
            return Err(QueueConfigError::ZeroByteCap);
        }
        Ok(())
    }
}

/// A push that did not happen; the item comes back to the caller.
#[derive(Debug, Error)]
pub enum PushError<T> {
    #[error("the hidden-state queue is closed")]
    Closed(T),
    #[error("an item of {bytes} bytes can never fit under the queue's byte cap of {cap} bytes; raise queue.byte_cap")]
    TooLarge { item: T, bytes: u64, cap: u64 },
}

#[derive(Debug, PartialEq, Eq)]
pub enum Popped<T> {
    Item(T),
    /// Closed and drained: no item will ever come.
    Closed,
    TimedOut,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<(T, u64)>,
    bytes: u64,
    /// Producers are held since depth hit the high watermark, until it falls to the low one.
    gated: bool,
    closed: bool,
    pushed: u64,
    popped: u64,
    producer_blocked: Duration,
    consumer_starved: Duration,
    // Waits in progress: count and sum of start offsets from `epoch`, so their elapsed time
    // is `count * now - sum` without tracking each waiter.
    producers_waiting: u32,
    producer_wait_starts: Duration,
    consumers_waiting: u32,
    consumer_wait_starts: Duration,
    last_sample: (Instant, u64, u64),
}

#[derive(Debug)]
pub struct HiddenStateQueue<T> {
    cfg: QueueConfig,
    state: Mutex<State<T>>,
    not_full: Condvar,
    not_empty: Condvar,
    epoch: Instant,
}

impl<T: ByteSized> HiddenStateQueue<T> {
    pub fn new(cfg: QueueConfig) -> Result<Self, QueueConfigError> {
        cfg.validate()?;
        let epoch = Instant::now();
        Ok(HiddenStateQueue {
            cfg,
            state: Mutex::new(State {
                items: VecDeque::with_capacity(cfg.capacity),
                bytes: 0,
                gated: false,
                closed: false,
                pushed: 0,
                popped: 0,
                producer_blocked: Duration::ZERO,
                consumer_starved: Duration::ZERO,
                producers_waiting: 0,
                producer_wait_starts: Duration::ZERO,
                consumers_waiting: 0,
                consumer_wait_starts: Duration::ZERO,
                last_sample: (epoch, 0, 0),
            }),
            not_full: Condvar::new(),
            not_empty: Condvar::new(),
            epoch,
        })
    }

    pub fn config(&self) -> QueueConfig {
        self.cfg
    }

    /// Blocks while the queue is gated or the item does not fit, then enqueues it.
    pub fn push(&self, item: T) -> Result<(), PushError<T>> {
        let bytes = item.byte_size();
        if bytes > self.cfg.byte_cap {
            return Err(PushError::TooLarge {
                item,
                bytes,
                cap: self.cfg.byte_cap,
            });
        }
        let mut st = self.lock();
        let mut wait_start = None;
        loop {
            if st.closed {
                self.end_producer_wait(&mut st, wait_start);
                return Err(PushError::Closed(item));
            }
            let full = st.gated
                || st.items.len() >= self.cfg.high_watermark
                || st.bytes + bytes > self.cfg.byte_cap;
            if !full {
                break;
            }
            if wait_start.is_none() {
                let offset = self.epoch.elapsed();
                st.producers_waiting += 1;
                st.producer_wait_starts += offset;
                wait_start = Some(offset);
            }
            st = self.not_full.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        self.end_producer_wait(&mut st, wait_start);
        st.items.push_back((item, bytes));
        st.bytes += bytes;
        st.pushed += 1;
        if st.items.len() >= self.cfg.high_watermark {
            st.gated = true;
        }
        drop(st);
        self.not_empty.notify_one();
        Ok(())
    }

    /// Blocks until an item arrives; `None` once the queue is closed and drained.
    pub fn pop(&self) -> Option<T> {
        match self.pop_inner(None) {
            Popped::Item(t) => Some(t),
            Popped::Closed | Popped::TimedOut => None,
        }
    }

    /// Like [`pop`](Self::pop) but gives up after `timeout` (so a worker can check for stop).
    pub fn pop_timeout(&self, timeout: Duration) -> Popped<T> {
        self.pop_inner(Some(Instant::now() + timeout))
    }

    fn pop_inner(&self, deadline: Option<Instant>) -> Popped<T> {
        let mut st = self.lock();
        let mut wait_start = None;
        loop {
            if let Some((item, bytes)) = st.items.pop_front() {
                self.end_consumer_wait(&mut st, wait_start);
                st.bytes -= bytes;
                st.popped += 1;
                if st.gated && st.items.len() <= self.cfg.low_watermark {
                    st.gated = false;
                }
                drop(st);
                // Several producers may fit now (bytes freed, gate opened).
                self.not_full.notify_all();
                return Popped::Item(item);
            }
            if st.closed {
                self.end_consumer_wait(&mut st, wait_start);
                return Popped::Closed;
            }
            if wait_start.is_none() {
                let offset = self.epoch.elapsed();
                st.consumers_waiting += 1;
                st.consumer_wait_starts += offset;
                wait_start = Some(offset);
            }
            st = match deadline {
                None => self.not_empty.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        self.end_consumer_wait(&mut st, wait_start);
                        return Popped::TimedOut;
                    }
                    self.not_empty
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    /// No more pushes; consumers drain what is queued, then get `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.not_full.notify_all();
        self.not_empty.notify_all();
    }

    /// Closes and drops everything queued (a failed or stopping run); returns how many items
    /// were dropped. Blocked producers and consumers return at once.
    pub fn shutdown(&self) -> usize {
        let dropped = {
            let mut st = self.lock();
            st.closed = true;
            st.bytes = 0;
            std::mem::take(&mut st.items)
        };
        self.not_full.notify_all();
        self.not_empty.notify_all();
        dropped.len()
    }

    pub fn depth(&self) -> usize {
        self.lock().items.len()
    }

    /// (producers blocked now, consumers waiting now).
    pub fn waiting(&self) -> (u32, u32) {
        let st = self.lock();
        (st.producers_waiting, st.consumers_waiting)
    }

    /// A reading for telemetry. Rates cover the time since the previous call.
    pub fn stats(&self) -> QueueStats {
        let mut st = self.lock();
        let now = Instant::now();
        let since_epoch = now - self.epoch;
        let ongoing = |count: u32, starts: Duration| (since_epoch * count).saturating_sub(starts);
        let blocked = st.producer_blocked + ongoing(st.producers_waiting, st.producer_wait_starts);
        let starved = st.consumer_starved + ongoing(st.consumers_waiting, st.consumer_wait_starts);
        let (last_at, last_pushed, last_popped) = st.last_sample;
        let secs = (now - last_at).as_secs_f64();
        let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let stats = QueueStats {
            ts_ms: dflash_shared::clock::now_ms(),
            depth: st.items.len(),
            capacity: self.cfg.capacity,
            high_watermark: self.cfg.high_watermark,
            low_watermark: self.cfg.low_watermark,
            bytes_resident: st.bytes,
            byte_cap: self.cfg.byte_cap,
            producer_rate: rate(st.pushed - last_pushed),
            consumer_rate: rate(st.popped - last_popped),
            producer_blocked_ms: blocked.as_secs_f64() * 1000.0,
            consumer_starved_ms: starved.as_secs_f64() * 1000.0,
        };
        st.last_sample = (now, st.pushed, st.popped);
        stats
    }

    fn end_producer_wait(&self, st: &mut State<T>, wait_start: Option<Duration>) {
        if let Some(start) = wait_start {
            st.producers_waiting -= 1;
            st.producer_wait_starts -= start;
            st.producer_blocked += self.epoch.elapsed().saturating_sub(start);
        }
    }

    fn end_consumer_wait(&self, st: &mut State<T>, wait_start: Option<Duration>) {
        if let Some(start) = wait_start {
            st.consumers_waiting -= 1;
            st.consumer_wait_starts -= start;
            st.consumer_starved += self.epoch.elapsed().saturating_sub(start);
        }
    }

    // A panic while holding the lock cannot leave the queue half-updated (every mutation is
    // a few assignments), so a poisoned lock is still consistent.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
