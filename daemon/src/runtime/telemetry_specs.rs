//! The cache directories to watch, from `[telemetry].caches` path templates.
use std::path::{Path, PathBuf};

use dflash_shared::config::{expand_path, Config, PathContext};

use crate::telemetry::caches::{CacheEnv, CacheSpec};

/// Expands every configured cache path. A template that cannot be expanded (an unset
/// variable without a default) is skipped with a warning naming it, never guessed.
pub fn cache_specs(cfg: &Config, run_dir: &Path) -> Vec<CacheSpec> {
    let cache_env = CacheEnv::from_environment();
    let home = cache_env.home.as_ref().map(|h| h.display().to_string());
    let run_dir_text = run_dir.display().to_string();
    // `USER` is often unset in containers and services; TorchInductor then asks the passwd
    // database, and so do we.
    let env = |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| (k == "USER").then(|| cache_env.user.clone()).flatten())
    };
    let ctx = PathContext {
        home: home.as_deref(),
        run_dir: Some(&run_dir_text),
        env: &env,
    };
    cfg.telemetry
        .caches
        .iter()
        .filter_map(|c| match expand_path(&c.path, &ctx) {
            Ok(path) => Some(CacheSpec {
                name: c.name.clone(),
                path: PathBuf::from(path),
            }),
            Err(e) => {
                tracing::warn!(cache = %c.name, template = %c.path, "cache not watched: {e}");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_caches_expand_including_the_warmup_record() {
        let specs = cache_specs(&Config::embedded_default(), Path::new("/runs/a"));
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"dflash_warmup"), "{names:?}");
        let warmup = specs.iter().find(|s| s.name == "dflash_warmup").unwrap();
        assert_eq!(warmup.path, PathBuf::from("/runs/a/warmup.json"));
    }
}
