//! How to spell a command in a hint the operator can paste.
//!
//! `make run` starts binaries from `target/release/`, which is rarely on `PATH`. A hint that
//! says `dflash-tui attach` would then fail with "command not found" at the very moment the
//! operator needs it, so hints name the binary by its path unless `PATH` finds that same file.
use std::path::{Path, PathBuf};

/// The spelling of `name`, a binary living in `exe_dir`:
/// - the bare name when one of `path_dirs` holds that same binary (`same_file` decides);
/// - else its path relative to `cwd` when it lies below `cwd` (`./target/release/dflash-tui`);
/// - else its absolute path.
pub fn spell_command(
    name: &str,
    exe_dir: &Path,
    cwd: &Path,
    path_dirs: impl IntoIterator<Item = PathBuf>,
    same_file: impl Fn(&Path, &Path) -> bool,
) -> String {
    let exe = exe_dir.join(name);
    if path_dirs
        .into_iter()
        .any(|dir| same_file(&dir.join(name), &exe))
    {
        return name.to_string();
    }
    match exe.strip_prefix(cwd) {
        Ok(relative) => format!("./{}", relative.display()),
        Err(_) => exe.display().to_string(),
    }
}

/// How to spell `name`, a binary installed beside the running one (`dflashd` and `dflash-tui`
/// are built and installed together). Reads the process's executable path, working directory
/// and `PATH` (the one edge in this crate). Falls back to the bare name when there is no such
/// sibling (the console installed elsewhere).
pub fn spell_sibling(name: &str) -> String {
    let exe = std::env::current_exe().ok();
    let exe_dir = exe.as_deref().and_then(Path::parent);
    let (Some(exe_dir), Ok(cwd)) = (exe_dir, std::env::current_dir()) else {
        return name.to_string();
    };
    if !exe_dir.join(name).is_file() {
        return name.to_string();
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    spell_command(name, exe_dir, &cwd, path_dirs, |a, b| {
        match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    })
}

/// ` --socket PATH` when the socket is not the default one, so a pasted hint reaches the same
/// daemon; empty otherwise.
pub fn socket_flag(socket: &Path, is_default: bool) -> String {
    if is_default {
        String::new()
    } else {
        format!(" --socket {}", socket.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: &Path, _: &Path) -> bool {
        false
    }

    #[test]
    fn bare_name_when_path_finds_the_same_binary() {
        let exe_dir = Path::new("/opt/dflash/bin");
        let spelled = spell_command(
            "dflash-tui",
            exe_dir,
            Path::new("/home/op"),
            vec![PathBuf::from("/usr/bin"), PathBuf::from("/opt/dflash/bin")],
            |a, b| a == b,
        );
        assert_eq!(spelled, "dflash-tui");
    }

    #[test]
    fn another_binary_of_the_same_name_on_path_is_not_ours() {
        let spelled = spell_command(
            "dflash-tui",
            Path::new("/work/repo/target/release"),
            Path::new("/work/repo"),
            vec![PathBuf::from("/usr/local/bin")],
            never,
        );
        assert_eq!(spelled, "./target/release/dflash-tui");
    }

    #[test]
    fn absolute_path_outside_the_working_directory() {
        let spelled = spell_command(
            "dflashd",
            Path::new("/srv/builds/release"),
            Path::new("/home/op"),
            Vec::new(),
            never,
        );
        assert_eq!(spelled, "/srv/builds/release/dflashd");
    }

    #[test]
    fn socket_flag_only_for_a_non_default_socket() {
        let socket = Path::new("/tmp/x.sock");
        assert_eq!(socket_flag(socket, true), "");
        assert_eq!(socket_flag(socket, false), " --socket /tmp/x.sock");
    }
}
