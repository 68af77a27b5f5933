use super::*;
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

/// A [2, 8] f32 hidden-state block: 64 bytes.
fn block(v: f64) -> Tensor {
    Tensor::full([2, 8], v, (Kind::Float, Device::Cpu))
}

fn cfg(capacity: usize, high: usize, low: usize, byte_cap: u64) -> QueueConfig {
    QueueConfig {
        capacity,
        high_watermark: high,
        low_watermark: low,
        byte_cap,
    }
}

/// Polls `cond` for up to 5 s; the queue is driven by real threads.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn bad_watermarks_are_refused_with_the_numbers() {
    let err = HiddenStateQueue::<Tensor>::new(cfg(4, 6, 2, 100)).unwrap_err();
    assert!(
        err.to_string().contains("low 2, high 6, capacity 4"),
        "{err}"
    );
    assert!(HiddenStateQueue::<Tensor>::new(cfg(4, 4, 4, 100)).is_err());
    assert_eq!(
        HiddenStateQueue::<Tensor>::new(cfg(4, 4, 1, 0)).unwrap_err(),
        QueueConfigError::ZeroByteCap
    );
}

#[test]
fn tensors_come_out_in_order_with_their_bytes_accounted() {
    let q = HiddenStateQueue::new(cfg(8, 8, 2, 1 << 20)).unwrap();
    for i in 0..3 {
        q.push(block(i as f64)).unwrap();
    }
    let s = q.stats();
    assert_eq!((s.depth, s.bytes_resident), (3, 3 * 64));
    for i in 0..3 {
        let t = q.pop().unwrap();
        assert_eq!(t.double_value(&[0, 0]), i as f64);
    }
    assert_eq!(q.stats().bytes_resident, 0);
}

#[test]
fn producers_block_at_high_and_resume_only_at_low() {
    let q = Arc::new(HiddenStateQueue::new(cfg(8, 4, 2, 1 << 20)).unwrap());
    let producer = {
        let q = q.clone();
        std::thread::spawn(move || {
            for i in 0..10 {
                q.push(block(i as f64)).unwrap();
            }
        })
    };
    eventually("producer blocked at the high watermark", || {
        q.depth() == 4 && q.waiting().0 == 1
    });
    let _ = q.pop().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        q.depth(),
        3,
        "hysteresis: one pop above the low watermark must not release the producer"
    );
    assert_eq!(q.waiting().0, 1);
    let _ = q.pop().unwrap();
    eventually("producer refilled to the high watermark", || {
        q.depth() == 4 && q.waiting().0 == 1
    });
    while !matches!(q.pop_timeout(Duration::from_millis(500)), Popped::TimedOut) {}
    producer.join().unwrap();
    let s = q.stats();
    assert!(s.producer_blocked_ms >= 40.0, "{s:?}");
    assert_eq!(s.depth, 0);
}

#[test]
fn the_byte_cap_bounds_resident_memory() {
    // Room for 3 blocks of 64 bytes even though the watermarks allow 8.
    let q = Arc::new(HiddenStateQueue::new(cfg(8, 8, 2, 200)).unwrap());
    let producer = {
        let q = q.clone();
        std::thread::spawn(move || {
            for i in 0..5 {
                q.push(block(i as f64)).unwrap();
            }
        })
    };
    eventually("producer blocked by bytes", || {
        q.depth() == 3 && q.waiting().0 == 1
    });
    assert_eq!(q.stats().bytes_resident, 192);
    let _ = q.pop().unwrap();
    eventually("one more fits", || {
        q.depth() == 3 && q.stats().bytes_resident == 192
    });
    let _ = q.pop().unwrap();
    producer.join().unwrap();
}

#[test]
fn an_item_larger_than_the_cap_comes_back_with_an_error() {
    let q = HiddenStateQueue::new(cfg(4, 4, 1, 32)).unwrap();
    match q.push(block(1.0)) {
        Err(PushError::TooLarge { item, bytes, cap }) => {
            assert_eq!((bytes, cap), (64, 32));
            assert_eq!(item.double_value(&[0, 0]), 1.0);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn close_lets_consumers_drain_then_end_and_returns_late_pushes() {
    let q = HiddenStateQueue::new(cfg(4, 4, 1, 1 << 20)).unwrap();
    q.push(block(7.0)).unwrap();
    q.close();
    assert!(
        matches!(q.push(block(8.0)), Err(PushError::Closed(t)) if t.double_value(&[0, 0]) == 8.0)
    );
    assert_eq!(q.pop().unwrap().double_value(&[0, 0]), 7.0);
    assert!(q.pop().is_none());
    assert!(matches!(
        q.pop_timeout(Duration::from_millis(1)),
        Popped::Closed
    ));
}

#[test]
fn shutdown_releases_blocked_producers_and_starved_consumers() {
    let q = Arc::new(HiddenStateQueue::new(cfg(2, 2, 1, 1 << 20)).unwrap());
    q.push(block(0.0)).unwrap();
    q.push(block(1.0)).unwrap();
    let producer = {
        let q = q.clone();
        std::thread::spawn(move || q.push(block(2.0)).is_err())
    };
    eventually("producer blocked", || q.waiting().0 == 1);
    assert_eq!(q.shutdown(), 2);
    assert!(producer.join().unwrap(), "blocked push returns Closed");
    let empty = Arc::new(HiddenStateQueue::<Tensor>::new(cfg(2, 2, 1, 1 << 20)).unwrap());
    let consumer = {
        let q = empty.clone();
        std::thread::spawn(move || q.pop())
    };
    eventually("consumer waiting", || empty.waiting().1 == 1);
    empty.shutdown();
    assert!(consumer.join().unwrap().is_none());
}

#[test]
fn starved_consumer_time_is_measured_including_a_wait_in_progress() {
    let q = Arc::new(HiddenStateQueue::<Tensor>::new(cfg(4, 4, 1, 1 << 20)).unwrap());
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || q.pop())
    };
    eventually("consumer waiting", || q.waiting().1 == 1);
    std::thread::sleep(Duration::from_millis(60));
    let during = q.stats();
    assert!(
        during.consumer_starved_ms >= 50.0,
        "ongoing wait counts: {during:?}"
    );
    q.push(block(1.0)).unwrap();
    let _ = consumer.join().unwrap().unwrap();
    let after = q.stats();
    assert!(after.consumer_starved_ms >= during.consumer_starved_ms);
    assert_eq!(q.waiting(), (0, 0));
}

#[test]
fn two_producers_and_two_consumers_lose_nothing() {
    let q = Arc::new(HiddenStateQueue::new(cfg(8, 6, 2, 64 * 5)).unwrap());
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let q = q.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    q.push(vec![block((p * 1000 + i) as f64)]).unwrap();
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut sum = 0.0;
                let mut n = 0;
                while let Some(v) = q.pop() {
                    assert!(q.depth() <= 6);
                    sum += v[0].double_value(&[1, 7]);
                    n += 1;
                }
                (sum, n)
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    q.close();
    let (sum, n) = consumers
        .into_iter()
        .map(|c| c.join().unwrap())
        .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let expected: f64 = (0..2)
        .flat_map(|p| (0..200).map(move |i| (p * 1000 + i) as f64))
        .sum();
    assert_eq!((sum, n), (expected, 400));
    let s = q.stats();
    assert!(s.producer_rate > 0.0 && s.consumer_rate > 0.0, "{s:?}");
}
