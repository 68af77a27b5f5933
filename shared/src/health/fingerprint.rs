//! The environment fingerprint taken at start and compared on resume.
//!
//! Every field is optional on the wire (`#[serde(default)]`) so a fingerprint written by an
//! older dflashd still loads; a field one side lacks shows up as a drift from/to "(absent)".
//!
//! Not every difference is a drift. What the run computes with (libtorch and the Python
//! packages, CUDA, the driver, the GPUs, `tch`, the interpreter, the host, the training data)
//! blocks resume until an operator confirms it. What only names the build or the config
//! revision (the code commit, the dflashd version, the config's commit and text) is
//! informational: it is journaled with before → after and shown, but a rebuild at a new commit
//! resumes on its own. Locked config keys are guarded separately, key by key.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::events::wording::drift_sentence;
use crate::events::EventKind;
use crate::metrics::TimestampMs;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fingerprint {
    pub captured_ms: TimestampMs,
    pub hostname: Option<String>,
    pub dflashd_version: Option<String>,
    /// Git commit of the dflashd build.
    pub code_git_commit: Option<String>,
    /// Git commit of the repository the config file lives in, when it is in one.
    pub config_git_commit: Option<String>,
    pub config_hash: Option<String>,
    pub data_hash: Option<String>,
    /// Version libtorch reports (e.g. "2.11.0").
    pub libtorch_version: Option<String>,
    pub tch_version: Option<String>,
    pub cuda_runtime: Option<String>,
    pub cuda_driver: Option<String>,
    /// One entry per visible GPU, in index order (e.g. "NVIDIA H200").
    pub gpu_models: Vec<String>,
    pub python_executable: Option<String>,
    /// The CUDA caching allocator's configuration in effect (`PYTORCH_CUDA_ALLOC_CONF=…`,
    /// which `dflashd start` sets to `expandable_segments:True` when the user has not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_alloc_conf: Option<String>,
    /// Distribution name → version of the Python environment in use (torch, triton, …).
    pub python_packages: BTreeMap<String, String>,
}

/// Whether a differing fingerprint field holds the resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftImpact {
    /// The numbers the run produces may change: resume waits for an operator's confirmation.
    Blocking,
    /// Only the identity of the build or of the config revision changed: journaled and shown.
    Informational,
}

/// The policy, by field name (as [`diff_fingerprints`] writes it).
///
/// The config's git commit is the HEAD of whatever repository the config file lives in, often
/// the code's own, so it moves with every rebuild exactly like the code commit; the config's
/// text may change freely outside the locked keys, which are checked key by key on resume.
/// Unknown fields block: a new fact is treated as load-bearing until classified.
pub fn drift_impact(field: &str) -> DriftImpact {
    match field {
        // The allocator's configuration changes how memory is laid out, not what is computed.
        "code_git_commit" | "dflashd" | "config_git_commit" | "config_hash" | "cuda_alloc_conf" => {
            DriftImpact::Informational
        }
        _ => DriftImpact::Blocking,
    }
}

/// One field that differs between two fingerprints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentDrift {
    /// `libtorch`, `cuda_driver`, `gpu_models`, `python.torch`, …
    pub field: String,
    pub before: Option<String>,
    pub after: Option<String>,
    /// Whether resuming across this drift needs an operator's confirmation
    /// (`drift_impact(field) == Blocking`).
    pub blocks_resume: bool,
}

const ABSENT: &str = "(absent)";

impl EnvironmentDrift {
    fn new(field: String, before: Option<String>, after: Option<String>) -> Self {
        let blocks_resume = drift_impact(&field) == DriftImpact::Blocking;
        Self {
            field,
            before,
            after,
            blocks_resume,
        }
    }

    pub fn impact(&self) -> DriftImpact {
        if self.blocks_resume {
            DriftImpact::Blocking
        } else {
            DriftImpact::Informational
        }
    }

    /// The journal event: `EnvironmentDrift` for a blocking difference, `EnvironmentChanged`
    /// for an informational one (so consoles do not tell the operator to "restore" a commit).
    pub fn to_event_kind(&self) -> EventKind {
        let field = self.field.clone();
        let before = self.before.clone().unwrap_or_else(|| ABSENT.into());
        let after = self.after.clone().unwrap_or_else(|| ABSENT.into());
        match self.impact() {
            DriftImpact::Blocking => EventKind::EnvironmentDrift {
                field,
                before,
                after,
            },
            DriftImpact::Informational => EventKind::EnvironmentChanged {
                field,
                before,
                after,
            },
        }
    }

