//! Checkpoint directories: written atomically, verified by checksum on load.
//!
//! A checkpoint is `<root>/step-<step:010>/` holding its files plus `manifest.json`, which lists
//! every file with its size and SHA-256. Writing goes to `<root>/.tmp-…`; each file is fsynced,
//! the manifest is written last, then the directory is renamed into place and the parent
//! fsynced. A crash at any point leaves either no `step-*` directory or a complete one, and a
//! directory without a manifest, or with a file whose size or hash differs, never loads.
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT: &str = "dflash-checkpoint/1";
const PREFIX: &str = "step-";
const LATEST: &str = "latest";
/// A checkpoint being pruned is renamed to this prefix first, so a kill during its deletion
/// never leaves a half-deleted `step-…` directory.
const PRUNING: &str = ".prune-";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint I/O failed on {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{dir} is not a complete checkpoint: it has no {MANIFEST} (an interrupted write never gets one)")]
    NoManifest { dir: PathBuf },
    #[error("checkpoint manifest {path} is unreadable: {detail}")]
    BadManifest { path: PathBuf, detail: String },
    #[error("checkpoint {dir} is missing {file}, which its manifest lists")]
    MissingFile { dir: PathBuf, file: String },
    #[error(
        "checkpoint file {path} is corrupt: it has {found} bytes, the manifest says {expected}"
    )]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("checkpoint file {path} is corrupt: SHA-256 is {found}, the manifest says {expected}")]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("checkpoint file {path}: {detail}")]
    Content { path: PathBuf, detail: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        cause: source,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub step: u64,
    pub files: BTreeMap<String, FileEntry>,
}

fn hash_file(path: &Path) -> Result<FileEntry, CheckpointError> {
    let digest = crate::files::hash::sha256_file(path).map_err(io_err(path))?;
    Ok(FileEntry {
        bytes: digest.bytes,
        sha256: digest.sha256,
    })
}

fn fsync_path(path: &Path) -> Result<(), CheckpointError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path))
}

pub fn checkpoint_dir_name(step: u64) -> String {
    format!("{PREFIX}{step:010}")
}

/// The step a checkpoint directory holds, read from its name ([`checkpoint_dir_name`]'s
/// inverse); `None` for a directory not named as a checkpoint.
pub fn checkpoint_step(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix(PREFIX)?
        .parse()
        .ok()
}

/// Builds one checkpoint in a temporary directory; [`CheckpointWriter::commit`] publishes it.
pub struct CheckpointWriter {
    root: PathBuf,
    tmp: PathBuf,
    step: u64,
    files: BTreeMap<String, FileEntry>,
    committed: bool,
}

