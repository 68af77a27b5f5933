//! The real `dflashd` binary training the embedded default with `--metrics-listen`, scraped by
//! a real Prometheus server (Debian's `prometheus`), whose HTTP API must then return the
//! tokens/s series; `promtool check metrics` judges a scrape of the same daemon. Loopback only,
//! every wait bounded.
use std::time::{Duration, Instant};

use crate::support::binary::{journal, run, write_config, Daemon, WAIT};
use crate::support::prometheus::{self, get, promtool_check, url_addr, PrometheusServer};
use dflash_shared::events::EventKind;

/// Training on 2 shared cores may take a while to reach its first step after warm-up.
const FIRST_SAMPLE_WAIT: Duration = Duration::from_secs(180);
const NOTE: &str = "Prometheus metrics served at ";

/// The scrape URL the daemon journaled for the port it bound.
fn metrics_url(d: &mut Daemon) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let url = journal(&d.run_dir).into_iter().find_map(|e| match e.kind {
            EventKind::Note { message } => message
                .strip_prefix(NOTE)
                .and_then(|rest| rest.split(' ').next())
                .map(str::to_string),
            _ => None,
        });
        if let Some(url) = url {
            return url;
        }
        if let Ok(Some(status)) = d.child.try_wait() {
            panic!("dflashd exited ({status}) before serving:\n{}", d.stderr());
        }
        assert!(
            Instant::now() < deadline,
            "no metrics note in the journal:\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every query of the Grafana dashboard, with its `$run` variable set to any run.
fn dashboard_queries() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(s)) => out.push(s.replace("$run", ".+")),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../../assets/grafana/dflash.json")).unwrap();
    let mut out = Vec::new();
    walk(&dashboard, &mut out);
    out
}

#[test]
fn a_real_prometheus_scrapes_a_training_daemon_and_serves_its_tokens_per_second() {
    let Some(tools) = prometheus::tools() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::spawn(dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let url = metrics_url(&mut d);
    let addr = url_addr(&url);
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{url}");
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let server = PrometheusServer::start(&tools.prometheus, &prom_dir, addr);

    let deadline = Instant::now() + FIRST_SAMPLE_WAIT;
    let sample = loop {
        let reply = server.query("dflash_train_tokens_per_second");
        let first = reply["data"]["result"].as_array().and_then(|r| r.first());
        let value = first
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok());
        // The evaluation before step 1 publishes no throughput (0); a trained step does.
        if value.is_some_and(|v| v > 0.0) {
            break first.unwrap().clone();
        }
        if let Ok(Some(status)) = d.child.try_wait() {
            panic!(
                "dflashd exited ({status}) before Prometheus had a tokens/s sample; targets: \
                 {}\n{}",
                server.target_health(),
                d.stderr()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no tokens/s sample in Prometheus after {FIRST_SAMPLE_WAIT:?}; last reply {reply}; \
             targets: {}\nprometheus log:\n{}\ndflashd stderr:\n{}",
            server.target_health(),
            server.log(),
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(
        sample["metric"]["__name__"],
        "dflash_train_tokens_per_second"
    );
    assert_eq!(sample["metric"]["run"], "tiny-cpu");
    assert_eq!(sample["metric"]["job"], "dflashd");
    assert_eq!(sample["metric"]["instance"], addr.to_string());
    let up = server.query("up");
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");

    // The dashboard's queries are valid PromQL that this Prometheus evaluates.
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    for q in &queries {
        let reply = server.query(q);
        assert_eq!(reply["status"], "success", "dashboard query {q}: {reply}");
    }

    // The text Prometheus ingested is clean by promtool's rules too.
    let scrape = get(addr, "/metrics").unwrap();
    assert_eq!(scrape.status, 200);
    promtool_check(&tools.promtool, &scrape.body, dir.path())
        .unwrap_or_else(|e| panic!("{e}\n{}", scrape.body));

    assert!(
        d.stdout().contains(&format!("  metrics:  {url}")),
        "the banner names the endpoint:\n{}",
        d.stdout()
    );
    d.signal(libc::SIGTERM);
    let status = d.wait_exit();
    assert!(status.success(), "{status}\n{}", d.stderr());
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "{addr} still listening after dflashd exited"
    );
}

#[test]
fn a_bad_address_is_refused_by_the_flag_and_by_config_validate_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let run_dir = run_dir.to_str().unwrap();
    let (code, _, err) = run(
        dir.path(),
        &[
            "start",
            "--run-dir",
            run_dir,
            "--metrics-listen",
            "localhost:9464",
        ],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains(
            "--metrics-listen: expected an IP address and port such as 127.0.0.1:9464 or \
             [::1]:9464, or a bare port (loopback), found \"localhost:9464\" (a host name"
        ),
        "{err}"
    );
    assert!(
        !std::path::Path::new(run_dir).join("checkpoints").exists(),
        "a refused start trains nothing"
    );

    let config = dir.path().join("bad.toml");
    write_config(&config, |c| {
        c.metrics.listen = Some("127.0.0.1:99999".into())
    });
    let (code, out, err) = run(
        dir.path(),
        &["config", "validate", config.to_str().unwrap()],
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("metrics.listen (line ") && err.contains("found \"127.0.0.1:99999\""),
        "{err}"
    );
}

#[test]
fn the_config_key_serves_the_flag_overrides_it_and_a_taken_address_refuses_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("metrics.toml");
    write_config(&config, |c| c.metrics.listen = Some(taken_addr.to_string()));
    let config = config.to_str().unwrap();

    // The key names an address in use: the start is refused, saying so, before any training.
    let mut refused = Daemon::spawn(dir.path(), &["--config", config]);
    let status = refused.wait_exit();
    assert_eq!(status.code(), Some(1), "{}", refused.stderr());
    let said = format!("cannot serve Prometheus metrics on {taken_addr}");
    assert!(refused.stderr().contains(&said), "{}", refused.stderr());
    let stopped = journal(&refused.run_dir)
        .into_iter()
        .any(|e| matches!(&e.kind, EventKind::RunStopped { reason, .. } if reason.contains(&said)));
    assert!(
        stopped,
        "the refusal is the journaled reason the run did not start"
    );
    assert!(!refused.run_dir.join("checkpoints").exists());
    drop(refused);

    // The flag wins over the key.
    let mut d = Daemon::spawn(
        dir.path(),
        &["--config", config, "--metrics-listen", "127.0.0.1:0"],
    );
    let addr = url_addr(&metrics_url(&mut d));
    assert_ne!(addr, taken_addr);
    let scrape = get(addr, "/metrics").unwrap();
    assert_eq!(scrape.status, 200);
    assert!(scrape.body.contains("dflash_run_state{"), "{}", scrape.body);
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success(), "{}", d.stderr());
}
