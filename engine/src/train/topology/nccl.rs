//! The CUDA all-reduce: NCCL through `cudarc`'s bindings (loaded at run time, so nothing here
//! needs CUDA to build or to run on a CPU machine).
//!
//! One communicator per drafter GPU, created together with `ncclCommInitAll` in this process;
//! each drafter worker thread then drives its own communicator. Collectives are enqueued on the
//! device's legacy default stream, the stream libtorch computes on by default, so they are
//! ordered after the backward that produced the gradients and before the optimizer that reads
//! them, without a host synchronisation.
//!
//! NOT TESTED ON A GPU: the machines this was written on have none. The CPU all-reduce
//! ([`super::allreduce::CpuAllReduce`]) is what the tests exercise.
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::nccl::{result, sys};
use tch::{Device, Kind, Tensor};

use super::allreduce::{AbortGroup, AllReduce, AllReduceError};

/// Where the torch wheel keeps NCCL, from its `torch/lib` directory:
/// `<site-packages>/nvidia/nccl/lib/libnccl.so.2`.
pub fn wheel_nccl(torch_lib: &Path) -> PathBuf {
    torch_lib.join("../../nvidia/nccl/lib/libnccl.so.2")
}

/// What to do when cudarc cannot open NCCL: it looks for `libnccl.so` (and a few versioned
/// names, not `.so.2`) on the library search path, while the torch wheel ships only
/// `libnccl.so.2`. `wheel` is the wheel's copy when it exists.
pub fn missing_nccl_hint(wheel: Option<&Path>) -> String {
    match wheel {
        Some(lib) => format!(
            "NCCL is not loadable as `libnccl.so`; the torch wheel has it as {lib}. Link it and \
             restart dflashd: `mkdir -p ~/.local/lib/dflash-nccl && ln -sf {lib} \
             ~/.local/lib/dflash-nccl/libnccl.so && export \
             LD_LIBRARY_PATH=~/.local/lib/dflash-nccl:$LD_LIBRARY_PATH`",
            lib = lib.display()
        ),
        None => "NCCL is not loadable as `libnccl.so` and the torch wheel's copy was not found \
                 beside the loaded libtorch; install NCCL (e.g. the system `libnccl2` package) \
                 or put a `libnccl.so` on LD_LIBRARY_PATH"
            .into(),
    }
}

/// The NCCL version cudarc can load, or what to do to make it loadable.
pub fn nccl_status(torch_lib: Option<&Path>) -> Result<String, String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        let wheel = torch_lib.map(wheel_nccl).filter(|p| p.exists());
        return Err(missing_nccl_hint(
            wheel.and_then(|p| p.canonicalize().ok()).as_deref(),
        ));
    }
    let version = result::get_nccl_version().map_err(|e| describe(&e))?;
    Ok(format!(
        "NCCL {}.{}.{}",
        version / 10_000,
        (version / 100) % 100,
        version % 100
    ))
}

fn describe(err: &result::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any result code.
    let text = unsafe {
        let ptr = sys::ncclGetErrorString(err.0);
        if ptr.is_null() {
            String::new()
        } else {
            CStr::from_ptr(ptr).to_string_lossy().into_owned()
        }
    };
    format!("{:?} ({text})", err.0)
}

/// A communicator shared by its rank's endpoint and the group's abort handle.
struct Comm {
    raw: sys::ncclComm_t,
    /// Set once the communicator was aborted or destroyed; it must not be used after.
    gone: bool,
}

// SAFETY: an NCCL communicator may be used from any thread; the mutex around it makes sure
// the abort handle and the endpoint never call into it concurrently except through
// `ncclCommAbort`, which NCCL documents as safe while a collective is blocked.
unsafe impl Send for Comm {}

type SharedComm = Arc<Mutex<Comm>>;

/// One drafter GPU's endpoint.
pub struct NcclAllReduce {
    comm: SharedComm,
    /// The raw handle, read without the lock while a collective runs (so an abort can get in).
    raw: usize,
    rank: usize,
    world: usize,
    device: usize,
}

/// Aborts every communicator of a group.
pub struct NcclGroup {
    comms: Vec<SharedComm>,
}

impl AbortGroup for NcclGroup {
    fn abort(&self) {
        for comm in &self.comms {
            let mut c = comm.lock().unwrap_or_else(|p| p.into_inner());
            if !c.gone {
                c.gone = true;
                // SAFETY: the communicator is live (not yet aborted or destroyed).
                let _ = unsafe { result::comm_abort(c.raw) };
            }
        }
    }
}

