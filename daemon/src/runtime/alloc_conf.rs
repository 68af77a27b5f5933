//! The CUDA caching allocator's configuration: `dflashd start` sets
//! `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` when the user set neither it nor
//! `PYTORCH_ALLOC_CONF` (torch ≥ 2.9's device-generic name, which libtorch reads first), and
//! journals which it was.
//!
//! Why: with fixed segments the caching allocator carves blocks of each new shape out of
//! segments sized for earlier ones, so a run whose shapes vary fragments and its reserved
//! memory creeps up, the very drift the memory-flatness detector exists to catch. Expandable
//! segments grow one mapping per stream instead (libtorch's own OOM message recommends them).
//!
//! libtorch reads the variable when it first initialises its CUDA allocator, so it is set at
//! the top of `dflashd start`, before any tch call. NOT TESTED ON A GPU: that the allocator
//! then runs with expandable segments can only be seen on CUDA.
use std::ffi::OsString;

pub const CUDA_ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
pub const ALLOC_CONF: &str = "PYTORCH_ALLOC_CONF";
pub const EXPANDABLE_SEGMENTS: &str = "expandable_segments:True";

/// Who decided the allocator's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocConf {
    /// Neither variable was set: dflashd set `PYTORCH_CUDA_ALLOC_CONF` to
    /// [`EXPANDABLE_SEGMENTS`].
    SetByDflashd,
    /// The user's own value, left as it is.
    User { var: &'static str, value: String },
}

impl AllocConf {
    /// Pure: the decision for the two variables' current values (`PYTORCH_ALLOC_CONF`
    /// first, as libtorch reads it first).
    pub fn decide(cuda: Option<OsString>, generic: Option<OsString>) -> Self {
        for (var, value) in [(ALLOC_CONF, generic), (CUDA_ALLOC_CONF, cuda)] {
            if let Some(value) = value {
                return AllocConf::User {
                    var,
                    value: value.to_string_lossy().into_owned(),
                };
            }
        }
        AllocConf::SetByDflashd
    }

    /// The journal's line.
    pub fn journal_line(&self) -> String {
        match self {
            AllocConf::SetByDflashd => format!(
                "{CUDA_ALLOC_CONF} was not set: dflashd set it to {EXPANDABLE_SEGMENTS} (the CUDA \
                 allocator grows segments instead of fragmenting when shapes vary); set it \
                 yourself to choose another value"
            ),
            AllocConf::User { var, value } => {
                let mut line = format!("{var}={value} is the user's; dflashd left it as it is");
                if !value.contains(EXPANDABLE_SEGMENTS) {
                    line.push_str(&format!(
                        " (without {EXPANDABLE_SEGMENTS}, memory may fragment and not stay flat)"
                    ));
                }
                line
            }
        }
    }
}

/// Reads the environment and sets [`CUDA_ALLOC_CONF`] when neither variable is set. Call it
/// while the process has one thread (the environment is process-wide and `setenv` is not
/// thread-safe), before anything initialises libtorch's CUDA allocator.
pub fn apply() -> AllocConf {
    let decision = AllocConf::decide(
        std::env::var_os(CUDA_ALLOC_CONF),
        std::env::var_os(ALLOC_CONF),
    );
    if decision == AllocConf::SetByDflashd {
        std::env::set_var(CUDA_ALLOC_CONF, EXPANDABLE_SEGMENTS);
    }
    decision
}

/// What is in effect now, as the fingerprint records it (`VAR=value`, the generic name
/// first as libtorch reads it), or `None` when neither is set.
pub fn in_effect() -> Option<String> {
    [ALLOC_CONF, CUDA_ALLOC_CONF]
        .iter()
        .find_map(|var| std::env::var_os(var).map(|v| format!("{var}={}", v.to_string_lossy())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_means_dflashd_sets_expandable_segments() {
        let d = AllocConf::decide(None, None);
        assert_eq!(d, AllocConf::SetByDflashd);
        let line = d.journal_line();
        assert!(
            line.contains("PYTORCH_CUDA_ALLOC_CONF") && line.contains("expandable_segments:True"),
            "{line}"
        );
    }

    #[test]
    fn a_user_value_under_either_name_is_kept_and_named() {
        let cuda = AllocConf::decide(Some("max_split_size_mb:128".into()), None);
        assert_eq!(
            cuda,
            AllocConf::User {
                var: CUDA_ALLOC_CONF,
                value: "max_split_size_mb:128".into()
            }
        );
        assert!(
            cuda.journal_line().contains("may fragment"),
            "{}",
            cuda.journal_line()
        );
        // The generic name wins, as it does in libtorch.
        let both = AllocConf::decide(
            Some("max_split_size_mb:128".into()),
            Some("expandable_segments:True".into()),
        );
        assert_eq!(
            both,
            AllocConf::User {
                var: ALLOC_CONF,
                value: "expandable_segments:True".into()
            }
        );
        assert!(!both.journal_line().contains("may fragment"));
    }
}
