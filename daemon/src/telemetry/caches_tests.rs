use super::*;
use crate::telemetry::warmup::{WarmupDevice, WarmupRecord};
use dflash_shared::events::EventKind;
use dflash_shared::health::CacheChangeKind;
use dflash_shared::metrics::DeviceRole;

fn fill(dir: &Path, files: usize, bytes: usize) {
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    for i in 0..files {
        let sub = if i % 2 == 0 {
            dir.join("sub")
        } else {
            dir.join("sub/deeper")
        };
        std::fs::write(sub.join(format!("k{i}.bin")), vec![7u8; bytes]).unwrap();
    }
}

#[test]
fn defaults_follow_each_tools_rules() {
    let env = CacheEnv {
        torchinductor_cache_dir: None,
        triton_cache_dir: Some("/fast/triton".into()),
        cuda_cache_path: None,
        home: Some("/home/op".into()),
        user: Some("op".into()),
        tmp_dir: "/tmp".into(),
    };
    let specs = default_cache_specs(&env, Path::new("/runs/a"));
    let get = |n: &str| specs.iter().find(|s| s.name == n).unwrap().path.clone();
    assert_eq!(get("torchinductor"), PathBuf::from("/tmp/torchinductor_op"));
    assert_eq!(get("triton"), PathBuf::from("/fast/triton"));
    assert_eq!(
        get("cuda_compute_cache"),
        PathBuf::from("/home/op/.nv/ComputeCache")
    );
    assert_eq!(get(WARMUP_CACHE_NAME), PathBuf::from("/runs/a/warmup.json"));
    let env = CacheEnv {
        torchinductor_cache_dir: Some("/x/inductor".into()),
        ..env
    };
    assert_eq!(
        default_cache_specs(&env, Path::new("/r"))[0].path,
        PathBuf::from("/x/inductor")
    );
}

#[test]
fn scan_counts_files_recursively_and_reports_warm() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = CacheSpec {
        name: "torchinductor".into(),
        path: tmp.path().join("inductor"),
    };
    assert!(!scan(&spec).present);
    fill(&spec.path, 6, 100);
    let s = scan(&spec);
    assert!(s.present && s.warm);
    assert_eq!((s.entries, s.size_bytes), (6, 600));
    assert!(s.last_change_ms.is_some());
}

#[test]
fn symlinks_inside_a_cache_are_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    fill(&outside, 4, 1000);
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::symlink(&outside, cache.join("link")).unwrap();
    let s = scan(&CacheSpec {
        name: "c".into(),
        path: cache,
    });
    assert_eq!((s.entries, s.size_bytes), (0, 0));
}

#[test]
fn monitor_detects_deletion_and_going_cold_between_scans() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    fill(&a, 20, 10);
    fill(&b, 20, 10);
    let specs = vec![
        CacheSpec {
            name: "a".into(),
            path: a.clone(),
        },
        CacheSpec {
            name: "b".into(),
            path: b.clone(),
        },
    ];
    let mut m = CacheMonitor::new(specs, &[], 0);
    let first = m.scan_all(1);
    assert_eq!(first.states.len(), 2);
    assert!(
        first.changes.is_empty(),
        "a first scan without history reports nothing"
    );
    std::fs::remove_dir_all(&a).unwrap();
    std::fs::remove_dir_all(b.join("sub")).unwrap();
    let next = m.scan_all(2);
    let kinds: Vec<(String, CacheChangeKind)> = next
        .changes
        .iter()
        .map(|c| (c.name.clone(), c.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("a".into(), CacheChangeKind::Deleted),
            ("b".into(), CacheChangeKind::WentCold)
        ]
    );
    match next.changes[0].to_event_kind() {
        EventKind::CacheChanged { change, .. } => {
            assert_eq!(change, "deleted (was 200 B, 20 entries)")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(next.transitions.len(), 2, "both warm caches raise an alert");
}

#[test]
fn deletion_while_the_daemon_was_down_is_reported_from_the_saved_inventory() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let cache = tmp.path().join("inductor");
    fill(&cache, 12, 10);
    let specs = vec![CacheSpec {
        name: "torchinductor".into(),
        path: cache.clone(),
    }];
    let scan = CacheMonitor::new(specs.clone(), &[], 0).scan_all(1);
    save_inventory(&run_dir, &scan.states).unwrap();
    std::fs::remove_dir_all(&cache).unwrap();
    let (previous, saved_ms) = load_inventory(&run_dir);
    assert!(saved_ms > 0);
    let mut next = CacheMonitor::new(specs, &previous, saved_ms);
    let scan = next.scan_all(saved_ms + 1);
    assert_eq!(scan.changes.len(), 1);
    assert_eq!(scan.changes[0].kind, CacheChangeKind::Deleted);
}

#[test]
fn the_warmup_record_counts_warmed_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let specs = default_cache_specs(
        &CacheEnv {
            tmp_dir: "/nonexistent".into(),
            ..Default::default()
        },
        tmp.path(),
    );
    let spec = specs.iter().find(|s| s.name == WARMUP_CACHE_NAME).unwrap();
    assert!(!scan(spec).warm);
    let mut r = WarmupRecord::default();
    r.record_device(
        tmp.path(),
        WarmupDevice {
            device: "cpu".into(),
            role: DeviceRole::Both,
            duration_ms: 10.0,
            finished_ms: 1,
        },
    )
    .unwrap();
    let s = scan(spec);
    assert!(s.warm && s.present);
    assert_eq!(s.entries, 1);
}
