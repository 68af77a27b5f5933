//! The rendezvous: libtorch's own `c10d::TCPStore` (the store torchrun's static rendezvous and
//! `torch.distributed` use), through the C++ shim `csrc/c10d_store.cpp`.
//!
//! Rank 0 serves it ([`TcpStore::serve`]); every other rank connects ([`TcpStore::connect`]).
//! Keys hold bytes. Every wait takes its own timeout, never an infinite one: a key no rank sets
//! is [`StoreError::Timeout`] naming the key, not a hang.
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;
use std::time::Duration;

/// The shim's opaque store handle.
pub(crate) type RawStore = c_void;

const ERR_LEN: usize = 1024;
const RC_TIMEOUT: c_int = 2;

unsafe extern "C" {
    fn dflash_c10d_tcp_store_new(
        host: *const c_char,
        port: u16,
        world_size: usize,
        is_master: c_int,
        timeout_ms: i64,
        out: *mut *mut RawStore,
        bound_port: *mut u16,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_store_free(store: *mut RawStore);
    fn dflash_c10d_store_set(
        store: *mut RawStore,
        key: *const c_char,
        value: *const u8,
        len: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_store_get(
        store: *mut RawStore,
        key: *const c_char,
        timeout_ms: i64,
        out: *mut *mut u8,
        out_len: *mut usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_bytes_free(bytes: *mut u8);
    fn dflash_c10d_store_wait(
        store: *mut RawStore,
        keys: *const *const c_char,
        n: usize,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_store_add(
        store: *mut RawStore,
        key: *const c_char,
        delta: i64,
        out: *mut i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn dflash_c10d_store_check(
        store: *mut RawStore,
        keys: *const *const c_char,
        n: usize,
        out: *mut c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("rendezvous store {op} of {keys:?} timed out after {} ms: no rank set {}; check that every node started and reaches the rendezvous ({detail})", after.as_millis(), if keys.len() == 1 { "it" } else { "them all" })]
    Timeout {
        op: &'static str,
        keys: Vec<String>,
        after: Duration,
        detail: String,
    },
    #[error("rendezvous store at {addr}: {detail}")]
    Failed { addr: String, detail: String },
    #[error("rendezvous store: {0}")]
    BadInput(String),
}

/// One rank's connection to the job's TCPStore (the server itself on rank 0).
pub struct TcpStore {
    raw: NonNull<RawStore>,
    host: String,
    port: u16,
}

// SAFETY: c10d::TCPStore serialises its operations with its own lock (`activeOpLock_`) and may
// be used from any thread; the handle is freed only by `Drop`.
unsafe impl Send for TcpStore {}
unsafe impl Sync for TcpStore {}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpStore({}:{})", self.host, self.port)
    }
}

fn millis(timeout: Duration) -> Result<i64, StoreError> {
    let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    if ms <= 0 {
        return Err(StoreError::BadInput(format!(
            "a timeout of {timeout:?} is not allowed: give at least 1 ms (there is no infinite wait)"
        )));
    }
    Ok(ms)
}

fn c_text(what: &str, text: &str) -> Result<CString, StoreError> {
    CString::new(text)
        .map_err(|_| StoreError::BadInput(format!("{what} {text:?} contains a NUL byte")))
}

/// The shim's message, NUL-terminated within `err`.
fn message(err: &[c_char; ERR_LEN]) -> String {
    // SAFETY: the shim NUL-terminates within the buffer, which starts zeroed.
    unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl TcpStore {
    /// Rank 0: serves the store on `host:port` (port 0: a free port, see [`Self::port`]) for
    /// `world_size` ranks. Returns once bound; the ranks join later.
    pub fn serve(
        host: &str,
        port: u16,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::open(host, port, world_size, true, timeout)
    }

    /// Every other rank: connects to rank 0's store, retrying until `timeout`.
    pub fn connect(
        host: &str,
        port: u16,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        if port == 0 {
            return Err(StoreError::BadInput(format!(
                "connecting to {host}:0: give the port rank 0's store listens on"
            )));
        }
        Self::open(host, port, world_size, false, timeout)
    }

    fn open(
        host: &str,
        port: u16,
        world_size: usize,
        is_master: bool,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        if world_size == 0 {
            return Err(StoreError::BadInput("a world of 0 ranks".into()));
        }
        let c_host = c_text("host", host)?;
        let ms = millis(timeout)?;
        let mut raw = std::ptr::null_mut();
        let mut bound = 0u16;
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: every pointer is valid for the call; the shim catches every C++ exception.
        let rc = unsafe {
            dflash_c10d_tcp_store_new(
                c_host.as_ptr(),
                port,
                world_size,
                c_int::from(is_master),
                ms,
                &mut raw,
                &mut bound,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        let addr = format!("{host}:{port}");
        match NonNull::new(raw) {
            Some(raw) if rc == 0 => Ok(TcpStore {
                raw,
                host: host.to_string(),
                port: bound,
            }),
            _ => Err(StoreError::Failed {
                addr,
                detail: message(&err),
            }),
        }
    }

    /// The port the store listens on (rank 0's bound port when it was given 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn raw(&self) -> *mut RawStore {
        self.raw.as_ptr()
    }

    fn check_rc(&self, rc: c_int, err: &[c_char; ERR_LEN]) -> Result<(), StoreError> {
        if rc == 0 {
            return Ok(());
        }
        Err(StoreError::Failed {
            addr: format!("{}:{}", self.host, self.port),
            detail: message(err),
        })
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let c_key = c_text("key", key)?;
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: `value` is valid for `len` bytes; the store handle is live.
        let rc = unsafe {
            dflash_c10d_store_set(
                self.raw(),
                c_key.as_ptr(),
                value.as_ptr(),
                value.len(),
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        self.check_rc(rc, &err)
    }

    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let c_key = c_text("key", key)?;
        let ms = millis(timeout)?;
        let (mut out, mut len) = (std::ptr::null_mut(), 0usize);
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: the out pointers are valid; on success the shim hands over a malloc'd buffer
        // of `len` bytes, freed below with the shim's own free.
        let rc = unsafe {
            dflash_c10d_store_get(
                self.raw(),
                c_key.as_ptr(),
                ms,
                &mut out,
                &mut len,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc == RC_TIMEOUT {
            return Err(StoreError::Timeout {
                op: "get",
                keys: vec![key.to_string()],
                after: timeout,
                detail: message(&err),
            });
        }
        self.check_rc(rc, &err)?;
        // SAFETY: rc 0 means `out` holds `len` initialised bytes.
        let value = unsafe { std::slice::from_raw_parts(out, len) }.to_vec();
        // SAFETY: `out` came from the shim's malloc and is freed once.
        unsafe { dflash_c10d_bytes_free(out) };
        Ok(value)
    }

    /// Waits up to `timeout` until every key of `keys` is set.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let c_keys = keys
            .iter()
            .map(|k| c_text("key", k))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<*const c_char> = c_keys.iter().map(|k| k.as_ptr()).collect();
        let ms = millis(timeout)?;
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: `ptrs` holds `n` live C strings.
        let rc = unsafe {
            dflash_c10d_store_wait(
                self.raw(),
                ptrs.as_ptr(),
                ptrs.len(),
                ms,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc == RC_TIMEOUT {
            return Err(StoreError::Timeout {
                op: "wait",
                keys: keys.iter().map(|k| k.to_string()).collect(),
                after: timeout,
                detail: message(&err),
            });
        }
        self.check_rc(rc, &err)
    }

    /// Adds `delta` to the counter `key` (0 when unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let c_key = c_text("key", key)?;
        let mut out = 0i64;
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: valid pointers; live handle.
        let rc = unsafe {
            dflash_c10d_store_add(
                self.raw(),
                c_key.as_ptr(),
                delta,
                &mut out,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        self.check_rc(rc, &err)?;
        Ok(out)
    }

    /// Whether every key of `keys` is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let c_keys = keys
            .iter()
            .map(|k| c_text("key", k))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<*const c_char> = c_keys.iter().map(|k| k.as_ptr()).collect();
        let mut out: c_int = 0;
        let mut err = [0 as c_char; ERR_LEN];
        // SAFETY: `ptrs` holds `n` live C strings.
        let rc = unsafe {
            dflash_c10d_store_check(
                self.raw(),
                ptrs.as_ptr(),
                ptrs.len(),
                &mut out,
                err.as_mut_ptr(),
                ERR_LEN,
            )
        };
        self.check_rc(rc, &err)?;
        Ok(out != 0)
    }
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        // SAFETY: the handle is live and freed once; a process group joined through it keeps
        // its own reference to the C++ store.
        unsafe { dflash_c10d_store_free(self.raw()) };
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
