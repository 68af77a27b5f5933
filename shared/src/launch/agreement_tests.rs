use super::*;
use crate::config::{Config, Objective};
use crate::launch::{job_config, job_config_text};

/// Node `rank` of `nnodes` on the embedded default; its digest stands in for the SHA-256 the
/// daemon computes (any function of the text serves these comparisons).
fn facts(rank: u32, nnodes: u32, config: &Config) -> StartFacts {
    let text = job_config_text(config);
    StartFacts {
        node_rank: rank,
        nnodes,
        config: job_config(config),
        config_digest: format!("{:064x}", text.len() as u128 * 0x9e37_79b9_7f4a_7c15),
        fingerprint: Fingerprint {
            hostname: Some(format!("node{rank:02}")),
            libtorch_version: Some("2.11.0".into()),
            data_hash: Some("ab".repeat(32)),
            dflashd_version: Some("0.1.0".into()),
            python_executable: Some(format!("/home/u{rank}/.venv/bin/python")),
            ..Default::default()
        },
        drafter_workers: 1,
        resume_step: 0,
    }
}

fn job(nnodes: u32) -> Vec<StartFacts> {
    let config = Config::embedded_default();
    (0..nnodes).map(|r| facts(r, nnodes, &config)).collect()
}

fn refusal(facts: &[StartFacts]) -> String {
    check_agreement(facts).unwrap_err().to_string()
}

#[test]
fn nodes_that_differ_only_in_their_own_settings_agree_in_any_arrival_order() {
    let mut nodes = job(3);
    nodes.reverse();
    nodes[0].fingerprint.cuda_alloc_conf = Some("expandable_segments:True".into());
    nodes[1].fingerprint.config_hash = Some("other file".into());
    assert_eq!(check_agreement(&nodes), Ok(()));
    assert_eq!(
        check_agreement(&job(1)),
        Ok(()),
        "one node agrees with itself"
    );
}

#[test]
fn a_locked_key_is_named_with_both_values() {
    let mut nodes = job(2);
    let mut dpace = Config::embedded_default();
    dpace.training.objective = Objective::Dpace;
    nodes[1] = facts(1, 2, &dpace);
    assert_eq!(
        refusal(&nodes),
        "node 1's training.objective = \"dpace\" differs from node 0's \"dflash\" (a locked \
         key): give every node the same config"
    );
    // A locked key unset on one side reads as unset (the embedded default leaves Domino's
    // label shift unset).
    let mut shifted = Config::embedded_default();
    shifted.drafter.shift_label = Some(true);
    nodes[1] = facts(1, 2, &shifted);
    assert!(
        refusal(&nodes)
            .contains("node 1's drafter.shift_label = true differs from node 0's (unset)"),
        "{}",
        refusal(&nodes)
    );
}

#[test]
fn an_unlocked_job_key_and_the_digest_are_compared_too() {
    let mut nodes = job(2);
    let mut sooner = Config::embedded_default();
    sooner.training.eval_every += 1;
    nodes[1] = facts(1, 2, &sooner);
    let err = refusal(&nodes);
    assert!(
        err.starts_with("node 1's training.eval_every = ") && !err.contains("locked"),
        "{err}"
    );
    let mut nodes = job(2);
    nodes[1].config_digest = "f".repeat(64);
    let err = refusal(&nodes);
    assert!(
        err.contains("node 1's config digest ffffffffffff differs from node 0's"),
        "{err}"
    );
}

