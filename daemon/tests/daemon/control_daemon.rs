//! The assembled control plane on a run dir: lock, fingerprint on resume, caches, shutdown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::in_process::Client;
use dflash_shared::events::EventKind;
use dflash_shared::protocol::{Request, Response, PROTOCOL_VERSION};
use dflash_shared::status::RunState;
use dflashd::run::bus::FrameBus;
use dflashd::run::journal::JournalQuery;
use dflashd::runtime::guard_rails::{DaemonOptions, GuardRails, StartError};
use dflashd::telemetry::caches::CacheSpec;
use dflashd::telemetry::fingerprint::{ConfigSource, FingerprintInputs, ResumeDecision};

fn venv_with_torch(root: &Path, version: &str) -> PathBuf {
    let venv = root.join("venv");
    let site = venv.join("lib/python3.11/site-packages");
    let _ = std::fs::remove_dir_all(&site);
    let dist = site.join(format!("torch-{version}.dist-info"));
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(
        dist.join("METADATA"),
        format!("Name: torch\nVersion: {version}\n"),
    )
    .unwrap();
    venv
}

fn options(root: &Path, accepted: Option<String>) -> DaemonOptions {
    let cache = root.join("inductor");
    DaemonOptions {
        run_name: "run1".into(),
        run_dir: root.join("run"),
        socket: root.join("sock/dflashd.sock"),
        bus: FrameBus::default(),
        poweroff_command: None,
        pending_ttl_ms: 60_000,
        telemetry_interval: Duration::from_millis(50),
        cache_interval: Duration::from_millis(50),
        cache_specs: Some(vec![CacheSpec {
            name: "torchinductor".into(),
            path: cache,
        }]),
        fingerprint: FingerprintInputs {
            config: ConfigSource::Embedded("[training]\nepochs = 6\n".into()),
            data_files: vec![],
            python_env: Some(root.join("venv")),
            cuda_alloc_conf: None,
        },
        accepted_drift_token: accepted,
        config: std::sync::Arc::new(dflash_shared::config::Config::embedded_default()),
        config_path: None,
    }
}

fn client(socket: &Path) -> Client {
    let mut c = Client::connect(socket);
    assert!(matches!(
        c.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client: "t".into(),
            access: Default::default(),
        }),
        Response::Welcome { .. }
    ));
    c
}

fn kinds(cp: &GuardRails) -> Vec<EventKind> {
    cp.handle
        .with_journal(|j| j.query(&JournalQuery::default()))
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

#[test]
fn lock_fingerprint_drift_caches_and_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    venv_with_torch(root, "2.11.0+cu128");
    std::fs::create_dir_all(root.join("inductor/fx")).unwrap();
    std::fs::write(root.join("inductor/fx/graph.bin"), vec![1u8; 4096]).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // First start: a new run.
        let cp = GuardRails::start(options(root, None)).await.unwrap();
        assert_eq!(cp.resume, ResumeDecision::FirstStart);
        assert!(cp.resume_allowed());
        // A second daemon on the same run dir is refused, naming the live pid.
        let err = GuardRails::start(options(root, None)).await.unwrap_err();
        assert!(matches!(err, StartError::Lock(_)), "{err}");
        assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");

        let socket = cp.socket.clone();
        let caches = tokio::task::spawn_blocking(move || {
            let mut c = client(&socket);
            let fp = match c.request(&Request::Fingerprint) {
                Response::Json { value } => value,
                other => panic!("{other:?}"),
            };
            assert_eq!(fp["python_packages"]["torch"], "2.11.0+cu128");
            // The sampler scans caches on its own thread; wait for the first inventory.
            for _ in 0..100 {
                if let Response::Json { value } = c.request(&Request::Caches) {
                    if value.as_array().is_some_and(|a| !a.is_empty()) {
                        return value;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("no cache inventory");
        })
        .await
        .unwrap();
        assert_eq!(caches[0]["entries"], 1);
        assert_eq!(caches[0]["warm"], true);
        cp.handle.request_shutdown("test restart");
        let socket = cp.socket.clone();
        cp.wait().await;
        assert!(!socket.exists());

        // While the daemon is down: torch is swapped and the compile cache deleted.
        venv_with_torch(root, "2.9.1+cu130");
        std::fs::remove_dir_all(root.join("inductor")).unwrap();
        let cp = GuardRails::start(options(root, None)).await.unwrap();
        let token = match &cp.resume {
            ResumeDecision::Blocked { drifts, confirm_token } => {
                assert_eq!(drifts[0].sentence(), "torch 2.11.0+cu128 → 2.9.1+cu130");
                confirm_token.clone()
            }
            other => panic!("a torch swap must hold the run: {other:?}"),
        };
        assert!(!cp.resume_allowed());
        assert_eq!(cp.handle.status_snapshot().run.state, RunState::Paused);
        // The deletion is journaled from the saved inventory on the first scan.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !kinds(&cp).iter().any(|k| matches!(k, EventKind::CacheChanged { change, .. } if change.starts_with("deleted"))) {
            assert!(std::time::Instant::now() < deadline, "cache deletion not journaled: {:?}", kinds(&cp));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let k = kinds(&cp);
        assert!(k.iter().any(|k| matches!(k, EventKind::EnvironmentDrift { field, .. } if field == "python.torch")));
        assert!(k.iter().any(|k| matches!(k, EventKind::RunPaused { reason } if reason.contains(&token))));
        cp.handle.request_shutdown("operator will accept");
        cp.wait().await;

        // Accepted by its token: resume proceeds and the new environment becomes the reference.
        let cp = GuardRails::start(options(root, Some(token))).await.unwrap();
        assert!(matches!(cp.resume, ResumeDecision::Proceed { accepted: true, .. }), "{:?}", cp.resume);
        cp.handle.request_shutdown("done");
        cp.wait().await;
        let cp = GuardRails::start(options(root, None)).await.unwrap();
        assert_eq!(cp.resume, ResumeDecision::Unchanged);
        cp.handle.request_shutdown("done");
        cp.wait().await;
    });
}
