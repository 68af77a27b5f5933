//! The engine's link and build steps:
//!
//! 1. rpath and libtorch_cuda for its own tests and examples (see `dflash-build-support`).
//! 2. The current-CUDA-stream C++ shim (`csrc/cuda_stream.cpp`, with `csrc/c10d_cuda_device.cpp`
//!    for NCCL's per-rank device), compiled against the headers of the same torch wheel when it
//!    has `libc10_cuda.so`; without it (a CPU-only libtorch) NCCL reports that it cannot run.
//! 3. The c10d shims of `dist/`: `csrc/c10d_store.cpp` (libtorch's `TCPStore`, always: its
//!    header is in the wheel) and `csrc/c10d_gloo.cpp` (libtorch's `ProcessGroupGloo`), which
//!    needs gloo's headers, which the wheel lacks: Debian's `libgloo-dev` (`make test-deps`).
//!    Without them the Gloo backend is compiled out (`dflash_c10d_gloo` off) and says at run
//!    time what to install. Only the headers are used; no libgloo is linked (see
//!    `csrc/c10d_gloo.cpp` and docs/SCALING.md, "Backends").
use std::path::{Path, PathBuf};

/// Where Debian's libgloo-dev puts `gloo/context.h`; `DFLASH_GLOO_INCLUDE` names another.
const DEFAULT_GLOO_INCLUDE: &str = "/usr/include";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(dflash_cuda_stream_shim)");
    println!("cargo:rustc-check-cfg=cfg(dflash_c10d_gloo)");
    if let Some(lib_dir) = dflash_build_support::link_libtorch() {
        compile_stream_shim(&lib_dir);
        compile_c10d_shims(&lib_dir);
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
    println!("cargo:rerun-if-changed=csrc/c10d_cuda_device.cpp");
    dflash_build_support::torch_cpp_build(lib_dir, "csrc/cuda_stream.cpp")
        .file("csrc/c10d_cuda_device.cpp")
        .compile("dflash_cuda_stream");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-cfg=dflash_cuda_stream_shim");
}

fn compile_c10d_shims(lib_dir: &Path) {
    println!("cargo:rerun-if-changed=csrc/c10d_common.h");
    let store_header = lib_dir.join("../include/torch/csrc/distributed/c10d/TCPStore.hpp");
    // Every libtorch this project supports (the torch==2.11.0 wheel) ships it.
    assert!(
        store_header.exists(),
        "{} not found: the engine needs libtorch's c10d headers (the torch==2.11.0 wheel, `make provision`)",
        store_header.display()
    );
    dflash_build_support::torch_cpp_build(lib_dir, "csrc/c10d_store.cpp")
        .compile("dflash_c10d_store");

    println!("cargo:rerun-if-env-changed=DFLASH_GLOO_INCLUDE");
    let gloo_include = PathBuf::from(
        std::env::var("DFLASH_GLOO_INCLUDE").unwrap_or_else(|_| DEFAULT_GLOO_INCLUDE.into()),
    );
    if gloo_include.join("gloo/context.h").exists() {
        let mut build = dflash_build_support::torch_cpp_build(lib_dir, "csrc/c10d_gloo.cpp");
        if gloo_include != Path::new(DEFAULT_GLOO_INCLUDE) {
            build.include(&gloo_include);
        }
        // ProcessGroupGloo.hpp is empty unless this is set; libtorch_cpu.so was built with it.
        build
            .define("USE_C10D_GLOO", None)
            .compile("dflash_c10d_gloo");
        println!("cargo:rustc-cfg=dflash_c10d_gloo");
    } else {
        // Installing the headers changes this directory, which reruns this script.
        println!("cargo:rerun-if-changed={}", gloo_include.display());
        println!(
            "cargo:warning=no gloo headers under {}: the CPU process group is compiled out (sudo apt-get install libgloo-dev, then rebuild)",
            gloo_include.display()
        );
    }
    // After the static shims on the link line: the c10d and gloo symbols they use.
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