#[test]
fn the_environment_fingerprint_must_agree_except_each_nodes_own_fields() {
    for (edit, says) in [
        (
            (|f: &mut Fingerprint| f.libtorch_version = Some("2.9.1".into()))
                as fn(&mut Fingerprint),
            "node 1's libtorch = 2.9.1 differs from node 0's 2.11.0 (the environment fingerprint)",
        ),
        (
            |f: &mut Fingerprint| f.data_hash = Some("cd".repeat(32)),
            "node 1's data_hash = cdcd",
        ),
        (
            |f: &mut Fingerprint| f.dflashd_version = None,
            "node 1's dflashd = (absent) differs from node 0's 0.1.0",
        ),
        (
            |f: &mut Fingerprint| {
                f.python_packages.insert("torch".into(), "2.11.0".into());
            },
            "node 1's python.torch = 2.11.0 differs from node 0's (absent)",
        ),
    ] {
        let mut nodes = job(2);
        edit(&mut nodes[1].fingerprint);
        let err = refusal(&nodes);
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn drafter_workers_and_the_resume_step_must_agree() {
    let mut nodes = job(2);
    nodes[1].drafter_workers = 2;
    assert!(refusal(&nodes).contains("node 1 runs 2 drafter workers, node 0 runs 1"));
    let mut nodes = job(3);
    nodes[0].resume_step = 60;
    nodes[1].resume_step = 60;
    nodes[2].resume_step = 40;
    let err = refusal(&nodes);
    assert!(
        err.contains("node 2 resumes from step 40, node 0 from step 60")
            && err.contains("--resume-from"),
        "{err}"
    );
}

#[test]
fn the_first_disagreeing_node_and_its_first_fact_are_named() {
    let mut nodes = job(4);
    let mut dpace = Config::embedded_default();
    dpace.training.objective = Objective::Dpace;
    nodes[3] = facts(3, 4, &dpace);
    nodes[2].resume_step = 7;
    nodes[2].drafter_workers = 3;
    let err = refusal(&nodes);
    assert!(err.starts_with("node 2 runs 3 drafter workers"), "{err}");
    nodes[2] = facts(2, 4, &dpace);
    nodes[2].resume_step = 7;
    let err = refusal(&nodes);
    assert!(
        err.starts_with("node 2's training.objective"),
        "locked keys first: {err}"
    );
}

#[test]
fn ranks_that_do_not_tile_the_job_are_refused() {
    assert!(refusal(&[]).contains("no node's facts arrived"));
    let mut nodes = job(3);
    nodes[2].node_rank = 1;
    assert!(refusal(&nodes).contains("two nodes say they are node 1"));
    let mut nodes = job(3);
    nodes.remove(1);
    assert!(refusal(&nodes).contains("node 1 of 3 is missing"));
    let mut nodes = job(2);
    nodes[1].node_rank = 5;
    assert!(refusal(&nodes).contains("node 5 is not a node of 2"));
    let mut nodes = job(2);
    nodes[1].nnodes = 3;
    assert_eq!(
        refusal(&nodes),
        "node 1 was launched as one of 3 nodes, node 0 as one of 2: give every node the same \
         node count"
    );
}

#[test]
fn facts_and_refusals_travel_as_bytes() {
    let nodes = job(2);
    let bytes = serde_json::to_vec(&nodes[1]).unwrap();
    assert_eq!(
        serde_json::from_slice::<StartFacts>(&bytes).unwrap(),
        nodes[1]
    );
    let d = Disagreement::ResumeStep {
        node: 1,
        step: 4,
        reference: 8,
    };
    let bytes = serde_json::to_vec(&d).unwrap();
    assert_eq!(serde_json::from_slice::<Disagreement>(&bytes).unwrap(), d);
}

fn weights(node_rank: u32, files: &[(&str, &str)]) -> InitFromFacts {
    InitFromFacts {
        node_rank,
        files: files
            .iter()
            .map(|(name, sha)| WeightFileFact {
                name: name.to_string(),
                bytes: 1 << 20,
                sha256: sha.repeat(32),
            })
            .collect(),
    }
}

#[test]
fn init_from_weights_agree_when_every_file_matches_and_a_difference_names_node_file_and_fix() {
    let shards = [("model-1.safetensors", "ab"), ("model-2.safetensors", "cd")];
    let same: Vec<InitFromFacts> = (0..3).rev().map(|n| weights(n, &shards)).collect();
    assert_eq!(check_init_from(&same), Ok(()));
    assert_eq!(check_init_from(&[]), Ok(()));

    let mut other = same.clone();
    other[1] = weights(
        1,
        &[("model-1.safetensors", "ab"), ("model-2.safetensors", "ef")],
    );
    let e = check_init_from(&other).unwrap_err();
    assert_eq!(
        e,
        Disagreement::InitFromWeights {
            node: 1,
            file: "model-2.safetensors".into(),
            digest: Some("ef".repeat(32)),
            reference: Some("cd".repeat(32)),
        }
    );
    assert_eq!(
        e.to_string(),
        "node 1's drafter.init_from holds other weights than node 0's: model-2.safetensors has \
         SHA-256 efefefefefef on node 1, SHA-256 cdcdcdcdcdcd on node 0; the nodes would start \
         from different drafters: copy node 0's drafter directory to every node at the path \
         drafter.init_from names, or point drafter.init_from at one copy every node reads"
    );
    // A shard missing on a node, or one more than node 0 has, is a difference too.
    let missing = [weights(0, &shards), weights(1, &shards[..1])];
    assert!(check_init_from(&missing).unwrap_err().to_string().contains(
        "model-2.safetensors has no such file on node 1, SHA-256 cdcdcdcdcdcd on node 0"
    ));
    let extra = [weights(0, &shards[..1]), weights(1, &shards)];
    assert!(check_init_from(&extra).unwrap_err().to_string().contains(
        "model-2.safetensors has SHA-256 cdcdcdcdcdcd on node 1, no such file on node 0"
    ));
    // What crosses the store is small, and reads back as it was written.
    let bytes = serde_json::to_vec(&same[0]).unwrap();
    assert!(bytes.len() < 400, "{} bytes", bytes.len());
    assert_eq!(
        serde_json::from_slice::<InitFromFacts>(&bytes).unwrap(),
        same[0]
    );
}
