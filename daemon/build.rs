//! Link-time fixes that torch-sys cannot express for its dependents.
//!
//! 1. rpath: torch-sys only passes `-rpath` to its own C++ shim, so our binaries would need
//!    `LD_LIBRARY_PATH`. We embed the libtorch lib dir (a RUNPATH, so an explicit
//!    `LD_LIBRARY_PATH`, e.g. a GPU node's own torch, still wins).
//! 2. libtorch_cuda: nothing in our code references a symbol of it, so the default
//!    `--as-needed` drops it and CUDA silently looks absent. We link it with the
//!    `-as-needed` modifier whenever the wheel ships it.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(lib_dir) = std::env::var("DEP_TORCH_SYS_LIBTORCH_LIB") else {
        println!("cargo:warning=torch-sys did not report its libtorch lib dir; binaries will need LD_LIBRARY_PATH");
        return;
    };
    let lib_dir = PathBuf::from(lib_dir);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    println!("cargo:rustc-env=DFLASH_BUILD_LIBTORCH_LIB={}", lib_dir.display());
    for cuda_lib in ["torch_cuda", "c10_cuda"] {
        if lib_dir.join(format!("lib{cuda_lib}.so")).exists() {
            println!("cargo:rustc-link-lib=dylib:-as-needed={cuda_lib}");
        }
    }
}