    /// "torch 2.11.0+cu128 → 2.9.1+cu130".
    pub fn sentence(&self) -> String {
        drift_sentence(
            &self.field,
            self.before.as_deref().unwrap_or(ABSENT),
            self.after.as_deref().unwrap_or(ABSENT),
        )
    }
}

impl Fingerprint {
    /// One line for the journal's `Fingerprint` event.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = &self.libtorch_version {
            parts.push(format!("libtorch {v}"));
        }
        if let Some(v) = self.python_packages.get("torch") {
            parts.push(format!("torch {v}"));
        }
        match (&self.cuda_runtime, &self.cuda_driver) {
            (Some(r), Some(d)) => parts.push(format!("CUDA {r} (driver {d})")),
            (Some(r), None) => parts.push(format!("CUDA {r}")),
            (None, Some(d)) => parts.push(format!("CUDA driver {d}")),
            (None, None) => parts.push("no CUDA".into()),
        }
        parts.push(summarize_gpus(&self.gpu_models));
        if let Some(v) = &self.tch_version {
            parts.push(format!("tch {v}"));
        }
        if let Some(c) = &self.code_git_commit {
            parts.push(format!("commit {}", c.chars().take(12).collect::<String>()));
        }
        parts.join(", ")
    }
}

/// "8× NVIDIA H200", "NVIDIA H200, NVIDIA A100", "no GPUs".
pub fn summarize_gpus(models: &[String]) -> String {
    match models {
        [] => "no GPUs".into(),
        [first, rest @ ..] if rest.iter().all(|m| m == first) => {
            if models.len() == 1 {
                first.clone()
            } else {
                format!("{}× {first}", models.len())
            }
        }
        _ => models.join(", "),
    }
}

