use super::*;
use crate::launch::EnvMap;

fn env(pairs: &[(&str, &str)]) -> EnvMap {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn flags(nnodes: Option<u32>, node_rank: Option<u32>, rendezvous: Option<&str>) -> LaunchFlags {
    LaunchFlags {
        nnodes,
        node_rank,
        rendezvous: rendezvous.map(String::from),
    }
}

fn refusal(flags: &LaunchFlags, env: &EnvMap) -> String {
    resolve(flags, env).unwrap_err().to_string()
}

#[test]
fn nothing_set_is_one_node_as_today() {
    let none = LaunchFlags::default();
    assert_eq!(
        resolve(&none, &EnvMap::new()).unwrap(),
        NodeLaunch::single()
    );
    // Unrelated and empty variables change nothing; a one-node SLURM job is one node.
    let quiet = env(&[("NNODES", ""), ("SLURM_NNODES", "1"), ("SLURM_NODEID", "0")]);
    let one = resolve(&none, &quiet).unwrap();
    assert_eq!((one.nnodes, one.node_rank, one.rendezvous), (1, 0, None));
    // A stray MASTER_ADDR without a port never fails a single node.
    let stray = env(&[("MASTER_ADDR", "somewhere")]);
    assert_eq!(resolve(&none, &stray).unwrap(), NodeLaunch::single());
    assert!(!NodeLaunch::single().is_multi_node());
}

#[test]
fn the_flags_alone_launch_a_node() {
    let f = flags(Some(2), Some(1), Some("node01:29500"));
    let launch = resolve(&f, &EnvMap::new()).unwrap();
    assert_eq!((launch.nnodes, launch.node_rank), (2, 1));
    assert_eq!(launch.rendezvous.unwrap().to_string(), "node01:29500");
    assert_eq!(
        launch.source.to_string(),
        "--nnodes 2 and --node-rank 1, rendezvous from --rendezvous node01:29500"
    );
}

#[test]
fn torchrun_with_one_process_per_node_counts_nodes() {
    let e = env(&[
        ("LOCAL_WORLD_SIZE", "1"),
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]);
    let launch = resolve(&LaunchFlags::default(), &e).unwrap();
    assert_eq!((launch.nnodes, launch.node_rank), (2, 1));
    assert_eq!(
        launch.rendezvous,
        Some(Rendezvous {
            host: "10.0.0.1".into(),
            port: 29500
        })
    );
    assert_eq!(launch.source.nnodes, Origin::Env("WORLD_SIZE=2".into()));
    assert!(launch
        .to_string()
        .contains("node 1 of 2, rendezvous 10.0.0.1:29500"));
}

#[test]
fn torchrun_with_several_processes_per_node_is_refused() {
    let e = env(&[
        ("LOCAL_WORLD_SIZE", "8"),
        ("WORLD_SIZE", "16"),
        ("RANK", "9"),
    ]);
    let err = refusal(&LaunchFlags::default(), &e);
    assert!(
        err.contains("LOCAL_WORLD_SIZE=8") && err.contains("--nproc-per-node 1"),
        "{err}"
    );
}

#[test]
fn a_world_size_that_may_count_processes_is_refused_unless_nodes_are_stated() {
    let e = env(&[("WORLD_SIZE", "16"), ("RANK", "3")]);
    let err = refusal(&LaunchFlags::default(), &e);
    assert!(
        err.contains("WORLD_SIZE=16") && err.contains("NNODES and NODE_RANK"),
        "{err}"
    );
    let mut stated = e.clone();
    stated.insert("NNODES".into(), "2".into());
    stated.insert("NODE_RANK".into(), "0".into());
    stated.insert("MASTER_ADDR".into(), "n0".into());
    stated.insert("MASTER_PORT".into(), "29500".into());
    let launch = resolve(&LaunchFlags::default(), &stated).unwrap();
    assert_eq!(
        (launch.nnodes, launch.node_rank),
        (2, 0),
        "RANK=3 is a process rank"
    );
    assert_eq!(
        resolve(&LaunchFlags::default(), &env(&[("WORLD_SIZE", "1")])).unwrap(),
        NodeLaunch::single()
    );
}

#[test]
fn slurm_names_the_node_and_derives_the_rendezvous() {
    let e = env(&[
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ("SLURM_JOB_ID", "123456"),
    ]);
    let launch = resolve(&LaunchFlags::default(), &e).unwrap();
    assert_eq!((launch.nnodes, launch.node_rank), (2, 1));
    assert_eq!(
        launch.rendezvous.clone().unwrap().to_string(),
        "gpu07:18456"
    );
    assert_eq!(
        launch.source.to_string(),
        "SLURM_NNODES=2 and SLURM_NODEID=1, rendezvous from the first host of \
         SLURM_JOB_NODELIST=gpu[07-08] and port 18456 from SLURM_JOB_ID=123456"
    );
    // A stated address replaces the derived one without a conflict (node 0's IB name).
    let mut ib = e.clone();
    ib.insert("MASTER_ADDR".into(), "gpu07-ib".into());
    ib.insert("MASTER_PORT".into(), "29400".into());
    let r = resolve(&LaunchFlags::default(), &ib)
        .unwrap()
        .rendezvous
        .unwrap();
    assert_eq!(r.to_string(), "gpu07-ib:29400");
    // An array job's id keeps its leading number.
    let mut array = e.clone();
    array.insert("SLURM_JOB_ID".into(), "98765_3".into());
    let r = resolve(&LaunchFlags::default(), &array)
        .unwrap()
        .rendezvous
        .unwrap();
    assert_eq!(r.port, 15_000 + 8765);
}

#[test]
fn slurm_with_several_tasks_per_node_is_refused() {
    let e = env(&[
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NTASKS", "16"),
    ]);
    let err = refusal(&LaunchFlags::default(), &e);
    assert!(
        err.contains("SLURM_NTASKS=16") && err.contains("--ntasks-per-node=1"),
        "{err}"
    );
}

#[test]
fn disagreeing_sources_are_refused_naming_both() {
    let slurm = env(&[
        ("SLURM_NNODES", "4"),
        ("SLURM_NODEID", "1"),
        ("MASTER_ADDR", "n0"),
        ("MASTER_PORT", "29500"),
    ]);
    for (f, what, first, second) in [
        (
            flags(Some(2), None, None),
            "the node count",
            "--nnodes 2",
            "SLURM_NNODES=4",
        ),
        (
            flags(None, Some(0), None),
            "the node rank",
            "--node-rank 0",
            "SLURM_NODEID=1",
        ),
        (
            flags(None, None, Some("n9:29500")),
            "the rendezvous host",
            "--rendezvous n9:29500",
            "MASTER_ADDR=n0",
        ),
        (
            flags(None, None, Some("n0:1234")),
            "the rendezvous port",
            "--rendezvous n0:1234",
            "MASTER_PORT=29500",
        ),
    ] {
        let err = refusal(&f, &slurm);
        assert!(
            err.contains(what) && err.contains(&format!("{first} but {second}")),
            "{err}"
        );
        assert!(
            err.contains("drop the flag, or unset the variable"),
            "{err}"
        );
    }
    let both = env(&[("NNODES", "2"), ("SLURM_NNODES", "3")]);
    let err = refusal(&LaunchFlags::default(), &both);
    assert!(err.contains("NNODES=2 but SLURM_NNODES=3"), "{err}");
    // Agreeing statements are fine, and the highest names the origin.
    let agreeing = env(&[
        ("NNODES", "2"),
        ("NODE_RANK", "1"),
        ("MASTER_ADDR", "n0"),
        ("MASTER_PORT", "29500"),
    ]);
    let launch = resolve(&flags(Some(2), Some(1), Some("n0:29500")), &agreeing).unwrap();
    assert_eq!(launch.source.nnodes, Origin::Flag("--nnodes 2".into()));
}

#[test]
fn out_of_range_and_malformed_values_are_refused() {
    let none = EnvMap::new();
    let cases: Vec<(LaunchFlags, EnvMap, &str)> =
        vec![
        (flags(Some(0), None, None), none.clone(), "--nnodes 0: expected at least 1"),
        (
            LaunchFlags::default(),
            env(&[("NNODES", "two")]),
            "NNODES=two: expected a whole number",
        ),
        (
            LaunchFlags::default(),
            env(&[("SLURM_NNODES", "0")]),
            "SLURM_NNODES=0: expected a whole number, at least 1",
        ),
        (
            flags(Some(2), Some(2), Some("n:1")),
            none.clone(),
            "--node-rank 2 is not a node of --nnodes 2: node ranks run from 0 to 1",
        ),
        (
            flags(None, Some(1), None),
            none.clone(),
            "--node-rank 1 is not a node of the default (one node, rank 0)",
        ),
        (
            flags(Some(2), None, Some("n:1")),
            none.clone(),
            "--nnodes 2 names 2 nodes but nothing says which one this is",
        ),
        (
            flags(Some(2), Some(0), None),
            none.clone(),
            "node 0 of 2 needs a rendezvous",
        ),
        (
            flags(Some(2), Some(0), None),
            env(&[("MASTER_ADDR", "n0")]),
            "MASTER_ADDR=n0 gives the rendezvous host but nothing gives its port: set MASTER_PORT",
        ),
        (
            flags(Some(2), Some(0), None),
            env(&[("MASTER_PORT", "29500")]),
            "gives the rendezvous port but nothing gives its host: set MASTER_ADDR",
        ),
        (
            flags(Some(2), Some(0), None),
            env(&[("MASTER_ADDR", "n0"), ("MASTER_PORT", "0")]),
            "MASTER_PORT=0: port 0",
        ),
        (
            flags(None, None, Some("nohost")),
            none.clone(),
            "--rendezvous nohost: \"nohost\" has no :PORT",
        ),
        (
            LaunchFlags::default(),
            env(&[
                ("SLURM_NNODES", "2"),
                ("SLURM_NODEID", "0"),
                ("SLURM_JOB_NODELIST", "n[1-"),
                ("SLURM_JOB_ID", "7"),
            ]),
            "SLURM_JOB_NODELIST=n[1-: cannot read the SLURM hostlist",
        ),
    ];
    for (f, e, says) in cases {
        let err = refusal(&f, &e);
        assert!(err.contains(says), "expected {says:?} in: {err}");
    }
}

#[test]
fn the_resolved_launch_travels_as_json() {
    let launch = resolve(
        &flags(Some(3), Some(2), Some("[fd00::1]:29500")),
        &EnvMap::new(),
    )
    .unwrap();
    let json = serde_json::to_string(&launch).unwrap();
    assert_eq!(serde_json::from_str::<NodeLaunch>(&json).unwrap(), launch);
    assert!(json.contains("\"kind\":\"flag\""), "{json}");
}
