//! The one atomic file write of the workspace: write a temporary sibling, flush it to disk,
//! rename it over the target, flush the directory. A crash leaves the old file or the new one,
//! never half of one. Checkpoint *directories* have their own protocol in
//! [`crate::train::checkpoint`], built from the same two steps.
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// `.<name>.tmp-<pid>` beside `path`: hidden, and never taken for a finished file.
pub fn temp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(
        path,
        |tmp| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(tmp)?;
            f.write_all(bytes)
        },
        |_, e| e,
    )
}

/// Lets `write` fill a temporary sibling of `path` (by path, for writers such as safetensors
/// that open the file themselves), then publishes it atomically; `io_error` names the path of a
/// failed flush or rename in the caller's error type. The temporary file is removed when
/// anything fails.
pub fn write_atomic_with<E>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
    io_error: impl FnOnce(&Path, io::Error) -> E,
) -> Result<(), E> {
    let tmp = temp_sibling(path);
    let published = write(&tmp).and_then(|()| publish(&tmp, path).map_err(|e| io_error(path, e)));
    if published.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    published
}

/// Flushes `tmp`, renames it to `path` and flushes the directory that holds them.
fn publish(tmp: &Path, path: &Path) -> io::Result<()> {
    File::open(tmp)?.sync_all()?;
    fs::rename(tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// Flushes a directory's entries (a rename is durable only once its directory is). Best effort:
/// some filesystems refuse to open a directory for syncing.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn a_failed_writer_keeps_the_old_file_and_removes_its_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        write_atomic(&path, b"old").unwrap();
        let err = write_atomic_with(
            &path,
            |tmp| {
                fs::write(tmp, b"half")?;
                Err::<(), io::Error>(io::Error::other("disk full"))
            },
            |_, e| e,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert!(!temp_sibling(&path).exists());
    }
}
