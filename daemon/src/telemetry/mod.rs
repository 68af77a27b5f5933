//! What the daemon measures besides training metrics: GPUs (NVML + libtorch allocator),
//! the host (sysinfo), compile caches, and the environment fingerprint.
//!
//! Samplers return what they could read and say why for what they could not; no number is
//! ever filled in by guess.
pub mod allocator;
pub mod caches;
pub mod fingerprint;
mod git;
pub mod gpu;
pub mod host;
pub mod python_env;
pub mod warmup;

pub use gpu::GpuSampler;
pub use host::HostSampler;

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temp file in the same directory and a rename, so a
/// crash leaves either the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile_in(dir, path)?;
    tmp.1.write_all(bytes)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn tempfile_in(dir: &Path, target: &Path) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    Ok((tmp, f))
}
pub mod sampler;