/// Every field that differs, in a fixed order: scalar fields first, then Python packages by name.
pub fn diff_fingerprints(before: &Fingerprint, after: &Fingerprint) -> Vec<EnvironmentDrift> {
    let scalar = |b: &Fingerprint| -> Vec<(&'static str, Option<String>)> {
        vec![
            ("hostname", b.hostname.clone()),
            ("dflashd", b.dflashd_version.clone()),
            ("code_git_commit", b.code_git_commit.clone()),
            ("config_git_commit", b.config_git_commit.clone()),
            ("config_hash", b.config_hash.clone()),
            ("data_hash", b.data_hash.clone()),
            ("libtorch", b.libtorch_version.clone()),
            ("tch", b.tch_version.clone()),
            ("cuda_runtime", b.cuda_runtime.clone()),
            ("cuda_driver", b.cuda_driver.clone()),
            ("gpu_models", Some(summarize_gpus(&b.gpu_models))),
            ("python_executable", b.python_executable.clone()),
            ("cuda_alloc_conf", b.cuda_alloc_conf.clone()),
        ]
    };
    let mut drifts: Vec<EnvironmentDrift> = scalar(before)
        .into_iter()
        .zip(scalar(after))
        .filter(|((_, b), (_, a))| b != a)
        .map(|((field, b), (_, a))| EnvironmentDrift::new(field.into(), b, a))
        .collect();
    let names: std::collections::BTreeSet<&String> = before
        .python_packages
        .keys()
        .chain(after.python_packages.keys())
        .collect();
    for name in names {
        let (b, a) = (
            before.python_packages.get(name),
            after.python_packages.get(name),
        );
        if b != a {
            drifts.push(EnvironmentDrift::new(
                format!("python.{name}"),
                b.cloned(),
                a.cloned(),
            ));
        }
    }
    drifts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_fingerprint() -> Fingerprint {
        Fingerprint {
            captured_ms: 1,
            hostname: Some("gpu-node-7".into()),
            dflashd_version: Some("0.1.0".into()),
            code_git_commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
            config_hash: Some("aa".into()),
            libtorch_version: Some("2.11.0".into()),
            tch_version: Some("0.24.0".into()),
            cuda_runtime: Some("12.8".into()),
            cuda_driver: Some("580.65.06".into()),
            gpu_models: vec!["NVIDIA H200".into(); 8],
            python_packages: [
                ("torch", "2.11.0+cu128"),
                ("triton", "3.5.0"),
                ("numpy", "2.3.4"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn identical_fingerprints_do_not_drift() {
        let a = seed_fingerprint();
        let b = Fingerprint {
            captured_ms: 99,
            ..a.clone()
        };
        assert!(diff_fingerprints(&a, &b).is_empty());
    }

    #[test]
    fn a_torch_swap_is_reported_field_by_field() {
        let before = seed_fingerprint();
        let mut after = before.clone();
        after.libtorch_version = Some("2.9.1".into());
        after.cuda_runtime = Some("13.0".into());
        after
            .python_packages
            .insert("torch".into(), "2.9.1+cu130".into());
        after.python_packages.remove("triton");
        after
            .python_packages
            .insert("nvidia-nccl-cu13".into(), "2.28.3".into());
        after.config_hash = Some("bb".into());
        let drifts = diff_fingerprints(&before, &after);
        let lines: Vec<_> = drifts
            .iter()
            .map(|d| (d.sentence(), d.blocks_resume))
            .collect();
        assert_eq!(
            lines,
            [
                ("config aa → bb".to_string(), false),
                ("libtorch 2.11.0 → 2.9.1".into(), true),
                ("CUDA runtime 12.8 → 13.0".into(), true),
                ("nvidia-nccl-cu13 (absent) → 2.28.3".into(), true),
                ("torch 2.11.0+cu128 → 2.9.1+cu130".into(), true),
                ("triton 3.5.0 → (absent)".into(), true),
            ]
        );
        assert_eq!(
            drifts[4].to_event_kind(),
            EventKind::EnvironmentDrift {
                field: "python.torch".into(),
                before: "2.11.0+cu128".into(),
                after: "2.9.1+cu130".into()
            }
        );
    }

    #[test]
    fn gpu_changes_and_summary() {
        let before = seed_fingerprint();
        let mut after = before.clone();
        after.gpu_models.truncate(7);
        let d = diff_fingerprints(&before, &after);
        assert_eq!(d[0].sentence(), "GPUs 8× NVIDIA H200 → 7× NVIDIA H200");
        assert_eq!(
            before.summary(),
            "libtorch 2.11.0, torch 2.11.0+cu128, CUDA 12.8 (driver 580.65.06), 8× NVIDIA H200, \
             tch 0.24.0, commit 0123456789ab"
        );
        let cpu = Fingerprint::default();
        assert_eq!(cpu.summary(), "no CUDA, no GPUs");
    }

    #[test]
    fn a_fingerprint_from_before_the_allocator_config_resumes_without_a_hold() {
        // Runs started before dflashd recorded the allocator config have none; the first
        // start that sets it is a journaled change, not a drift that holds the resume.
        let before = seed_fingerprint();
        let mut after = before.clone();
        after.cuda_alloc_conf = Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into());
        let drifts = diff_fingerprints(&before, &after);
        assert_eq!(drifts.len(), 1, "{drifts:?}");
        assert_eq!(drifts[0].field, "cuda_alloc_conf");
        assert!(!drifts[0].blocks_resume);
        assert_eq!(
            drifts[0].sentence(),
            "CUDA allocator config (absent) → PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        );
    }

    #[test]
    fn build_and_config_identity_is_informational_the_environment_blocks() {
        for field in [
            "code_git_commit",
            "dflashd",
            "config_git_commit",
            "config_hash",
        ] {
            assert_eq!(drift_impact(field), DriftImpact::Informational, "{field}");
        }
        for field in [
            "libtorch",
            "tch",
            "cuda_runtime",
            "cuda_driver",
            "gpu_models",
            "data_hash",
            "hostname",
            "python_executable",
            "python.torch",
            "python.triton",
            "a_field_added_later",
        ] {
            assert_eq!(drift_impact(field), DriftImpact::Blocking, "{field}");
        }

        let before = seed_fingerprint();
        let mut rebuilt = before.clone();
        rebuilt.code_git_commit = Some("fedcba9876543210fedcba9876543210fedcba98".into());
        rebuilt.dflashd_version = Some("0.2.0".into());
        let drifts = diff_fingerprints(&before, &rebuilt);
        assert!(drifts.iter().all(|d| !d.blocks_resume), "{drifts:?}");
        assert_eq!(
            drifts.iter().map(|d| d.sentence()).collect::<Vec<_>>(),
            [
                "dflashd 0.1.0 → 0.2.0",
                "code commit 0123456789ab → fedcba987654"
            ]
        );
        assert_eq!(
            drifts[1].to_event_kind(),
            EventKind::EnvironmentChanged {
                field: "code_git_commit".into(),
                before: "0123456789abcdef0123456789abcdef01234567".into(),
                after: "fedcba9876543210fedcba9876543210fedcba98".into(),
            }
        );
        rebuilt.data_hash = Some("cc".into());
        let data = diff_fingerprints(&before, &rebuilt);
        assert!(data
            .iter()
            .any(|d| d.field == "data_hash" && d.blocks_resume));
    }

    #[test]
    fn an_older_fingerprint_without_new_fields_still_loads() {
        let old: Fingerprint = serde_json::from_str(r#"{"libtorch_version":"2.11.0"}"#).unwrap();
        assert_eq!(old.libtorch_version.as_deref(), Some("2.11.0"));
        assert!(old.python_packages.is_empty());
    }
}
