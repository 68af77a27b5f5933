use super::*;

fn fp() -> Fingerprint {
    Fingerprint {
        captured_ms: 1,
        libtorch_version: Some("2.11.0+cu128".into()),
        config_hash: Some("aa".into()),
        python_packages: [("torch".to_string(), "2.11.0+cu128".to_string())]
            .into_iter()
            .collect(),
        gpu_models: vec!["NVIDIA H200".into(); 8],
        ..Default::default()
    }
}

#[test]
fn first_start_and_unchanged_resume_proceed() {
    assert_eq!(
        resume_decision(None, &fp(), None),
        ResumeDecision::FirstStart
    );
    let mut later = fp();
    later.captured_ms = 99;
    assert_eq!(
        resume_decision(Some(&fp()), &later, None),
        ResumeDecision::Unchanged
    );
}

#[test]
fn a_torch_swap_blocks_resume_until_its_token_is_given() {
    let mut swapped = fp();
    swapped
        .python_packages
        .insert("torch".into(), "2.9.1+cu130".into());
    let ResumeDecision::Blocked {
        drifts,
        confirm_token,
    } = resume_decision(Some(&fp()), &swapped, None)
    else {
        panic!("a torch swap must block");
    };
    assert_eq!(drifts[0].sentence(), "torch 2.11.0+cu128 → 2.9.1+cu130");
    assert!(matches!(
        resume_decision(Some(&fp()), &swapped, Some("0000")),
        ResumeDecision::Blocked { .. }
    ));
    assert_eq!(
        resume_decision(Some(&fp()), &swapped, Some(&confirm_token)),
        ResumeDecision::Proceed {
            drifts,
            accepted: true
        }
    );
}

#[test]
fn an_acceptance_is_bound_to_the_environment_it_was_given_for() {
    let mut first = fp();
    first
        .python_packages
        .insert("torch".into(), "2.9.1+cu130".into());
    let ResumeDecision::Blocked {
        confirm_token: token,
        ..
    } = resume_decision(Some(&fp()), &first, None)
    else {
        panic!("a torch swap must block");
    };
    let mut second = first.clone();
    second.cuda_driver = Some("580.82".into());
    assert!(matches!(
        resume_decision(Some(&fp()), &second, Some(&token)),
        ResumeDecision::Blocked { .. }
    ));
}

#[test]
fn a_config_hash_change_alone_does_not_block() {
    let mut edited = fp();
    edited.config_hash = Some("bb".into());
    assert!(matches!(
        resume_decision(Some(&fp()), &edited, None),
        ResumeDecision::Proceed {
            accepted: false,
            ..
        }
    ));
}

#[test]
fn a_rebuild_at_a_new_commit_resumes_but_a_torch_change_still_blocks() {
    let mut previous = fp();
    previous.code_git_commit = Some("0123456789abcdef0123456789abcdef01234567".into());
    previous.dflashd_version = Some("0.1.0".into());
    let mut rebuilt = previous.clone();
    rebuilt.code_git_commit = Some("fedcba9876543210fedcba9876543210fedcba98".into());
    rebuilt.dflashd_version = Some("0.1.1".into());
    let ResumeDecision::Proceed { drifts, accepted } =
        resume_decision(Some(&previous), &rebuilt, None)
    else {
        panic!("a code-only change must not hold the resume");
    };
    assert!(!accepted, "nothing needed accepting");
    let fields: Vec<&str> = drifts.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(fields, ["dflashd", "code_git_commit"]);
    assert!(matches!(
        drifts[1].to_event_kind(),
        dflash_shared::events::EventKind::EnvironmentChanged { .. }
    ));

    let mut rebuilt_and_swapped = rebuilt.clone();
    rebuilt_and_swapped
        .python_packages
        .insert("torch".into(), "2.9.1+cu130".into());
    let ResumeDecision::Blocked { drifts, .. } =
        resume_decision(Some(&previous), &rebuilt_and_swapped, None)
    else {
        panic!("a torch change still blocks next to a commit change");
    };
    let blocking: Vec<&str> = drifts
        .iter()
        .filter(|d| d.blocks_resume)
        .map(|d| d.field.as_str())
        .collect();
    assert_eq!(blocking, ["python.torch"]);
}

