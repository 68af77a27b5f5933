//! The daemon's link and build steps (binaries and tests link libtorch):
//!
//! 1. rpath and libtorch_cuda: see `dflash-build-support`.
//! 2. The allocator-stats C++ shim (`csrc/allocator_stats.cpp`), compiled against the headers
//!    of the same torch wheel; its CUDA query only when the wheel ships `libc10_cuda.so`.
//! 3. Provenance for the environment fingerprint: the `tch` version from Cargo.lock and the
//!    git commit the daemon was built from.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(dflash_allocator_shim)");
    emit_provenance();
    let Some(lib_dir) = dflash_build_support::link_libtorch() else {
        return;
    };
    println!(
        "cargo:rustc-env=DFLASH_BUILD_LIBTORCH_LIB={}",
        lib_dir.display()
    );
    compile_allocator_shim(&lib_dir);
}

fn compile_allocator_shim(lib_dir: &Path) {
    let include = lib_dir.join("../include");
    if !include.join("c10/core/CachingDeviceAllocator.h").exists() {
        println!("cargo:rerun-if-changed=csrc/allocator_stats.cpp");
        println!(
            "cargo:warning=torch headers not found under {}; allocator statistics will be reported as not built",
            include.display()
        );
        return;
    }
    let mut build = dflash_build_support::torch_cpp_build(lib_dir, "csrc/allocator_stats.cpp");
    if lib_dir.join("libc10_cuda.so").exists() {
        build.define("DFLASH_HAVE_C10_CUDA", None);
    }
    build.compile("dflash_allocator_stats");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-cfg=dflash_allocator_shim");
}

/// `DFLASH_TCH_VERSION` from Cargo.lock and `DFLASH_GIT_COMMIT` from the checkout.
fn emit_provenance() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let lock = manifest_dir.join("../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let tch_version = std::fs::read_to_string(&lock)
        .ok()
        .and_then(|text| locked_version(&text, "tch"))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DFLASH_TCH_VERSION={tch_version}");

    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&manifest_dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DFLASH_GIT_COMMIT={commit}");
    // Rebuild the commit stamp when HEAD moves (works for worktrees: HEAD lives in the
    // worktree's git dir, branch refs in the common dir).
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
    }
    if let (Some(common), Some(head_ref)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        let common = manifest_dir.join(common);
        println!(
            "cargo:rerun-if-changed={}",
            common.join(&head_ref).display()
        );
        println!(
            "cargo:rerun-if-changed={}",
            common.join("packed-refs").display()
        );
    }
}

/// The version of `package` in a Cargo.lock text.
fn locked_version(lock: &str, package: &str) -> Option<String> {
    let needle = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == needle {
            let version = lines
                .next()?
                .trim()
                .strip_prefix("version = \"")?
                .strip_suffix('"')?;
            return Some(version.to_string());
        }
    }
    None
}
