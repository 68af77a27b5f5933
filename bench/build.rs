//! dflash-bench and its tests link libtorch: give them the rpath and CUDA link arguments
//! (see `dflash-build-support`).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    dflash_build_support::link_libtorch();
}
