//! The Python environment in use: which one, and its installed distributions, read from
//! `*.dist-info/METADATA` in site-packages (no interpreter is started).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Finds the environment: an explicit path, else `$VIRTUAL_ENV`, else `.venv` under `cwd`.
pub fn locate(explicit: Option<&Path>, virtual_env: Option<&Path>, cwd: &Path) -> Option<PathBuf> {
    if let Some(p) = explicit {
        // `telemetry.python` names an interpreter (`venv/bin/python`): its environment is the
        // folder above `bin/` (not the interpreter the link points at, which may be a base
        // install's). A directory is taken as the environment itself.
        let env = match p.parent() {
            Some(bin) if p.is_file() && bin.file_name().is_some_and(|n| n == "bin") => {
                bin.parent().unwrap_or(bin)
            }
            _ => p,
        };
        return Some(env.to_path_buf());
    }
    if let Some(p) = virtual_env {
        return Some(p.to_path_buf());
    }
    let dot_venv = cwd.join(".venv");
    dot_venv.join("pyvenv.cfg").is_file().then_some(dot_venv)
}

/// Every `lib/python3.*/site-packages` of an environment.
pub fn site_packages(env: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(env.join("lib")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = read
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Distribution name (normalized: lowercase, runs of `-_.` as `-`) → version.
pub fn installed_packages(site_packages: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(read) = std::fs::read_dir(site_packages) else {
        return out;
    };
    for entry in read.flatten() {
        let file_name = entry.file_name();
        let Some(stem) = file_name
            .to_str()
            .and_then(|n| n.strip_suffix(".dist-info"))
        else {
            continue;
        };
        let parsed = std::fs::read_to_string(entry.path().join("METADATA"))
            .ok()
            .and_then(|m| metadata_name_version(&m))
            .or_else(|| {
                stem.split_once('-')
                    .map(|(n, v)| (n.to_string(), v.to_string()))
            });
        if let Some((name, version)) = parsed {
            out.insert(normalize(&name), version);
        }
    }
    out
}

/// `Name:` and `Version:` from the header block of a core-metadata file.
fn metadata_name_version(metadata: &str) -> Option<(String, String)> {
    let mut name = None;
    let mut version = None;
    for line in metadata.lines() {
        if line.is_empty() {
            break; // End of headers; the description follows.
        }
        if let Some(v) = line.strip_prefix("Name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().to_string());
        }
    }
    Some((name?, version?))
}

/// PEP 503 normalization, so `Jinja2`, `jinja2` and `jinja_2` compare equal.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut last_sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !last_sep {
                out.push('-');
            }
            last_sep = true;
        } else {
            out.extend(c.to_lowercase());
            last_sep = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(site: &Path, dir: &str, metadata: Option<&str>) {
        let d = site.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        if let Some(m) = metadata {
            std::fs::write(d.join("METADATA"), m).unwrap();
        }
    }

    #[test]
    fn reads_names_and_versions_from_metadata_with_a_dirname_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("lib/python3.11/site-packages");
        dist(
            &site,
            "torch-2.11.0+cu130.dist-info",
            Some(
                "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu130\n\nVersion: not-this\n",
            ),
        );
        dist(
            &site,
            "Jinja2-3.1.4.dist-info",
            Some("Name: Jinja2\nVersion: 3.1.4\n"),
        );
        dist(&site, "nvidia_nccl_cu13-2.27.7.dist-info", None);
        std::fs::create_dir_all(site.join("torch")).unwrap();
        assert_eq!(site_packages(tmp.path()), vec![site.clone()]);
        let pkgs = installed_packages(&site);
        assert_eq!(pkgs.get("torch").map(String::as_str), Some("2.11.0+cu130"));
        assert_eq!(pkgs.get("jinja2").map(String::as_str), Some("3.1.4"));
        assert_eq!(
            pkgs.get("nvidia-nccl-cu13").map(String::as_str),
            Some("2.27.7")
        );
        assert_eq!(pkgs.len(), 3);
    }

    #[test]
    fn an_interpreter_path_names_the_environment_above_its_bin() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("venv/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("python"), "").unwrap();
        assert_eq!(
            locate(Some(&bin.join("python")), None, tmp.path()),
            Some(tmp.path().join("venv"))
        );
    }

    #[test]
    fn environment_is_found_explicitly_then_virtual_env_then_dot_venv() {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path();
        assert_eq!(locate(None, None, cwd), None);
        std::fs::create_dir_all(cwd.join(".venv")).unwrap();
        std::fs::write(cwd.join(".venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert_eq!(locate(None, None, cwd), Some(cwd.join(".venv")));
        assert_eq!(
            locate(None, Some(Path::new("/ve")), cwd),
            Some(PathBuf::from("/ve"))
        );
        assert_eq!(
            locate(Some(Path::new("/x")), Some(Path::new("/ve")), cwd),
            Some(PathBuf::from("/x"))
        );
    }
}