impl CheckpointWriter {
    pub fn begin(root: &Path, step: u64) -> Result<Self, CheckpointError> {
        fs::create_dir_all(root).map_err(io_err(root))?;
        recover(root)?;
        let tmp = root.join(format!(
            ".tmp-{}-{}",
            checkpoint_dir_name(step),
            std::process::id()
        ));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
        }
        fs::create_dir(&tmp).map_err(io_err(&tmp))?;
        Ok(Self {
            root: root.to_path_buf(),
            tmp,
            step,
            files: BTreeMap::new(),
            committed: false,
        })
    }

    fn record(&mut self, name: &str) -> Result<(), CheckpointError> {
        let path = self.tmp.join(name);
        fsync_path(&path)?;
        let entry = hash_file(&path)?;
        self.files.insert(name.to_string(), entry);
        Ok(())
    }

    pub fn write_bytes(&mut self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.tmp.join(name);
        let mut f = File::create(&path).map_err(io_err(&path))?;
        f.write_all(bytes).map_err(io_err(&path))?;
        drop(f);
        self.record(name)
    }

    pub fn write_json<T: Serialize>(
        &mut self,
        name: &str,
        value: &T,
    ) -> Result<(), CheckpointError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| CheckpointError::Content {
            path: self.tmp.join(name),
            detail: e.to_string(),
        })?;
        self.write_bytes(name, &bytes)
    }

    /// Tensors must be contiguous (they are made so here) and on any device.
    pub fn write_tensors(
        &mut self,
        name: &str,
        tensors: &[(String, Tensor)],
    ) -> Result<(), CheckpointError> {
        let path = self.tmp.join(name);
        let cpu: Vec<(String, Tensor)> = tensors
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.detach().to_device(tch::Device::Cpu).contiguous(),
                )
            })
            .collect();
        Tensor::write_safetensors(&cpu, &path).map_err(|e| CheckpointError::Content {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        self.record(name)
    }

    /// Writes the manifest, renames the directory into place, updates `latest`.
    pub fn commit(mut self) -> Result<PathBuf, CheckpointError> {
        let manifest = Manifest {
            format: FORMAT.to_string(),
            step: self.step,
            files: std::mem::take(&mut self.files),
        };
        let manifest_path = self.tmp.join(MANIFEST);
        let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::Content {
            path: manifest_path.clone(),
            detail: e.to_string(),
        })?;
        let mut f = File::create(&manifest_path).map_err(io_err(&manifest_path))?;
        f.write_all(&bytes)
            .and_then(|_| f.sync_all())
            .map_err(io_err(&manifest_path))?;
        fsync_path(&self.tmp)?;
        let dest = self.root.join(checkpoint_dir_name(self.step));
        if dest.exists() {
            // Rewriting a step (e.g. after a resume): move the old one aside first so the
            // published name always points at a complete directory.
            let aside = self.root.join(format!(
                ".old-{}-{}",
                checkpoint_dir_name(self.step),
                std::process::id()
            ));
            fs::rename(&dest, &aside).map_err(io_err(&dest))?;
            fs::rename(&self.tmp, &dest).map_err(io_err(&dest))?;
            fs::remove_dir_all(&aside).map_err(io_err(&aside))?;
        } else {
            fs::rename(&self.tmp, &dest).map_err(io_err(&dest))?;
        }
        self.committed = true;
        fsync_path(&self.root)?;
        point_latest(&self.root, &checkpoint_dir_name(self.step))?;
        Ok(dest)
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// The entries of a checkpoint root; `None` when it does not exist yet (a run before its first
/// checkpoint).
fn entries_if_present(root: &Path) -> Result<Option<fs::ReadDir>, CheckpointError> {
    match fs::read_dir(root) {
        Ok(entries) => Ok(Some(entries)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CheckpointError::Io {
            path: root.to_path_buf(),
            cause: e,
        }),
    }
}

/// Cleans up after a writer that died (one writer per run directory is assumed): partial
/// `.tmp-*` directories and `.prune-*` directories (a prune killed mid-deletion) are
/// deleted; a `.old-<name>-*` directory, left when a crash hit between
/// moving an old checkpoint aside and publishing its replacement, is put back if `<name>` is
/// missing and deleted otherwise.
pub fn recover(root: &Path) -> Result<(), CheckpointError> {
    let Some(entries) = entries_if_present(root)? else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(io_err(root))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let path = entry.path();
        if (name.starts_with(".tmp-") || name.starts_with(PRUNING)) && path.is_dir() {
            fs::remove_dir_all(&path).map_err(io_err(&path))?;
        } else if let Some(rest) = name.strip_prefix(".old-") {
            let Some((original, _pid)) = rest.rsplit_once('-') else {
                continue;
            };
            let published = root.join(original);
            if published.exists() {
                fs::remove_dir_all(&path).map_err(io_err(&path))?;
            } else {
                fs::rename(&path, &published).map_err(io_err(&published))?;
            }
        }
    }
    Ok(())
}

pub(crate) fn point_latest(root: &Path, target: &str) -> Result<(), CheckpointError> {
    let link = root.join(LATEST);
    let tmp = root.join(format!(".{LATEST}-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(io_err(&tmp))?;
    fs::rename(&tmp, &link).map_err(io_err(&link))?;
    fsync_path(root)
}

/// Reads the manifest and checks every listed file's size and SHA-256.
pub fn verify(dir: &Path) -> Result<Manifest, CheckpointError> {
    let manifest_path = dir.join(MANIFEST);
    if !manifest_path.is_file() {
        return Err(CheckpointError::NoManifest {
            dir: dir.to_path_buf(),
        });
    }
    let text = fs::read(&manifest_path).map_err(io_err(&manifest_path))?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| CheckpointError::BadManifest {
            path: manifest_path.clone(),
            detail: e.to_string(),
        })?;
    if manifest.format != FORMAT {
        return Err(CheckpointError::BadManifest {
            path: manifest_path,
            detail: format!(
                "format is {:?}, this build reads {FORMAT:?}",
                manifest.format
            ),
        });
    }
    for (name, expected) in &manifest.files {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(CheckpointError::MissingFile {
                dir: dir.to_path_buf(),
                file: name.clone(),
            });
        }
        let found = hash_file(&path)?;
        if found.bytes != expected.bytes {
            return Err(CheckpointError::SizeMismatch {
                path,
                expected: expected.bytes,
                found: found.bytes,
            });
        }
        if found.sha256 != expected.sha256 {
            return Err(CheckpointError::ChecksumMismatch {
                path,
                expected: expected.sha256.clone(),
                found: found.sha256,
            });
        }
    }
    Ok(manifest)
}

