//! Compile and kernel cache inventory: present, size, entries, last change, warm or cold,
//! and what changed since the previous scan (including while the daemon was down, through
//! the last inventory saved in the run dir). A cache counts as warm when it holds at least
//! one entry (for the warmup record: one warmed device).
//!
//! Defaults follow each tool's own rules: TorchInductor `$TORCHINDUCTOR_CACHE_DIR` or
//! `<tmp>/torchinductor_<user>`; Triton `$TRITON_CACHE_DIR` or `~/.triton/cache`; CUDA
//! `$CUDA_CACHE_PATH` or `~/.nv/ComputeCache`; and the daemon's own warmup record.
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use dflash_shared::health::{CacheChange, CacheWatcher, Transition};
use dflash_shared::metrics::{CacheState, TimestampMs};

use dflash_shared::run_dir::{CACHE_INVENTORY_FILE_NAME, WARMUP_FILE_NAME};
pub const WARMUP_CACHE_NAME: &str = "dflash_warmup";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpec {
    pub name: String,
    pub path: PathBuf,
}

/// Environment inputs of the default cache locations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheEnv {
    pub torchinductor_cache_dir: Option<PathBuf>,
    pub triton_cache_dir: Option<PathBuf>,
    pub cuda_cache_path: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub user: Option<String>,
    pub tmp_dir: PathBuf,
}

impl CacheEnv {
    pub fn from_environment() -> Self {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        CacheEnv {
            torchinductor_cache_dir: var("TORCHINDUCTOR_CACHE_DIR"),
            triton_cache_dir: var("TRITON_CACHE_DIR"),
            cuda_cache_path: var("CUDA_CACHE_PATH"),
            home: var("HOME"),
            user: user_name(),
            tmp_dir: std::env::temp_dir(),
        }
    }
}

/// The user name as Python's `getpass.getuser()` finds it, which TorchInductor uses.
fn user_name() -> Option<String> {
    for k in ["LOGNAME", "USER", "LNAME", "USERNAME"] {
        if let Ok(v) = std::env::var(k) {
            if !v.is_empty() {
                return Some(v);
            }
        }
    }
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the buffer sizes given; getpwuid_r is thread-safe.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::geteuid(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success pw_name points to a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// The default caches to watch for a run in `run_dir`.
pub fn default_cache_specs(env: &CacheEnv, run_dir: &Path) -> Vec<CacheSpec> {
    let home = |rel: &str| env.home.as_ref().map(|h| h.join(rel));
    let mut specs = Vec::new();
    let inductor = env.torchinductor_cache_dir.clone().or_else(|| {
        env.user
            .as_ref()
            .map(|u| env.tmp_dir.join(format!("torchinductor_{u}")))
    });
    if let Some(path) = inductor {
        specs.push(CacheSpec {
            name: "torchinductor".into(),
            path,
        });
    }
    if let Some(path) = env
        .triton_cache_dir
        .clone()
        .or_else(|| home(".triton/cache"))
    {
        specs.push(CacheSpec {
            name: "triton".into(),
            path,
        });
    }
    if let Some(path) = env
        .cuda_cache_path
        .clone()
        .or_else(|| home(".nv/ComputeCache"))
    {
        specs.push(CacheSpec {
            name: "cuda_compute_cache".into(),
            path,
        });
    }
    specs.push(CacheSpec {
        name: WARMUP_CACHE_NAME.into(),
        path: run_dir.join(WARMUP_FILE_NAME),
    });
    specs
}

/// Walks `spec.path` without following symlinks. A file (the warmup record) counts as
/// one entry per warmed device, read by [`super::warmup`].
pub fn scan(spec: &CacheSpec) -> CacheState {
    let mut state = CacheState {
        name: spec.name.clone(),
        path: spec.path.display().to_string(),
        present: false,
        size_bytes: 0,
        entries: 0,
        last_change_ms: None,
        warm: false,
    };
    let Ok(meta) = std::fs::symlink_metadata(&spec.path) else {
        return state;
    };
    state.present = true;
    let mut newest = mtime_ms(&meta);
    if meta.is_file() {
        state.size_bytes = meta.len();
        state.entries = super::warmup::WarmupRecord::load_file(&spec.path)
            .map_or(0, |r| r.devices.len() as u64);
    } else if meta.is_dir() {
        let mut stack = vec![spec.path.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in read.flatten() {
                let Ok(m) = entry.metadata() else { continue };
                newest = newest.max(mtime_ms(&m));
                if m.is_dir() {
                    stack.push(entry.path());
                } else if m.is_file() {
                    state.entries += 1;
                    state.size_bytes += m.len();
                }
            }
        }
    }
    state.last_change_ms = newest;
    state.warm = state.entries > 0;
    state
}

fn mtime_ms(m: &std::fs::Metadata) -> Option<TimestampMs> {
    let d = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// One scan of every configured cache, judged against the previous scans.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheScan {
    pub states: Vec<CacheState>,
    /// For the journal (`CacheChange::to_event_kind`).
    pub changes: Vec<CacheChange>,
    /// For alerts: a warm cache gone missing or cold is Warn until it is warm again.
    pub transitions: Vec<Transition>,
}

/// Scans every configured cache; change detection is the shared [`CacheWatcher`].
#[derive(Debug)]
pub struct CacheMonitor {
    specs: Vec<CacheSpec>,
    watcher: CacheWatcher,
}

impl CacheMonitor {
    /// `previous` is the inventory saved by the last daemon on this run dir, if any, so a
    /// cache deleted while the daemon was down is reported on the first scan.
    pub fn new(specs: Vec<CacheSpec>, previous: &[CacheState], previous_ms: TimestampMs) -> Self {
        let mut watcher = CacheWatcher::new();
        if !previous.is_empty() {
            watcher.observe(previous_ms, previous);
        }
        CacheMonitor { specs, watcher }
    }

    pub fn specs(&self) -> &[CacheSpec] {
        &self.specs
    }

    pub fn scan_all(&mut self, now_ms: TimestampMs) -> CacheScan {
        let states: Vec<CacheState> = self.specs.iter().map(scan).collect();
        let (changes, transitions) = self.watcher.observe(now_ms, &states);
        CacheScan {
            states,
            changes,
            transitions,
        }
    }
}

/// The inventory saved by the previous daemon and when it was written.
pub fn load_inventory(run_dir: &Path) -> (Vec<CacheState>, TimestampMs) {
    let path = run_dir.join(CACHE_INVENTORY_FILE_NAME);
    let saved_ms = std::fs::metadata(&path)
        .ok()
        .and_then(|m| mtime_ms(&m))
        .unwrap_or(0);
    let states = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    (states, saved_ms)
}

pub fn save_inventory(run_dir: &Path, states: &[CacheState]) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(states).map_err(std::io::Error::other)?;
    dflash_engine::files::atomic_write::write_atomic(
        &run_dir.join(CACHE_INVENTORY_FILE_NAME),
        &bytes,
    )
}

#[cfg(test)]
#[path = "caches_tests.rs"]
mod tests;