#[test]
fn a_token_survives_a_rebuild_but_not_another_blocking_change() {
    let token = |current: &Fingerprint| match resume_decision(Some(&fp()), current, None) {
        ResumeDecision::Blocked { confirm_token, .. } => confirm_token,
        other => panic!("expected a block, got {other:?}"),
    };
    let mut swapped = fp();
    swapped
        .python_packages
        .insert("torch".into(), "2.9.1+cu130".into());
    let mut rebuilt = swapped.clone();
    rebuilt.captured_ms = 12345;
    rebuilt.code_git_commit = Some("0123abcd".into());
    assert_eq!(token(&swapped), token(&rebuilt));
    assert!(matches!(
        resume_decision(Some(&fp()), &rebuilt, Some(&token(&swapped))),
        ResumeDecision::Proceed { accepted: true, .. }
    ));
    let mut other = swapped.clone();
    other
        .python_packages
        .insert("torch".into(), "2.10.0+cu130".into());
    assert_ne!(token(&swapped), token(&other));
}

#[test]
fn persisted_fingerprint_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(load(dir.path()).unwrap(), None);
    save(dir.path(), &fp()).unwrap();
    assert_eq!(load(dir.path()).unwrap(), Some(fp()));
    std::fs::write(dir.path().join(FINGERPRINT_FILE_NAME), "{oops").unwrap();
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("fingerprint.json") && err.contains("not a valid"),
        "{err}"
    );
}

#[test]
fn data_hash_changes_with_content_and_names_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    std::fs::write(&a, "{\"x\":1}\n").unwrap();
    let h1 = hash_data_files(std::slice::from_ref(&a)).unwrap();
    std::fs::write(&a, "{\"x\":2}\n").unwrap();
    assert_ne!(h1, hash_data_files(std::slice::from_ref(&a)).unwrap());
    let err = hash_data_files(&[dir.path().join("missing.jsonl")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data file") && err.contains("missing.jsonl"),
        "{err}"
    );
}

#[test]
fn the_loaded_libtorch_is_identified_from_the_process_maps() {
    // Touch libtorch so it is certainly mapped, then read what was loaded.
    let _ = tch::Tensor::zeros([1], (tch::Kind::Float, tch::Device::Cpu));
    let v =
        loaded_libtorch_version().expect("libtorch version from version.py next to the loaded lib");
    assert!(v.starts_with("2."), "{v}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    std::fs::write(
        dir.path().join("version.py"),
        "__version__ = '2.9.1+cu130'\ndebug = False\n",
    )
    .unwrap();
    assert_eq!(
        libtorch_version_in(&dir.path().join("lib")).as_deref(),
        Some("2.9.1+cu130")
    );
}

#[test]
fn collect_fills_what_this_machine_has_and_leaves_the_rest_empty() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, "name = \"x\"\n").unwrap();
    let venv = dir.path().join("venv");
    let site = venv.join("lib/python3.11/site-packages/torch-2.11.0.dist-info");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("METADATA"), "Name: torch\nVersion: 2.11.0\n").unwrap();
    let inputs = FingerprintInputs {
        config: ConfigSource::File(cfg),
        data_files: vec![],
        python_env: Some(venv),
        cuda_alloc_conf: Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()),
    };
    let gpus = GpuSampler::new();
    let f = collect(&inputs, &gpus, 5).unwrap();
    assert_eq!(
        f.python_packages.get("torch").map(String::as_str),
        Some("2.11.0")
    );
    assert_eq!(f.config_hash.as_ref().map(String::len), Some(64));
    assert_eq!(f.tch_version.as_deref(), Some("0.24.0"));
    assert!(f.libtorch_version.is_some());
    assert_eq!(
        f.cuda_alloc_conf.as_deref(),
        Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    );
    if !gpus.is_available() {
        assert!(
            f.gpu_models.is_empty() && f.cuda_driver.is_none(),
            "no invented GPU facts: {f:?}"
        );
    }
}
