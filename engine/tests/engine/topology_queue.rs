//! The hidden-state queue's statistics move the way an unbalanced topology says they must, and
//! the serialized warmup is measured per worker (the daemon writes it to `warmup.json`; see
//! the daemon's lifecycle test).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::topology::{config, cpu_topology, trainer, within};
use dflash_engine::train::topology::queue::QueueConfig;
use dflash_shared::metrics::DeviceRole;

#[test]
fn drafter_bound_producers_block_at_the_high_watermark() {
    within(Duration::from_secs(90), || {
        // Two target workers feed one drafter that trains 4x the tiny default's anchors.
        let mut cfg = config(4, 1);
        cfg.training.num_anchors = 64;
        let mut topo = cpu_topology(2, 1);
        topo.queue = QueueConfig {
            capacity: 2,
            high_watermark: 2,
            low_watermark: 1,
            byte_cap: 1 << 30,
        };
        let mut t = trainer(cfg, topo);

        let records = t.warmup().unwrap().to_vec();
        let who: Vec<(DeviceRole, usize)> = records.iter().map(|r| (r.role, r.worker)).collect();
        assert_eq!(
            who,
            vec![
                (DeviceRole::Target, 0),
                (DeviceRole::Target, 1),
                (DeviceRole::Drafter, 0)
            ]
        );
        assert!(records
            .iter()
            .all(|r| r.duration_ms > 0.0 && r.device == "cpu"));
        assert_eq!(
            t.warmup_records(),
            records,
            "the warmup runs once and is kept"
        );

        let monitor = t.queue_monitor().expect("a threaded topology has a queue");
        let deepest = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (deepest, done, monitor) = (deepest.clone(), done.clone(), monitor.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    deepest.fetch_max(monitor.stats().depth, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        };
        for _ in 0..5 {
            t.train_step().unwrap();
        }
        done.store(true, Ordering::Relaxed);
        sampler.join().unwrap();
        let stats = t.queue_stats().unwrap();
        eprintln!(
            "drafter-bound queue: {stats:?}, deepest {}",
            deepest.load(Ordering::Relaxed)
        );
        assert_eq!(stats.high_watermark, 2);
        assert_eq!(
            deepest.load(Ordering::Relaxed),
            2,
            "depth reached the high watermark"
        );
        assert!(stats.depth <= stats.high_watermark);
        assert!(stats.producer_blocked_ms > 0.0, "{stats:?}");
        assert!(
            stats.producer_blocked_ms > stats.consumer_starved_ms,
            "{stats:?}"
        );
    });
}

#[test]
fn target_bound_consumers_starve_and_wait() {
    within(Duration::from_secs(90), || {
        // One target worker feeds two drafter ranks that each train a single anchor per row.
        let mut cfg = config(4, 1);
        cfg.training.num_anchors = 1;
        let mut t = trainer(cfg, cpu_topology(1, 2));
        let mut queue_wait = 0.0;
        for _ in 0..5 {
            queue_wait += t.train_step().unwrap().times.queue_wait_ms;
        }
        let stats = t.queue_stats().unwrap();
        eprintln!("target-bound queue: {stats:?}, drafter queue wait {queue_wait:.1} ms");
        assert!(stats.consumer_starved_ms > 0.0, "{stats:?}");
        assert!(
            stats.consumer_starved_ms > stats.producer_blocked_ms,
            "{stats:?}"
        );
        assert!(queue_wait > 0.0);
        assert_eq!(t.warmup_records().len(), 3);
    });
}
