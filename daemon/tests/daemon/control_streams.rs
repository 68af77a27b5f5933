//! Subscriptions over a real socket: topic filtering, and a slow reader dropped with a
//! notice while the producer never waits.

use std::time::{Duration, Instant};

use crate::support::in_process::{Options, TestDaemon};
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::metrics::{QueueStats, StepMetrics, StepTimes};
use dflash_shared::protocol::{Request, Response, Topic};

fn metrics(step: u64) -> StepMetrics {
    StepMetrics {
        ts_ms: 0,
        step,
        epoch: 1,
        loss: 2.5,
        accuracy: 0.4,
        tau: None,
        tau_tree: None,
        lr: 1e-4,
        grad_norm: 0.9,
        tokens_per_s: 21_500.0,
        draft_positions_per_s: 0.0,
        mfu: None,
        workers: vec![],
        times: StepTimes::default(),
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }
}

#[test]
fn subscribers_get_only_their_topics() {
    let d = TestDaemon::start();
    let mut c = d.client();
    assert_eq!(
        c.request(&Request::Subscribe {
            topics: vec![Topic::Events]
        }),
        Response::Ok
    );
    d.handle.publish_metrics(metrics(1));
    d.handle
        .record_event(
            Severity::Info,
            EventKind::Note {
                message: "hello".into(),
            },
        )
        .unwrap();
    match c.recv().unwrap() {
        Response::Event(e) => assert_eq!(
            e.kind,
            EventKind::Note {
                message: "hello".into()
            }
        ),
        other => panic!("metrics must not reach an events-only subscriber: {other:?}"),
    }
    assert_eq!(
        c.request(&Request::Subscribe {
            topics: vec![Topic::Metrics]
        }),
        Response::Ok
    );
    d.handle.publish_metrics(metrics(2));
    d.handle.publish_queue(QueueStats {
        depth: 3,
        ..Default::default()
    });
    assert!(matches!(c.recv().unwrap(), Response::Metrics(m) if m.step == 2));
    assert!(matches!(c.recv().unwrap(), Response::Queue(q) if q.depth == 3));
    // Status reflects what the run loop published.
    match c.request(&Request::Status) {
        Response::Status(s) => {
            assert_eq!(
                (s.run.step, s.throughput.tokens_per_s, s.queue.depth),
                (2, 21_500.0, 3)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn journal_events_are_queryable_by_seq() {
    let d = TestDaemon::start();
    for i in 0..5 {
        d.handle
            .record_event(
                Severity::Info,
                EventKind::Note {
                    message: format!("n{i}"),
                },
            )
            .unwrap();
    }
    let mut c = d.client();
    match c.request(&Request::Events {
        after_seq: Some(3),
        last: None,
    }) {
        Response::Events { events } => {
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5])
        }
        other => panic!("{other:?}"),
    }
    // "The last N events" without paging from the start.
    match c.request(&Request::Events {
        after_seq: None,
        last: Some(2),
    }) {
        Response::Events { events } => {
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5])
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_slow_subscriber_is_dropped_with_a_notice_and_never_slows_the_producer() {
    let d = TestDaemon::start_with(Options {
        bus_capacity: 64,
        ..Default::default()
    });
    let mut slow = d.client();
    assert_eq!(
        slow.request(&Request::Subscribe {
            topics: vec![Topic::Metrics]
        }),
        Response::Ok
    );
    let mut healthy = d.client();

    // The slow client reads nothing while the producer publishes far more than the bus and
    // the socket buffer hold. Publishing must stay fast: it never waits for a reader.
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for step in 0..20_000 {
        let t = Instant::now();
        d.handle.publish_metrics(metrics(step));
        slowest = slowest.max(t.elapsed());
    }
    let total = started.elapsed();
    assert!(
        total < Duration::from_secs(3),
        "publishing 20k frames took {total:?}"
    );
    assert!(
        slowest < Duration::from_millis(200),
        "one publish blocked for {slowest:?}"
    );

    // Other clients are served meanwhile.
    assert!(matches!(
        healthy.request(&Request::Status),
        Response::Status(_)
    ));

    // When the slow client finally reads, it finds what fit, then the notice, then EOF.
    let mut frames = 0;
    let reason = loop {
        match slow.recv() {
            Some(Response::Metrics(_)) => frames += 1,
            Some(Response::Dropped { reason }) => break reason,
            other => panic!("after {frames} frames: {other:?}"),
        }
    };
    assert!(reason.contains("behind"), "{reason}");
    assert!(
        frames < 20_000,
        "the slow client cannot have received everything"
    );
    assert!(slow.recv().is_none(), "dropped clients are disconnected");
    assert!(matches!(
        healthy.request(&Request::Status),
        Response::Status(_)
    ));
}

#[test]
fn a_client_that_never_reads_is_cut_off_by_the_write_timeout() {
    let d = TestDaemon::start_with(Options {
        bus_capacity: 100_000,
        tweak: Box::new(|c| c.write_timeout = Duration::from_millis(300)),
        ..Default::default()
    });
    let mut stuck = d.client();
    assert_eq!(
        stuck.request(&Request::Subscribe {
            topics: vec![Topic::Metrics]
        }),
        Response::Ok
    );
    for step in 0..20_000 {
        d.handle.publish_metrics(metrics(step));
    }
    std::thread::sleep(Duration::from_millis(800));
    // Drain: the server gave up on this connection, so the stream ends without a notice.
    let mut n = 0;
    while let Some(frame) = stuck.recv() {
        assert!(matches!(frame, Response::Metrics(_)), "{frame:?}");
        n += 1;
    }
    assert!(n < 20_000, "got {n}");
    let mut other = d.client();
    assert!(matches!(
        other.request(&Request::Status),
        Response::Status(_)
    ));
}
