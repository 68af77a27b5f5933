//! Reads the commit a file's git checkout points at, without running git: find the `.git`
//! above the file (a directory, or a `gitdir:` file for worktrees and submodules), read
//! `HEAD`, and resolve a symbolic ref through loose refs and `packed-refs`.
use std::path::{Path, PathBuf};

/// The commit checked out in the repository containing `path`, if it is in one.
pub fn head_commit_of(path: &Path) -> Option<String> {
    let start = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent()?.to_path_buf()
    };
    let start = std::fs::canonicalize(start).ok()?;
    let git_dir = find_git_dir(&start)?;
    resolve_head(&git_dir)
}

fn find_git_dir(start: &Path) -> Option<PathBuf> {
    for dir in start.ancestors() {
        let dot_git = dir.join(".git");
        if dot_git.is_dir() {
            return Some(dot_git);
        }
        if dot_git.is_file() {
            let text = std::fs::read_to_string(&dot_git).ok()?;
            let target = text.lines().find_map(|l| l.strip_prefix("gitdir:"))?.trim();
            return Some(dir.join(target));
        }
    }
    None
}

/// The common dir holds branch refs shared by all worktrees.
fn common_dir(git_dir: &Path) -> PathBuf {
    match std::fs::read_to_string(git_dir.join("commondir")) {
        Ok(rel) => git_dir.join(rel.trim()),
        Err(_) => git_dir.to_path_buf(),
    }
}

fn resolve_head(git_dir: &Path) -> Option<String> {
    let head = std::fs::read_to_string(git_dir.join("HEAD")).ok()?;
    let head = head.trim();
    let Some(reference) = head.strip_prefix("ref:").map(str::trim) else {
        return is_sha(head).then(|| head.to_string());
    };
    for dir in [git_dir.to_path_buf(), common_dir(git_dir)] {
        if let Ok(sha) = std::fs::read_to_string(dir.join(reference)) {
            let sha = sha.trim();
            if is_sha(sha) {
                return Some(sha.to_string());
            }
        }
        if let Ok(packed) = std::fs::read_to_string(dir.join("packed-refs")) {
            let found = packed.lines().find_map(|l| {
                let (sha, name) = l.split_once(' ')?;
                (name == reference && is_sha(sha)).then(|| sha.to_string())
            });
            if found.is_some() {
                return found;
            }
        }
    }
    None
}

fn is_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn loose_packed_and_detached_heads_resolve() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let git = repo.join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        std::fs::create_dir_all(repo.join("configs")).unwrap();
        let file = repo.join("configs/a.toml");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(head_commit_of(&tmp.path().join("nowhere.toml")), None);

        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(git.join("refs/heads/main"), format!("{SHA}\n")).unwrap();
        assert_eq!(head_commit_of(&file).as_deref(), Some(SHA));

        std::fs::remove_file(git.join("refs/heads/main")).unwrap();
        std::fs::write(
            git.join("packed-refs"),
            format!("# pack-refs\n{SHA} refs/heads/main\n"),
        )
        .unwrap();
        assert_eq!(head_commit_of(&file).as_deref(), Some(SHA));

        let detached = "fedcba9876543210fedcba9876543210fedcba98";
        std::fs::write(git.join("HEAD"), format!("{detached}\n")).unwrap();
        assert_eq!(head_commit_of(&file).as_deref(), Some(detached));
    }

    #[test]
    fn worktree_gitdir_files_use_the_common_dir_for_branches() {
        let tmp = tempfile::tempdir().unwrap();
        let main_git = tmp.path().join("main/.git");
        let wt_git = main_git.join("worktrees/wt");
        std::fs::create_dir_all(main_git.join("refs/heads")).unwrap();
        std::fs::create_dir_all(&wt_git).unwrap();
        std::fs::write(wt_git.join("HEAD"), "ref: refs/heads/feature\n").unwrap();
        std::fs::write(wt_git.join("commondir"), "../..\n").unwrap();
        std::fs::write(main_git.join("refs/heads/feature"), format!("{SHA}\n")).unwrap();
        let wt = tmp.path().join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", wt_git.display())).unwrap();
        std::fs::write(wt.join("c.toml"), "x").unwrap();
        assert_eq!(head_commit_of(&wt.join("c.toml")).as_deref(), Some(SHA));
    }
}
