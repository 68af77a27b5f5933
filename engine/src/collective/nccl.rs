//! The CUDA all-reduce: NCCL opened at run time from the torch wheel's own copy
//! ([`super::nccl_lib`]), so nothing here needs CUDA to build or to run on a CPU machine.
//!
//! One communicator per drafter GPU, created together with `ncclCommInitAll` in this process;
//! each drafter worker thread then drives its own communicator. Collectives are enqueued on
//! libtorch's *current* stream for the device on the calling thread (read through the C++ shim
//! `csrc/cuda_stream.cpp`), the stream the backward that produced the gradients ran on and the
//! optimizer that reads them will run on: ordered without a host synchronisation, and still
//! right if a caller ever computes on a side stream (which a hard-coded legacy NULL stream is
//! not, and which CUDA graph capture needs).
//!
//! A cross-process endpoint ([`nccl_rank_endpoint`]) waits for each of its collectives on the
//! host under a watchdog ([`super::nccl_watchdog`]) that polls `ncclCommGetAsyncError` and
//! calls `ncclCommAbort` on an asynchronous error or at the collective timeout.
//!
//! NOT TESTED ON A GPU: the machines this was written on have none. Opening NCCL and reading
//! its version are tested here, and the watchdog's decision; the collectives, the stream
//! lookup, the watchdog's polls and its abort only run on CUDA and have never run. The CPU
//! all-reduce ([`super::allreduce::CpuAllReduce`]) is what the tests exercise.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use super::allreduce::{AbortGroup, AllReduce, AllReduceError};
use super::nccl_lib::{self, NcclLib, NcclResult, RawComm, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM};
use super::nccl_watchdog::{AbortReason, AsyncPoll, Watchdog, Watched};

pub use super::nccl_lib::wheel_nccl;

/// The NCCL this process uses, as `dflashd doctor` prints it: `NCCL 2.28.9 from PATH`, or why
/// it cannot be opened (which names every path tried and what to do).
pub fn nccl_status() -> Result<String, String> {
    let lib = nccl_lib::nccl()?;
    Ok(format!(
        "NCCL {} from {}",
        lib.version(),
        lib.path.display()
    ))
}

/// libtorch's current CUDA stream for `device` on this thread (`cudaStream_t`; null is the
/// legacy default stream).
pub fn current_cuda_stream(device: usize) -> Result<*mut std::ffi::c_void, String> {
    current_stream_impl(device)
}

#[cfg(dflash_cuda_stream_shim)]
fn current_stream_impl(device: usize) -> Result<*mut std::ffi::c_void, String> {
    unsafe extern "C" {
        fn dflash_current_cuda_stream(
            device: std::ffi::c_int,
            out: *mut *mut std::ffi::c_void,
            err: *mut std::ffi::c_char,
            err_len: usize,
        ) -> std::ffi::c_int;
    }
    let mut stream = std::ptr::null_mut();
    let mut err = [0 as std::ffi::c_char; 512];
    let index = i32::try_from(device).map_err(|_| format!("cuda:{device} is out of range"))?;
    // SAFETY: `stream` and `err` are valid for writes of the sizes passed; the shim catches
    // every C++ exception.
    let rc = unsafe { dflash_current_cuda_stream(index, &mut stream, err.as_mut_ptr(), err.len()) };
    if rc == 0 {
        return Ok(stream);
    }
    // SAFETY: the shim NUL-terminates the message within `err`.
    let text = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
    Err(format!(
        "libtorch's current CUDA stream for cuda:{device}: {}",
        text.to_string_lossy()
    ))
}

#[cfg(not(dflash_cuda_stream_shim))]
fn current_stream_impl(device: usize) -> Result<*mut std::ffi::c_void, String> {
    Err(format!(
        "libtorch's current CUDA stream for cuda:{device}: this build has no CUDA stream shim \
         (built against a libtorch without libc10_cuda.so or the wheel's CUDA headers); \
         rebuild against the torch==2.11.0 CUDA wheel"
    ))
}

/// A communicator shared by its rank's endpoint and the group's abort handle.
struct Comm {
    raw: RawComm,
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
    lib: &'static NcclLib,
    /// A cross-process endpoint's watchdog ([`super::nccl_watchdog`]): each collective is
    /// then waited for on the host, under it. `None` for the in-process group, whose ranks
    /// fail together through the tripwire.
    watchdog: Option<Watchdog>,
}