/// Reads a verified checkpoint's tensor file.
pub fn read_tensors(dir: &Path, name: &str) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    let path = dir.join(name);
    Tensor::read_safetensors(&path).map_err(|e| CheckpointError::Content {
        path,
        detail: e.to_string(),
    })
}

pub fn read_json<T: for<'de> Deserialize<'de>>(
    dir: &Path,
    name: &str,
) -> Result<T, CheckpointError> {
    let path = dir.join(name);
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Content {
        path,
        detail: e.to_string(),
    })
}

/// Published checkpoints under `root` (directories named `step-…` that have a manifest),
/// oldest first. Temporary directories of interrupted writes are never listed.
pub fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let mut out = Vec::new();
    let Some(entries) = entries_if_present(root)? else {
        return Ok(out);
    };
    for entry in entries {
        let entry = entry.map_err(io_err(root))?;
        let Some(step) = checkpoint_step(&entry.path()) else {
            continue;
        };
        if entry.path().is_dir() && entry.path().join(MANIFEST).is_file() {
            out.push((step, entry.path()));
        }
    }
    out.sort_by_key(|(s, _)| *s);
    Ok(out)
}

pub fn latest(root: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    Ok(list(root)?.pop().map(|(_, p)| p))
}

/// Deletes all but the newest `keep` checkpoints, and never the run's best (`best`, its step;
/// [`steps_to_prune`]).
pub fn prune(root: &Path, keep: usize, best: Option<u64>) -> Result<(), CheckpointError> {
    let all = list(root)?;
    let steps: Vec<u64> = all.iter().map(|(s, _)| *s).collect();
    let doomed_steps = steps_to_prune(&steps, keep, best);
    for (step, dir) in all.into_iter().filter(|(s, _)| doomed_steps.contains(s)) {
        let doomed = root.join(format!(
            "{PRUNING}{}-{}",
            checkpoint_dir_name(step),
            std::process::id()
        ));
        fs::rename(&dir, &doomed).map_err(io_err(&dir))?;
        fs::remove_dir_all(&doomed).map_err(io_err(&doomed))?;
    }
    Ok(())
}

