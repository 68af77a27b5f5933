//! libtorch caching-allocator statistics through the C++ shim in `csrc/allocator_stats.cpp`.
//!
//! Peak counters are lifetime peaks unless [`reset_peak`] is called; the sampler resets them
//! after each reading so each telemetry window reports its own peak (as torchtitan does).
use dflash_shared::metrics::AllocatorStats;

/// Why no statistics could be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocatorUnavailable {
    #[error("allocator statistics are not applicable: CUDA is not available (CPU run)")]
    NoCuda,
    #[error("allocator statistics are not available: {0}")]
    NotBuilt(String),
    #[error("reading allocator statistics of cuda:{device} failed: {message}")]
    Failed { device: usize, message: String },
}

#[cfg(dflash_allocator_shim)]
mod ffi {
    use std::ffi::{c_char, c_int};

    #[repr(C)]
    #[derive(Default)]
    pub struct DflashAllocatorStats {
        pub allocated_current: i64,
        pub allocated_peak: i64,
        pub reserved_current: i64,
        pub reserved_peak: i64,
        pub active_peak: i64,
        pub num_alloc_retries: i64,
        pub num_ooms: i64,
    }

    pub const OK: c_int = 0;
    pub const NOT_COMPILED: c_int = 1;

    extern "C" {
        pub fn dflash_torch_header_version() -> *const c_char;
        pub fn dflash_cuda_allocator_compiled() -> c_int;
        pub fn dflash_cuda_allocator_stats(
            device: c_int,
            out: *mut DflashAllocatorStats,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub fn dflash_cuda_allocator_reset_peak(
            device: c_int,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
}

/// The torch version of the headers the shim was compiled against, e.g. "2.11.0".
pub fn torch_header_version() -> Option<String> {
    #[cfg(dflash_allocator_shim)]
    {
        // SAFETY: returns a pointer to a static NUL-terminated string literal.
        let v = unsafe { std::ffi::CStr::from_ptr(ffi::dflash_torch_header_version()) };
        Some(v.to_string_lossy().into_owned())
    }
    #[cfg(not(dflash_allocator_shim))]
    None
}

/// Whether the shim's CUDA query was compiled (the wheel ships `libc10_cuda.so`).
pub fn cuda_query_compiled() -> bool {
    #[cfg(dflash_allocator_shim)]
    {
        // SAFETY: no arguments, no side effects.
        unsafe { ffi::dflash_cuda_allocator_compiled() != 0 }
    }
    #[cfg(not(dflash_allocator_shim))]
    false
}

/// Statistics of one CUDA device's caching allocator.
pub fn cuda_stats(device: usize) -> Result<AllocatorStats, AllocatorUnavailable> {
    if !cuda_query_compiled() {
        return Err(AllocatorUnavailable::NotBuilt(
            "this dflashd was built without the CUDA allocator query (no libc10_cuda.so in the torch wheel)".into(),
        ));
    }
    if !tch::Cuda::is_available() {
        return Err(AllocatorUnavailable::NoCuda);
    }
    query(device)
}

#[cfg(dflash_allocator_shim)]
fn query(device: usize) -> Result<AllocatorStats, AllocatorUnavailable> {
    let mut out = ffi::DflashAllocatorStats::default();
    let mut err = [0 as std::ffi::c_char; 512];
    let dev = std::ffi::c_int::try_from(device).map_err(|_| AllocatorUnavailable::Failed {
        device,
        message: "device index out of range".into(),
    })?;
    // SAFETY: `out` and `err` are valid for writes of their full size; the shim catches every
    // C++ exception and NUL-terminates `err`.
    let rc =
        unsafe { ffi::dflash_cuda_allocator_stats(dev, &mut out, err.as_mut_ptr(), err.len()) };
    match rc {
        ffi::OK => {
            let u = |v: i64| u64::try_from(v).unwrap_or(0);
            Ok(AllocatorStats {
                allocated_bytes: u(out.allocated_current),
                reserved_bytes: u(out.reserved_current),
                peak_allocated_bytes: u(out.allocated_peak),
                alloc_retries: u(out.num_alloc_retries),
                ooms: u(out.num_ooms),
            })
        }
        ffi::NOT_COMPILED => Err(AllocatorUnavailable::NotBuilt(message(&err))),
        _ => Err(AllocatorUnavailable::Failed {
            device,
            message: message(&err),
        }),
    }
}

#[cfg(not(dflash_allocator_shim))]
fn query(_device: usize) -> Result<AllocatorStats, AllocatorUnavailable> {
    Err(AllocatorUnavailable::NotBuilt(
        "the allocator shim was not compiled (torch headers missing at build time)".into(),
    ))
}

/// Resets the peak counters of `device`, so the next reading's peak covers one window.
pub fn reset_peak(device: usize) -> Result<(), AllocatorUnavailable> {
    if !cuda_query_compiled() {
        return Err(AllocatorUnavailable::NotBuilt(
            "CUDA allocator query not built".into(),
        ));
    }
    if !tch::Cuda::is_available() {
        return Err(AllocatorUnavailable::NoCuda);
    }
    #[cfg(dflash_allocator_shim)]
    {
        let mut err = [0 as std::ffi::c_char; 512];
        let dev = std::ffi::c_int::try_from(device).map_err(|_| AllocatorUnavailable::Failed {
            device,
            message: "device index out of range".into(),
        })?;
        // SAFETY: `err` is valid for writes of its full size; the shim NUL-terminates it.
        let rc = unsafe { ffi::dflash_cuda_allocator_reset_peak(dev, err.as_mut_ptr(), err.len()) };
        if rc != ffi::OK {
            return Err(AllocatorUnavailable::Failed {
                device,
                message: message(&err),
            });
        }
    }
    Ok(())
}

#[cfg(dflash_allocator_shim)]
fn message(buf: &[std::ffi::c_char]) -> String {
    // SAFETY: the shim always NUL-terminates within the buffer it was given.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    s.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_reports_the_header_version_of_the_linked_wheel() {
        let v =
            torch_header_version().expect("build.rs compiles the shim when torch headers exist");
        assert!(v.starts_with("2."), "{v}");
    }

    #[test]
    fn cpu_machines_say_allocator_stats_are_not_applicable() {
        if tch::Cuda::is_available() {
            // On a GPU machine the same call returns real numbers; check they are coherent.
            let s = cuda_stats(0).expect("stats of cuda:0");
            assert!(s.reserved_bytes >= s.allocated_bytes);
            return;
        }
        let err = cuda_stats(0).unwrap_err();
        if cuda_query_compiled() {
            assert_eq!(err, AllocatorUnavailable::NoCuda);
            assert!(err.to_string().contains("not applicable"));
        } else {
            assert!(matches!(err, AllocatorUnavailable::NotBuilt(_)));
        }
    }

    #[test]
    fn a_cuda_tensor_shows_up_in_allocated_bytes() {
        if !tch::Cuda::is_available() {
            return; // Exercised by the GPU check script; nothing to allocate on CPU.
        }
        let before = cuda_stats(0).unwrap();
        let t = tch::Tensor::zeros([64, 1024, 1024], (tch::Kind::Float, tch::Device::Cuda(0)));
        let during = cuda_stats(0).unwrap();
        assert!(during.allocated_bytes >= before.allocated_bytes + 256 * 1024 * 1024);
        drop(t);
    }
}
