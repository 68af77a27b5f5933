//! The Gloo shim's C API (`csrc/c10d_gloo.cpp`), in a build with gloo's headers.
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use super::{GlooTransport, Outcome, TcpStore};
use crate::dist::store::RawStore;

const ERR_LEN: usize = 2048;
const RC_TIMEOUT: c_int = 2;
const RC_ABORTED: c_int = 3;

unsafe extern "C" {
    fn dflash_c10d_gloo_new(
        store: *mut RawStore,
        prefix: *const c_char,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        hostname: *const c_char,
        interface: *const c_char,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_gloo_allreduce_sum(
        handle: *mut c_void,
        tensor: *mut c_void,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_gloo_abort(handle: *mut c_void);
    fn dflash_c10d_gloo_free(handle: *mut c_void);
}

pub struct Handle(NonNull<c_void>);

// SAFETY: ProcessGroupGloo queues work under its own lock and may be called from any thread;
// the shim's abort touches only its own mutex-guarded state. Freed once, by `Drop`.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

fn message(err: &[c_char]) -> String {
    // SAFETY: the shim NUL-terminates within the buffer, which starts zeroed.
    unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn positive_millis(timeout: Duration) -> Result<i64, String> {
    match i64::try_from(timeout.as_millis()) {
        Ok(ms) if ms > 0 => Ok(ms),
        Ok(_) => Err(format!(
            "a timeout of {timeout:?} is not allowed: give at least 1 ms (there is no infinite wait)"
        )),
        Err(_) => Ok(i64::MAX),
    }
}

impl Handle {
    pub fn join(
        store: &TcpStore,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
        transport: &GlooTransport,
    ) -> Result<Self, String> {
        let text = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"));
        let c_prefix = text(prefix)?;
        let (hostname, interface) = match transport {
            GlooTransport::Hostname(h) => (Some(text(h)?), None),
            GlooTransport::Interface(i) => (None, Some(text(i)?)),
            GlooTransport::Default => (None, None),
        };
        let ptr_of = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let ms = positive_millis(timeout)?;
        let rank_c = c_int::try_from(rank).map_err(|_| format!("rank {rank} is too large"))?;
        let world_c = c_int::try_from(world).map_err(|_| format!("world {world} is too large"))?;
        let mut out = std::ptr::null_mut();
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: the store handle is live for the call (the group keeps its own reference to
        // the C++ store); the strings outlive the call; the shim catches every C++ exception.
        let rc = unsafe {
            dflash_c10d_gloo_new(
                store.raw(),
                c_prefix.as_ptr(),
                rank_c,
                world_c,
                ms,
                ptr_of(&hostname),
                ptr_of(&interface),
                &mut out,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        match NonNull::new(out) {
            Some(handle) if rc == 0 => Ok(Handle(handle)),
            _ => Err(format!(
                "rank {rank} of {world} through the store at {}:{} within {} ms: {}",
                store.host(),
                store.port(),
                ms,
                message(&err)
            )),
        }
    }

    pub fn all_reduce_sum(
        &self,
        tensor: &mut tch::Tensor,
        timeout: Duration,
    ) -> Result<(), Outcome> {
        let ms = positive_millis(timeout).map_err(Outcome::Failed)?;
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: tch's C_tensor is a `torch::Tensor*` (torch-sys's torch_api.h), which the shim
        // reads as `at::Tensor*` and copies (sharing the storage, so an abandoned collective
        // keeps the buffer alive); the handle is live.
        let rc = unsafe {
            dflash_c10d_gloo_allreduce_sum(
                self.0.as_ptr(),
                tensor.as_mut_ptr().cast(),
                ms,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        match rc {
            0 => Ok(()),
            RC_ABORTED => Err(Outcome::Aborted),
            RC_TIMEOUT => Err(Outcome::TimedOut(message(&err))),
            _ => Err(Outcome::Failed(message(&err))),
        }
    }

    pub fn abort(&self) {
        // SAFETY: the handle is live; abort is safe from any thread.
        unsafe { dflash_c10d_gloo_abort(self.0.as_ptr()) }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: freed once; waits at most for gloo's own timeout of an abandoned collective.
        unsafe { dflash_c10d_gloo_free(self.0.as_ptr()) }
    }
}