/// The steps rotation deletes from `steps` (oldest first): all but the newest `keep` (at
/// least one), never `best`.
pub fn steps_to_prune(steps: &[u64], keep: usize, best: Option<u64>) -> Vec<u64> {
    let excess = steps.len().saturating_sub(keep.max(1));
    steps
        .iter()
        .take(excess)
        .copied()
        .filter(|&s| Some(s) != best)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_the_newest_and_the_best() {
        let steps = [100, 200, 300, 400, 500];
        assert_eq!(steps_to_prune(&steps, 2, None), vec![100, 200, 300]);
        assert_eq!(steps_to_prune(&steps, 2, Some(200)), vec![100, 300]);
        assert_eq!(
            steps_to_prune(&steps, 2, Some(500)),
            vec![100, 200, 300],
            "a best among the newest takes no extra place"
        );
        assert_eq!(steps_to_prune(&steps, 0, Some(100)), vec![200, 300, 400]);
        assert!(steps_to_prune(&steps, 9, Some(100)).is_empty());
    }

    #[test]
    fn a_checkpoint_directory_names_its_step() {
        assert_eq!(
            checkpoint_step(Path::new("/r/checkpoints/step-0000000012")),
            Some(12)
        );
        assert_eq!(
            checkpoint_step(&PathBuf::from(checkpoint_dir_name(7))),
            Some(7)
        );
        assert_eq!(
            checkpoint_step(Path::new("/r/checkpoints/uncommon-step-12")),
            None
        );
    }
    use tch::Kind;

    fn write_one(root: &Path, step: u64) -> PathBuf {
        let mut w = CheckpointWriter::begin(root, step).unwrap();
        w.write_json("state.json", &serde_json::json!({"step": step}))
            .unwrap();
        let t = Tensor::arange(12, (Kind::Float, tch::Device::Cpu)).view([3, 4]);
        w.write_tensors("weights.safetensors", &[("w".to_string(), t)])
            .unwrap();
        w.commit().unwrap()
    }

    #[test]
    fn committed_checkpoints_verify_and_list_in_order() {
        let root = tempfile::tempdir().unwrap();
        write_one(root.path(), 20);
        let dir = write_one(root.path(), 10);
        let m = verify(&dir).unwrap();
        assert_eq!(m.step, 10);
        assert_eq!(m.files.len(), 2);
        let steps: Vec<u64> = list(root.path()).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, vec![10, 20]);
        assert_eq!(
            latest(root.path()).unwrap().unwrap(),
            root.path().join("step-0000000020")
        );
        let t = read_tensors(&dir, "weights.safetensors").unwrap();
        assert_eq!(t[0].1.size(), vec![3, 4]);
        // `latest` points at the last one written.
        assert_eq!(
            fs::read_link(root.path().join("latest")).unwrap(),
            PathBuf::from("step-0000000010")
        );
    }

    #[test]
    fn an_uncommitted_write_is_invisible_and_cleaned_up() {
        let root = tempfile::tempdir().unwrap();
        {
            let mut w = CheckpointWriter::begin(root.path(), 5).unwrap();
            w.write_bytes("a.bin", b"partial").unwrap();
            // Dropped without commit: simulates a crash before the manifest.
        }
        assert!(list(root.path()).unwrap().is_empty());
        // A hand-made directory without manifest (crash after rename is impossible, but a
        // user copy may be incomplete) is not a checkpoint either.
        fs::create_dir(root.path().join("step-0000000007")).unwrap();
        assert!(list(root.path()).unwrap().is_empty());
        let err = verify(&root.path().join("step-0000000007")).unwrap_err();
        assert!(matches!(err, CheckpointError::NoManifest { .. }), "{err}");
    }

    #[test]
    fn leftovers_of_a_killed_writer_are_recovered_on_the_next_write() {
        let root = tempfile::tempdir().unwrap();
        write_one(root.path(), 1);
        // Killed mid-write (no Drop ran): a partial directory of another process.
        let stale = root.path().join(".tmp-step-0000000002-99999");
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("weights.safetensors"), b"partial").unwrap();
        // Killed between moving step 1 aside and publishing its replacement.
        fs::rename(
            root.path().join("step-0000000001"),
            root.path().join(".old-step-0000000001-99999"),
        )
        .unwrap();
        assert!(list(root.path()).unwrap().is_empty());

        write_one(root.path(), 3);
        assert!(!stale.exists());
        let steps: Vec<u64> = list(root.path()).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, vec![1, 3]);
        verify(&root.path().join("step-0000000001")).unwrap();
    }

    #[test]
    fn truncated_and_flipped_files_fail_with_the_file_named() {
        let root = tempfile::tempdir().unwrap();
        let dir = write_one(root.path(), 1);
        let path = dir.join("weights.safetensors");
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        fs::write(&path, &bytes).unwrap();
        let err = verify(&dir).unwrap_err();
        assert!(
            matches!(err, CheckpointError::ChecksumMismatch { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("weights.safetensors"), "{err}");

        bytes.truncate(10);
        fs::write(&path, &bytes).unwrap();
        let err = verify(&dir).unwrap_err();
        assert!(err.to_string().contains("has 10 bytes"), "{err}");

        fs::remove_file(&path).unwrap();
        assert!(matches!(
            verify(&dir).unwrap_err(),
            CheckpointError::MissingFile { .. }
        ));
    }

    #[test]
    fn rewriting_a_step_replaces_it_and_prune_keeps_the_newest() {
        let root = tempfile::tempdir().unwrap();
        for s in [1, 2, 3, 3] {
            write_one(root.path(), s);
        }
        prune(root.path(), 2, None).unwrap();
        let steps: Vec<u64> = list(root.path()).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, vec![2, 3]);
        verify(&root.path().join("step-0000000003")).unwrap();
        assert_eq!(
            fs::read_dir(root.path()).unwrap().count(),
            3,
            "step 2, step 3, latest"
        );
    }

    #[test]
    fn prune_spares_the_best_beside_the_newest() {
        let root = tempfile::tempdir().unwrap();
        for s in [1, 2, 3, 4] {
            write_one(root.path(), s);
        }
        prune(root.path(), 1, Some(2)).unwrap();
        let steps: Vec<u64> = list(root.path()).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, vec![2, 4]);
        prune(root.path(), 1, Some(4)).unwrap();
        let steps: Vec<u64> = list(root.path()).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(
            steps,
            vec![4],
            "a best no longer best is rotated like any other"
        );
    }

    #[test]
    fn a_prune_killed_mid_deletion_leaves_no_step_directory() {
        let root = tempfile::tempdir().unwrap();
        write_one(root.path(), 1);
        // What a kill inside prune's deletion leaves: the renamed directory, part-deleted.
        let doomed = root.path().join(".prune-step-0000000001-99999");
        fs::rename(root.path().join("step-0000000001"), &doomed).unwrap();
        fs::remove_file(doomed.join(MANIFEST)).unwrap();
        recover(root.path()).unwrap();
        assert!(!doomed.exists());
        assert!(list(root.path()).unwrap().is_empty());
    }
}
