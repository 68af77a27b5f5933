//! The live watch on the training environment: what a package install does to a running
//! daemon's venv, seen within one cache-scan interval instead of at the next start.
//!
//! In the incident this product exists for, an inference engine's install replaced torch in the
//! training venv and was reverted before anyone restarted; the start-time comparison never saw
//! it. This watch re-reads the distributions of the environment the fingerprint names (its
//! `python_executable`'s venv, `*.dist-info` as the fingerprint reads them) and the identity of
//! the libtorch files this process loaded (size, mtime, inode). It returns each change once, for
//! the journal, and the standing difference from the start, for the alert.
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dflash_shared::health::fingerprint::Fingerprint;

use super::python_env;

/// One difference: a package (`python.torch`) or a loaded library file (`libtorch file …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvChange {
    pub field: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl EnvChange {
    /// "torch 2.11.0+cu130 → 2.9.1+cu128", "libtorch_cpu.so replaced on disk".
    pub fn sentence(&self) -> String {
        let absent = "(absent)";
        match self.field.strip_prefix("python.") {
            Some(name) => format!(
                "{name} {} → {}",
                self.before.as_deref().unwrap_or(absent),
                self.after.as_deref().unwrap_or(absent)
            ),
            None => format!(
                "{} ({})",
                self.field,
                self.after.as_deref().unwrap_or(absent)
            ),
        }
    }
}

/// A file's identity: a replaced file (a new inode, size or mtime) is a different file.
fn file_identity(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    Some(format!(
        "inode {}, {} bytes, mtime {}",
        m.ino(),
        m.len(),
        m.mtime()
    ))
}

#[derive(Debug, Clone)]
pub struct EnvWatch {
    site_packages: Vec<PathBuf>,
    /// The environment at start, and at the last check.
    start: BTreeMap<String, String>,
    last: BTreeMap<String, String>,
    /// The lib dir of the libtorch this process loaded.
    libtorch: Option<PathBuf>,
}

impl EnvWatch {
    /// Watches the venv the fingerprint's interpreter belongs to and the libtorch files in
    /// `libtorch_lib_dir`; `None` when there is nothing to watch.
    pub fn from_fingerprint(fp: &Fingerprint, libtorch_lib_dir: Option<&Path>) -> Option<Self> {
        let env = fp
            .python_executable
            .as_deref()
            .map(Path::new)
            .and_then(|python| python.parent()?.parent().map(Path::to_path_buf));
        let site_packages = env
            .as_deref()
            .map(python_env::site_packages)
            .unwrap_or_default();
        let mut start: BTreeMap<String, String> = fp
            .python_packages
            .iter()
            .map(|(k, v)| (format!("python.{k}"), v.clone()))
            .collect();
        if let Some(dir) = libtorch_lib_dir {
            for (key, value) in libtorch_files(dir) {
                start.insert(key, value);
            }
        }
        (!site_packages.is_empty() || libtorch_lib_dir.is_some())
            .then(|| EnvWatch {
                site_packages,
                last: start.clone(),
                start,
                libtorch: libtorch_lib_dir.map(Path::to_path_buf),
            })
            .map(|mut w| {
                // The packages as they are now, not as the fingerprint read them moments ago.
                w.last = w.read();
                w
            })
    }

    fn read(&self) -> BTreeMap<String, String> {
        let mut now = BTreeMap::new();
        for site in &self.site_packages {
            for (k, v) in python_env::installed_packages(site) {
                now.insert(format!("python.{k}"), v);
            }
        }
        if let Some(dir) = &self.libtorch {
            now.extend(libtorch_files(dir));
        }
        now
    }

    /// The changes since the last check (each reported once), and the differences from start
    /// that stand now (empty once an install was reverted).
    pub fn check(&mut self) -> (Vec<EnvChange>, Vec<EnvChange>) {
        let now = self.read();
        let changes = diff(&self.last, &now);
        let standing = diff(&self.start, &now);
        self.last = now;
        (changes, standing)
    }

    /// The packages as they are now (`python.` keys without the prefix), for the fingerprint
    /// the healthy record's differences compare with.
    pub fn packages_now(&self) -> BTreeMap<String, String> {
        self.last
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("python.")?.to_string(), v.clone())))
            .collect()
    }
}

/// `libtorch file libtorch_cpu.so` → its identity, for every shared object of the lib dir.
fn libtorch_files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(read) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("libtorch") && name.contains(".so") {
            if let Some(id) = file_identity(&entry.path()) {
                out.insert(format!("libtorch file {name}"), id);
            }
        }
    }
    out
}

fn diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<EnvChange> {
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| EnvChange {
            field: k.clone(),
            before: before.get(k).cloned(),
            after: after.get(k).cloned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(site: &Path, name: &str, version: &str) {
        let dir = site.join(format!("{name}-{version}.dist-info"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n"),
        )
        .unwrap();
    }

    #[test]
    fn an_install_and_its_revert_are_each_reported_once_and_the_standing_difference_clears() {
        let env = tempfile::tempdir().unwrap();
        let site = env.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        install(&site, "torch", "2.11.0");
        let fp = Fingerprint {
            python_executable: Some(env.path().join("bin/python").display().to_string()),
            python_packages: [("torch".to_string(), "2.11.0".to_string())].into(),
            ..Default::default()
        };
        let mut w = EnvWatch::from_fingerprint(&fp, None).unwrap();
        assert_eq!(w.check(), (vec![], vec![]));
        // An install swaps torch.
        std::fs::remove_dir_all(site.join("torch-2.11.0.dist-info")).unwrap();
        install(&site, "torch", "2.9.1");
        let (changes, standing) = w.check();
        let swap = EnvChange {
            field: "python.torch".into(),
            before: Some("2.11.0".into()),
            after: Some("2.9.1".into()),
        };
        assert_eq!(changes, std::slice::from_ref(&swap));
        assert_eq!(standing, std::slice::from_ref(&swap));
        assert_eq!(swap.sentence(), "torch 2.11.0 → 2.9.1");
        assert_eq!(
            w.packages_now().get("torch").map(String::as_str),
            Some("2.9.1")
        );
        assert!(w.check().0.is_empty(), "reported once");
        // Reverted: the change back is reported; nothing stands.
        std::fs::remove_dir_all(site.join("torch-2.9.1.dist-info")).unwrap();
        install(&site, "torch", "2.11.0");
        let (changes, standing) = w.check();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].after.as_deref(), Some("2.11.0"));
        assert!(standing.is_empty());
    }

    #[test]
    fn a_replaced_libtorch_file_is_a_change() {
        let lib = tempfile::tempdir().unwrap();
        std::fs::write(lib.path().join("libtorch_cpu.so"), b"one").unwrap();
        let mut w = EnvWatch::from_fingerprint(&Fingerprint::default(), Some(lib.path())).unwrap();
        assert!(w.check().0.is_empty());
        // A reinstall writes a new file in its place (a new inode and size).
        let tmp = lib.path().join("libtorch_cpu.so.new");
        std::fs::write(&tmp, b"other build").unwrap();
        std::fs::rename(&tmp, lib.path().join("libtorch_cpu.so")).unwrap();
        let (changes, standing) = w.check();
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].field, "libtorch file libtorch_cpu.so");
        assert_eq!(standing.len(), 1);
    }
}