/// The watchdog's view of one communicator: `ncclCommGetAsyncError` and `ncclCommAbort`
/// under the communicator's lock, nothing once it is gone. NOT RUN ON A GPU.
struct CommWatch {
    comm: SharedComm,
    lib: &'static NcclLib,
}

impl Watched for CommWatch {
    fn poll(&self) -> Option<AsyncPoll> {
        let c = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if c.gone {
            return None;
        }
        let Some(get_async_error) = self.lib.comm_get_async_error else {
            return Some(AsyncPoll::Unavailable);
        };
        let mut state: NcclResult = 0;
        // SAFETY: the communicator is live (not gone, under its lock); NCCL documents the
        // query as safe while a collective of it is in flight on another thread.
        let rc = unsafe { get_async_error(c.raw, &mut state) };
        Some(if rc == 0 {
            AsyncPoll::State(state)
        } else {
            AsyncPoll::QueryFailed(rc)
        })
    }

    fn abort(&self) {
        let mut c = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if !c.gone {
            c.gone = true;
            // SAFETY: the communicator is live; ncclCommAbort is NCCL's way to end a
            // collective blocked on a peer, from any thread.
            let _ = unsafe { (self.lib.comm_abort)(c.raw) };
        }
    }
}

/// Aborts every communicator of a group.
pub struct NcclGroup {
    comms: Vec<SharedComm>,
    lib: &'static NcclLib,
}

impl AbortGroup for NcclGroup {
    fn abort(&self) {
        for comm in &self.comms {
            let mut c = comm.lock().unwrap_or_else(|p| p.into_inner());
            if !c.gone {
                c.gone = true;
                // SAFETY: the communicator is live (not yet aborted or destroyed).
                let _ = unsafe { (self.lib.comm_abort)(c.raw) };
            }
        }
    }
}

/// Creates one communicator per device in `devices` (CUDA indices, one rank each, in order).
pub fn nccl_group(devices: &[usize]) -> Result<(Arc<NcclGroup>, Vec<NcclAllReduce>), String> {
    let lib = nccl_lib::nccl()?;
    let n = devices.len();
    let ordinals: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
    let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); n];
    // SAFETY: `raw` has room for `n` communicators and `ordinals` names `n` devices.
    let rc = unsafe { (lib.comm_init_all)(raw.as_mut_ptr(), n as i32, ordinals.as_ptr()) };
    if rc != 0 {
        return Err(format!(
            "ncclCommInitAll over cuda devices {devices:?} (NCCL {} from {}) failed: {}",
            lib.version(),
            lib.path.display(),
            lib.error_string(rc)
        ));
    }
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
            lib,
            watchdog: None,
        })
        .collect();
    Ok((Arc::new(NcclGroup { comms, lib }), endpoints))
}

/// This process's rank of a communicator that spans processes: `ncclCommInitRank` on
/// `cuda:device` with the unique id rank 0 made (published through the rendezvous store,
/// `dist::nccl_id`). Every rank of the `world` must call it; NCCL's bootstrap joins them.
///
/// Every collective of the endpoint is watched ([`super::nccl_watchdog`]): waited for on the
/// host, and aborted (`ncclCommAbort`) on an asynchronous error NCCL reports or once
/// `timeout` (the collective timeout) has passed.
///
/// NOT TESTED ON A GPU: neither the init, the collectives, the watchdog's polls nor its abort
/// have ever run. A peer that dies inside the init itself is not bounded here (the caller's
/// store barrier just before bounds a peer that never came); NCCL's non-blocking init
/// (`ncclCommInitRankConfig` with `blocking = 0`, polled with a deadline) is the next step.
pub fn nccl_rank_endpoint(
    id: &nccl_lib::NcclUniqueId,
    rank: usize,
    world: usize,
    device: usize,
    timeout: Duration,
) -> Result<(Arc<NcclGroup>, NcclAllReduce), String> {
    let lib = nccl_lib::nccl()?;
    let (rank_c, world_c) = match (i32::try_from(rank), i32::try_from(world)) {
        (Ok(r), Ok(w)) if r < w => (r, w),
        _ => {
            return Err(format!(
                "rank {rank} of a world of {world} is not a valid NCCL rank"
            ))
        }
    };
    set_current_cuda_device(device)?;
    let mut raw: RawComm = std::ptr::null_mut();
    // SAFETY: `raw` has room for one communicator; the id is passed by value as nccl.h declares.
    let rc = unsafe { (lib.comm_init_rank)(&mut raw, world_c, *id, rank_c) };
    if rc != 0 {
        return Err(format!(
            "ncclCommInitRank as rank {rank} of {world} on cuda:{device} (NCCL {} from {}) \
             failed: {}",
            lib.version(),
            lib.path.display(),
            lib.error_string(rc)
        ));
    }
    let comm = Arc::new(Mutex::new(Comm { raw, gone: false }));
    let watched = CommWatch {
        comm: Arc::clone(&comm),
        lib,
    };
    let watchdog = match Watchdog::start(watched, timeout) {
        Ok(w) => w,
        Err(e) => {
            // SAFETY: the communicator was just created and nothing else holds it yet.
            let _ = unsafe { (lib.comm_destroy)(raw) };
            return Err(e);
        }
    };
    let endpoint = NcclAllReduce {
        comm: Arc::clone(&comm),
        raw: raw as usize,
        rank,
        world,
        device,
        lib,
        watchdog: Some(watchdog),
    };
    Ok((
        Arc::new(NcclGroup {
            comms: vec![comm],
            lib,
        }),
        endpoint,
    ))
}

