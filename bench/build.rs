//! dflash-bench's link and build steps:
//!
//! 1. rpath and libtorch_cuda for its binaries and tests (see `dflash-build-support`).
//! 2. The FLOP counter shim (`csrc/flop_counter.cpp`, `src/flop_counter.rs`), compiled against
//!    the headers of the same torch wheel: the measured side of the FLOP model.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Some(lib_dir) = dflash_build_support::link_libtorch() else {
        panic!("dflash-bench needs torch-sys's libtorch lib dir to build its FLOP counter");
    };
    dflash_build_support::torch_cpp_build(&lib_dir, "csrc/flop_counter.cpp")
        .compile("dflash_flop_counter");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
