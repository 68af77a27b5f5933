//! The fan-out of live frames (metrics, events, logs) to subscribers.
//!
//! A `tokio::sync::broadcast` channel: `send` never blocks and needs no runtime, so training
//! threads publish directly. A subscriber that falls more than the channel capacity behind
//! sees `Lagged` on its next receive and is dropped with a notice; the producer never waits.
use std::sync::Arc;

use dflash_shared::protocol::{Response, Topic};
use tokio::sync::broadcast;

pub const DEFAULT_BUS_CAPACITY: usize = 1024;

/// One published frame and the topic a subscriber must have asked for to get it.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub topic: Topic,
    pub frame: Response,
}

#[derive(Debug, Clone)]
pub struct FrameBus {
    tx: broadcast::Sender<Arc<Published>>,
}

impl FrameBus {
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        FrameBus { tx }
    }

    /// Publishes to whoever listens right now; no listener is not an error.
    pub fn publish(&self, topic: Topic, frame: Response) {
        let _ = self.tx.send(Arc::new(Published { topic, frame }));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Published>> {
        self.tx.subscribe()
    }

    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count()
    }
}

impl Default for FrameBus {
    fn default() -> Self {
        FrameBus::new(DEFAULT_BUS_CAPACITY)
    }
}
