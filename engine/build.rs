//! The engine's link and build steps:
//!
//! 1. rpath and libtorch_cuda for its own tests and examples (see `dflash-build-support`).
//! 2. The current-CUDA-stream C++ shim (`csrc/cuda_stream.cpp`), compiled against the headers
//!    of the same torch wheel when it has `libc10_cuda.so`; without it (a CPU-only libtorch)
//!    NCCL reports that it cannot run.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(dflash_cuda_stream_shim)");
    if let Some(lib_dir) = dflash_build_support::link_libtorch() {
        compile_stream_shim(&lib_dir);
    }
}

fn compile_stream_shim(lib_dir: &Path) {
    let include = lib_dir.join("../include");
    let needed = [
        include.join("c10/core/impl/DeviceGuardImplInterface.h"),
        lib_dir.join("libc10_cuda.so"),
    ];
    if let Some(missing) = needed.iter().find(|p| !p.exists()) {
        println!("cargo:rerun-if-changed=csrc/cuda_stream.cpp");
        println!(
            "cargo:warning=no CUDA stream shim ({} not found): NCCL collectives will refuse to run",
            missing.display()
        );
        return;
    }
    dflash_build_support::torch_cpp_build(lib_dir, "csrc/cuda_stream.cpp")
        .compile("dflash_cuda_stream");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-cfg=dflash_cuda_stream_shim");
}