/// Creates one communicator per device in `devices` (CUDA indices, one rank each, in order).
pub fn nccl_group(devices: &[usize]) -> Result<(Arc<NcclGroup>, Vec<NcclAllReduce>), String> {
    let torch_lib = crate::device::loaded_libtorch_dir();
    nccl_status(torch_lib.as_deref())?;
    let version = result::get_nccl_version().map_err(|e| describe(&e))?;
    let n = devices.len();
    let ordinals: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
    let mut raw = vec![std::ptr::null_mut(); n];
    // SAFETY: `raw` has room for `n` communicators and `ordinals` names `n` devices.
    unsafe { result::comm_init_all(raw.as_mut_ptr(), n as i32, ordinals.as_ptr()) }.map_err(
        |e| {
            format!(
                "ncclCommInitAll over cuda devices {devices:?} (NCCL {version}) failed: {}",
                describe(&e)
            )
        },
    )?;
    let comms: Vec<SharedComm> = raw
        .iter()
        .map(|&raw| Arc::new(Mutex::new(Comm { raw, gone: false })))
        .collect();
    let endpoints = comms
        .iter()
        .zip(&raw)
        .enumerate()
        .map(|(rank, (comm, &ptr))| NcclAllReduce {
            comm: Arc::clone(comm),
            raw: ptr as usize,
            rank,
            world: n,
            device: devices[rank],
        })
        .collect();
    Ok((Arc::new(NcclGroup { comms }), endpoints))
}

impl NcclAllReduce {
    fn check_live(&self) -> Result<(), AllReduceError> {
        if self.comm.lock().unwrap_or_else(|p| p.into_inner()).gone {
            return Err(AllReduceError::Aborted);
        }
        Ok(())
    }

    /// In-place sum of `count` elements of `dtype` at `ptr` (device memory of this rank).
    fn all_reduce(
        &self,
        ptr: *mut std::ffi::c_void,
        count: usize,
        dtype: sys::ncclDataType_t,
    ) -> Result<(), AllReduceError> {
        self.check_live()?;
        let stream: sys::cudaStream_t = std::ptr::null_mut();
        // SAFETY: `ptr` points at `count` contiguous elements of `dtype` on this rank's device
        // (checked by the callers), the communicator is live, and the legacy default stream
        // (null) exists on every device.
        let outcome = unsafe {
            result::all_reduce(
                ptr,
                ptr,
                count,
                dtype,
                sys::ncclRedOp_t::ncclSum,
                self.raw as sys::ncclComm_t,
                stream,
            )
        };
        match outcome {
            Ok(_) => Ok(()),
            Err(_) if self.check_live().is_err() => Err(AllReduceError::Aborted),
            Err(e) => Err(AllReduceError::Nccl(format!(
                "ncclAllReduce on cuda:{} (rank {} of {}) failed: {}",
                self.device,
                self.rank,
                self.world,
                describe(&e)
            ))),
        }
    }
}

impl AllReduce for NcclAllReduce {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn sum_tensor(&mut self, buffer: &mut Tensor) -> Result<(), AllReduceError> {
        if buffer.device() != Device::Cuda(self.device)
            || buffer.kind() != Kind::Float
            || !buffer.is_contiguous()
        {
            return Err(AllReduceError::BadBuffer(format!(
                "expected a contiguous fp32 tensor on cuda:{}, found {:?} on {:?} (contiguous: {})",
                self.device,
                buffer.kind(),
                buffer.device(),
                buffer.is_contiguous()
            )));
        }
        self.all_reduce(
            buffer.data_ptr(),
            buffer.numel(),
            sys::ncclDataType_t::ncclFloat32,
        )
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError> {
        let on_device = Tensor::from_slice(values).to_device(Device::Cuda(self.device));
        self.all_reduce(
            on_device.data_ptr(),
            values.len(),
            sys::ncclDataType_t::ncclFloat64,
        )?;
        // The copy back waits for the collective (same stream).
        let back = Vec::<f64>::try_from(&on_device.to_device(Device::Cpu))
            .map_err(|e| AllReduceError::Nccl(format!("reading the summed statistics: {e}")))?;
        values.copy_from_slice(&back);
        Ok(())
    }
}

impl Drop for NcclAllReduce {
    fn drop(&mut self) {
        let mut c = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if !c.gone {
            c.gone = true;
            // SAFETY: the communicator is live and no collective of this rank is in flight
            // (the endpoint is being dropped by the thread that drove it).
            let _ = unsafe { result::comm_destroy(c.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_or_gpu_is_a_clear_error_not_a_panic() {
        // On the CPU build machines NCCL either cannot be loaded or has no GPU to use; both
        // must come back as an error naming what is wrong.
        if tch::Cuda::device_count() >= 2 {
            return; // a GPU box: the real group is exercised by the topology on CUDA
        }
        let err = match nccl_group(&[0, 1]) {
            Ok(_) => panic!("two-GPU NCCL group created without two GPUs"),
            Err(e) => e,
        };
        assert!(
            err.contains("NCCL") || err.contains("ncclCommInitAll"),
            "{err}"
        );
    }

    #[test]
    fn the_hint_names_the_wheel_copy_and_the_exact_commands() {
        let lib = Path::new("/opt/py/site-packages/nvidia/nccl/lib/libnccl.so.2");
        let hint = missing_nccl_hint(Some(lib));
        assert!(
            hint.contains("ln -sf /opt/py/site-packages/nvidia/nccl/lib/libnccl.so.2 ")
                && hint.contains("LD_LIBRARY_PATH=~/.local/lib/dflash-nccl"),
            "{hint}"
        );
        assert!(missing_nccl_hint(None).contains("install NCCL"));
        assert_eq!(
            wheel_nccl(Path::new("/opt/py/site-packages/torch/lib")),
            Path::new("/opt/py/site-packages/torch/lib/../../nvidia/nccl/lib/libnccl.so.2")
        );
    }
}