/// Makes `cuda:device` the calling thread's current device (NCCL's init binds to it).
fn set_current_cuda_device(device: usize) -> Result<(), String> {
    #[cfg(dflash_cuda_stream_shim)]
    {
        unsafe extern "C" {
            fn dflash_set_current_cuda_device(
                device: std::ffi::c_int,
                err: *mut std::ffi::c_char,
                err_len: usize,
            ) -> std::ffi::c_int;
        }
        let index = i32::try_from(device).map_err(|_| format!("cuda:{device} is out of range"))?;
        let mut err = [0 as std::ffi::c_char; 512];
        // SAFETY: `err` is valid for its length; the shim catches every C++ exception.
        let rc = unsafe { dflash_set_current_cuda_device(index, err.as_mut_ptr(), err.len()) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the shim NUL-terminates within `err`.
        let text = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
        Err(format!(
            "making cuda:{device} current for NCCL: {}",
            text.to_string_lossy()
        ))
    }
    #[cfg(not(dflash_cuda_stream_shim))]
    Err(format!(
        "making cuda:{device} current for NCCL: this build has no CUDA shim (built against a \
         libtorch without libc10_cuda.so); rebuild against the torch==2.11.0 CUDA wheel"
    ))
}

impl NcclAllReduce {
    fn check_live(&self) -> Result<(), AllReduceError> {
        if self.comm.lock().unwrap_or_else(|p| p.into_inner()).gone {
            return Err(AllReduceError::Aborted);
        }
        Ok(())
    }

    /// What the watchdog's abort reads as.
    fn watchdog_error(&self, why: AbortReason) -> AllReduceError {
        let what = |detail: String| {
            AllReduceError::Nccl(format!(
                "rank {} of {} on cuda:{}: {detail}; the watchdog aborted the communicator \
                 (ncclCommAbort)",
                self.rank, self.world, self.device
            ))
        };
        match why {
            AbortReason::Timeout { after } => AllReduceError::Timeout {
                rank: self.rank,
                world: self.world,
                after,
                detail: "NCCL reported no error; the watchdog aborted the communicator \
                         (ncclCommAbort)"
                    .into(),
            },
            AbortReason::AsyncError(code) => what(format!(
                "NCCL reported an asynchronous error, {} (a peer's connection failed, or NCCL \
                 itself did)",
                self.lib.error_string(code)
            )),
            AbortReason::QueryFailed(code) => what(format!(
                "ncclCommGetAsyncError failed, {}",
                self.lib.error_string(code)
            )),
        }
    }

    /// A watched endpoint's wait for its collective: the host blocks until the device is
    /// done, while the watchdog may abort the communicator (which ends the kernel and so the
    /// wait). A CUDA error out of the wait reads as an NCCL failure, never a panic.
    fn wait_watched(&self, watchdog: &Watchdog) -> Result<(), AllReduceError> {
        let device = self.device as i64;
        let waited = std::panic::catch_unwind(|| tch::Cuda::synchronize(device));
        watchdog.end().map_err(|why| self.watchdog_error(why))?;
        self.check_live()?;
        waited.map_err(|p| {
            AllReduceError::Nccl(format!(
                "waiting for the all-reduce on cuda:{}: {}",
                self.device,
                crate::device::torch_panic::panic_text(p.as_ref())
            ))
        })
    }

    /// In-place sum of `count` elements of `dtype` at `ptr` (device memory of this rank),
    /// enqueued on libtorch's current stream for this rank's device; a watched endpoint then
    /// waits for it under its watchdog.
    fn all_reduce(
        &self,
        ptr: *mut std::ffi::c_void,
        count: usize,
        dtype: std::ffi::c_int,
    ) -> Result<(), AllReduceError> {
        self.check_live()?;
        let stream = current_cuda_stream(self.device).map_err(AllReduceError::Nccl)?;
        if let Some(dog) = &self.watchdog {
            dog.begin().map_err(|why| self.watchdog_error(why))?;
        }
        let enqueued = self.enqueue(ptr, count, dtype, stream);
        match (&self.watchdog, enqueued) {
            (Some(dog), Ok(())) => self.wait_watched(dog),
            (Some(dog), Err(e)) => {
                let _ = dog.end();
                Err(e)
            }
            (None, outcome) => outcome,
        }
    }

    fn enqueue(
        &self,
        ptr: *mut std::ffi::c_void,
        count: usize,
        dtype: std::ffi::c_int,
        stream: *mut std::ffi::c_void,
    ) -> Result<(), AllReduceError> {
        // SAFETY: `ptr` points at `count` contiguous elements of `dtype` on this rank's device
        // (checked by the callers), the communicator is live, and `stream` is a live stream of
        // this device (libtorch's own).
        let rc: NcclResult = unsafe {
            (self.lib.all_reduce)(
                ptr,
                ptr,
                count,
                dtype,
                NCCL_SUM,
                self.raw as RawComm,
                stream,
            )
        };
        match rc {
            0 => Ok(()),
            _ if self.check_live().is_err() => Err(AllReduceError::Aborted),
            code => Err(AllReduceError::Nccl(format!(
                "ncclAllReduce on cuda:{} (rank {} of {}) failed: {}",
                self.device,
                self.rank,
                self.world,
                self.lib.error_string(code)
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
        self.all_reduce(buffer.data_ptr(), buffer.numel(), NCCL_FLOAT32)
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError> {
        let on_device = Tensor::from_slice(values).to_device(Device::Cuda(self.device));
        self.all_reduce(on_device.data_ptr(), values.len(), NCCL_FLOAT64)?;
        // The copy back waits for the collective: both are on libtorch's current stream.
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
            let _ = unsafe { (self.lib.comm_destroy)(c.raw) };
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
    fn doctor_s_line_names_the_version_and_the_file_or_what_is_missing() {
        match nccl_status() {
            Ok(line) => assert!(
                line.starts_with("NCCL 2.") && line.contains(" from /") && line.contains("libnccl"),
                "{line}"
            ),
            Err(why) => assert!(
                why.contains("tried") && why.contains("make provision"),
                "{why}"
            ),
        }
    }

    #[test]
    fn a_cross_process_rank_without_its_gpu_is_an_error_naming_rank_and_device() {
        let missing = tch::Cuda::device_count() as usize;
        let id = nccl_lib::NcclUniqueId {
            internal: [0; nccl_lib::NCCL_UNIQUE_ID_BYTES],
        };
        let err = match nccl_rank_endpoint(&id, 0, 2, missing, Duration::from_secs(5)) {
            Ok(_) => panic!("an NCCL rank on a missing cuda:{missing}"),
            Err(e) => e,
        };
        assert!(
            err.contains(&format!("cuda:{missing}")) || err.contains("NCCL could not be opened"),
            "{err}"
        );
        let err = nccl_rank_endpoint(&id, 2, 2, 0, Duration::from_secs(5))
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("rank 2 of a world of 2") || err.contains("NCCL could not be opened"),
            "{err}"
        );
    }

    #[test]
    fn the_current_stream_of_a_missing_gpu_is_an_error_not_a_crash() {
        let missing = tch::Cuda::device_count() as usize;
        let err = current_cuda_stream(missing).unwrap_err();
        assert!(err.contains(&format!("cuda:{missing}")), "{err}");
    }
}
