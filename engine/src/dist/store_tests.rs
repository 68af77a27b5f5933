use std::time::{Duration, Instant};

use super::*;

fn pair() -> (TcpStore, TcpStore) {
    let server = TcpStore::serve("127.0.0.1", 0, 2, Duration::from_secs(5)).unwrap();
    assert_ne!(server.port(), 0, "port 0 binds a real port");
    let client = TcpStore::connect("127.0.0.1", server.port(), 2, Duration::from_secs(5)).unwrap();
    (server, client)
}

#[test]
fn bytes_set_on_one_rank_are_read_on_the_other_and_counters_add_up() {
    let (server, client) = pair();
    let value: Vec<u8> = (0..=255).collect();
    server.set("blob", &value).unwrap();
    assert_eq!(client.get("blob", Duration::from_secs(1)).unwrap(), value);
    client.set("empty", &[]).unwrap();
    assert_eq!(server.get("empty", Duration::from_secs(1)).unwrap(), b"");
    assert_eq!(server.add("count", 2).unwrap(), 2);
    assert_eq!(client.add("count", 3).unwrap(), 5);
    assert!(client.check(&["blob", "count"]).unwrap());
    assert!(!client.check(&["blob", "never-set"]).unwrap());
    server
        .wait(&["blob", "empty"], Duration::from_secs(1))
        .unwrap();
}

#[test]
fn a_get_waits_for_a_key_another_rank_sets_later() {
    let (server, client) = pair();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        client.set("late", b"here").unwrap();
        client
    });
    assert_eq!(server.get("late", Duration::from_secs(5)).unwrap(), b"here");
    drop(setter.join().unwrap());
}

#[test]
fn a_missing_key_times_out_with_an_error_naming_it_instead_of_hanging() {
    let (_server, client) = pair();
    let started = Instant::now();
    let err = client
        .get("nobody/sets/this", Duration::from_millis(300))
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        // Bounded both ways; the upper bound leaves room for a loaded machine.
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert!(matches!(err, StoreError::Timeout { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("\"nobody/sets/this\"") && text.contains("timed out after 300 ms"),
        "{text}"
    );
    let err = client
        .wait(&["a", "b"], Duration::from_millis(100))
        .unwrap_err();
    assert!(err.to_string().contains("no rank set them all"), "{err}");
}

#[test]
fn no_infinite_waits_and_no_nul_keys() {
    let (server, _client) = pair();
    let err = server.get("k", Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("no infinite wait"), "{err}");
    let err = server.set("a\0b", b"").unwrap_err();
    assert!(err.to_string().contains("NUL"), "{err}");
    let err = TcpStore::connect("127.0.0.1", 0, 2, Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("give the port"), "{err}");
}

#[test]
fn connecting_where_no_store_listens_fails_within_the_timeout() {
    // A port that was free a moment ago: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let err = TcpStore::connect("127.0.0.1", port, 2, Duration::from_millis(500)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&err, StoreError::Failed { addr, .. } if addr == &format!("127.0.0.1:{port}")),
        "{err:?}"
    );
}
