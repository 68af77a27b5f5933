//! Link-time fixes that torch-sys cannot express for its dependents, for the build scripts of
//! every crate whose binaries or tests link libtorch (engine, daemon, bench).
//!
//! `cargo:rustc-link-arg` only reaches the targets of the package whose build script prints it,
//! so each such crate calls [`link_libtorch`] from its own `build.rs` (and depends on `torch-sys`
//! directly, which is what hands its build script `DEP_TCH_LIBTORCH_LIB`).
//!
//! 1. rpath: torch-sys only passes `-rpath` to its own C++ shim, so our binaries would need
//!    `LD_LIBRARY_PATH`. We embed the libtorch lib dir (a RUNPATH, so an explicit
//!    `LD_LIBRARY_PATH`, e.g. a GPU node's own torch, still wins).
//! 2. libtorch_cuda: nothing in our code references a symbol of it, so the default
//!    `--as-needed` drops it and CUDA silently looks absent. We link it inside a
//!    `--no-as-needed` bracket whenever the wheel ships it (the `-as-needed` link modifier
//!    is still nightly-only).
//! 3. [`torch_cpp_build`]: a C++ shim compiled against the headers of the same torch wheel, as
//!    the engine's CUDA-stream shim and the daemon's allocator-stats shim are.
use std::path::{Path, PathBuf};

/// Emits the rpath and CUDA link arguments; returns the libtorch lib dir torch-sys built
/// against (`None`, with a cargo warning, when torch-sys did not say).
pub fn link_libtorch() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib_dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        println!("cargo:warning=torch-sys did not report its libtorch lib dir; binaries will need LD_LIBRARY_PATH");
        return None;
    };
    let lib_dir = PathBuf::from(lib_dir);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    let cuda_libs: Vec<String> = ["torch_cuda", "c10_cuda"]
        .iter()
        .filter(|name| lib_dir.join(format!("lib{name}.so")).exists())
        .map(|name| format!("-l{name}"))
        .collect();
    if !cuda_libs.is_empty() {
        println!(
            "cargo:rustc-link-arg=-Wl,-L{},--no-as-needed,{},--as-needed",
            lib_dir.display(),
            cuda_libs.join(",")
        );
    }
    Some(lib_dir)
}

/// A `cc` build of the C++ file `source` against the headers of the libtorch in `lib_dir`
/// (`<lib_dir>/../include` and its C++ API headers, as system headers so torch's own warnings
/// are not ours), C++17, with the C++11 ABI `LIBTORCH_CXX11_ABI` names (on by default, as the
/// wheel is built) and `NDEBUG` (the wheel's release layout). The caller adds its defines and
/// compiles.
pub fn torch_cpp_build(lib_dir: &Path, source: &str) -> cc::Build {
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let include = lib_dir.join("../include");
    let cxx11_abi = std::env::var("LIBTORCH_CXX11_ABI")
        .map(|v| v != "0")
        .unwrap_or(true);
    let mut build = cc::Build::new();
    build.cpp(true).file(source).flag("-std=c++17");
    for dir in [&include, &include.join("torch/csrc/api/include")] {
        build
            .flag("-isystem")
            .flag(dir.to_str().expect("utf-8 include path"));
    }
    build.define("_GLIBCXX_USE_CXX11_ABI", if cxx11_abi { "1" } else { "0" });
    // The wheel is a release build: headers that add members under `#ifndef NDEBUG` (e.g.
    // `at::RecordFunction::inputs_valid_`) must see the layout the library was compiled with.
    build.define("NDEBUG", None);
    build
}
