//! Finding and opening the NCCL that belongs to the libtorch this process runs on, and the few
//! NCCL entry points the all-reduce uses.
//!
//! Why not cudarc's loader: it opens NCCL by name (`libnccl.so`, `.so.13`, `.so.12`, …) and
//! cannot be given a path, while the torch wheel ships only `nvidia/nccl/lib/libnccl.so.2`.
//! Opening some other NCCL by name would also risk a second copy in the process beside the one
//! `libtorch_cuda.so` already maps. So the library is opened by its full path, in this order:
//!
//! 1. a `libnccl.so*` already mapped into this process (`libtorch_cuda.so` needs it, so on a
//!    CUDA wheel this is the wheel's copy): opening the same file again returns the same
//!    handle (the dynamic linker compares device and inode), so no second NCCL is loaded;
//! 2. the wheel's copy beside the loaded libtorch, `<site-packages>/nvidia/nccl/lib/libnccl.so.2`;
//! 3. `libnccl.so.2` through the dynamic linker's search path (a system NCCL beside a libtorch
//!    that is not the wheel).
//!
//! Opening NCCL and `ncclGetVersion` need no GPU, so this whole module runs on the CPU build
//! machines; the collectives themselves are only exercised on CUDA (see `nccl.rs`).
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// NCCL's `ncclComm_t`.
pub type RawComm = *mut c_void;
/// NCCL's `ncclResult_t` (`ncclSuccess` = 0).
pub type NcclResult = c_int;

/// `ncclDataType_t` values (`nccl.h`, stable since NCCL 2.0).
pub const NCCL_FLOAT32: c_int = 7;
pub const NCCL_FLOAT64: c_int = 8;
/// `ncclRedOp_t::ncclSum`.
pub const NCCL_SUM: c_int = 0;

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type GetErrorStringFn = unsafe extern "C" fn(NcclResult) -> *const c_char;
type CommInitAllFn = unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> NcclResult;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
type CommFn = unsafe extern "C" fn(RawComm) -> NcclResult;
type GetUniqueIdFn = unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult;
type CommInitRankFn = unsafe extern "C" fn(*mut RawComm, c_int, NcclUniqueId, c_int) -> NcclResult;
/// `ncclCommGetAsyncError(comm, &state)` (NCCL ≥ 2.4).
pub(super) type CommGetAsyncErrorFn = unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult;

/// `NCCL_UNIQUE_ID_BYTES` (`nccl.h`, 128 since NCCL 2.0).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// NCCL's `ncclUniqueId`: the bootstrap address rank 0 makes and every rank of one
/// communicator must pass to `ncclCommInitRank` (passed by value, as `nccl.h` declares it).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId {
    pub internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclUniqueId({})", hex::encode(&self.internal[..16]))
    }
}

impl NcclUniqueId {
    /// The id from the bytes another rank published; anything but 128 bytes is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let internal: [u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            format!(
                "an NCCL unique id is {NCCL_UNIQUE_ID_BYTES} bytes, this one is {}: every node \
                 must run the same dflashd build against the same NCCL",
                bytes.len()
            )
        })?;
        Ok(NcclUniqueId { internal })
    }
}

/// The opened NCCL: where it came from, its version, and its entry points. Lives for the whole
/// process (the library is never closed, so the function pointers stay valid).
pub struct NcclLib {
    pub path: PathBuf,
    /// `ncclGetVersion`'s code, e.g. 22809 for 2.28.9.
    pub version_code: i32,
    get_error_string: GetErrorStringFn,
    pub(super) comm_init_all: CommInitAllFn,
    get_unique_id: GetUniqueIdFn,
    pub(super) comm_init_rank: CommInitRankFn,
    pub(super) all_reduce: AllReduceFn,
    pub(super) comm_abort: CommFn,
    pub(super) comm_destroy: CommFn,
    /// Optional: an NCCL without it is still usable, and the watchdog (`nccl_watchdog.rs`)
    /// then aborts on the collective timeout alone.
    pub(super) comm_get_async_error: Option<CommGetAsyncErrorFn>,
    _lib: libloading::Library,
}

impl std::fmt::Debug for NcclLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLib")
            .field("path", &self.path)
            .field("version", &self.version())
            .finish()
    }
}

impl NcclLib {
    /// `major.minor.patch` of the loaded library.
    pub fn version(&self) -> String {
        version_text(self.version_code)
    }

    /// A fresh unique id (rank 0 of a cross-process communicator makes it). Needs no GPU:
    /// NCCL only picks its bootstrap network interface and listens on it.
    pub fn unique_id(&self) -> Result<NcclUniqueId, String> {
        let mut id = NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        // SAFETY: ncclGetUniqueId writes one ncclUniqueId.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        if rc != 0 {
            return Err(format!(
                "ncclGetUniqueId (NCCL {} from {}) failed: {}",
                self.version(),
                self.path.display(),
                self.error_string(rc)
            ));
        }
        Ok(id)
    }

    /// NCCL's own text for a result code.
    pub fn error_string(&self, code: NcclResult) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        unsafe {
            let ptr = (self.get_error_string)(code);
            if ptr.is_null() {
                format!("NCCL error {code}")
            } else {
                format!("{} (code {code})", CStr::from_ptr(ptr).to_string_lossy())
            }
        }
    }
}

/// NCCL's version code as text: `major*10000 + minor*100 + patch` since 2.9.
pub fn version_text(code: i32) -> String {
    format!("{}.{}.{}", code / 10_000, (code / 100) % 100, code % 100)
}

/// Where a library file is named by the search path rather than a full path.
const SONAME: &str = "libnccl.so.2";

/// Where the torch wheel keeps NCCL, from its `torch/lib` directory.
pub fn wheel_nccl(torch_lib: &Path) -> PathBuf {
    torch_lib.join("../../nvidia/nccl/lib").join(SONAME)
}

/// The candidates in the order they are tried (see the module comment), from the text of
/// `/proc/self/maps` and the loaded libtorch's directory. Pure.
pub fn candidates(maps: &str, torch_lib: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let is_nccl = Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "libnccl.so" || n.starts_with("libnccl.so."));
        if is_nccl && !out.iter().any(|p| p == Path::new(path)) {
            out.push(PathBuf::from(path));
        }
    }
    if let Some(dir) = torch_lib {
        out.push(wheel_nccl(dir));
    }
    out.push(PathBuf::from(SONAME));
    out
}

/// The process's NCCL, opened on first use; the error says what was tried and what to do.
pub fn nccl() -> Result<&'static NcclLib, String> {
    static LIB: OnceLock<Result<NcclLib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let torch_lib = crate::device::loaded_libtorch_dir();
        open_first(&candidates(&maps, torch_lib.as_deref()))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Opens the first candidate that exists and exports the NCCL entry points.
pub fn open_first(candidates: &[PathBuf]) -> Result<NcclLib, String> {
    let mut tried = Vec::new();
    for path in candidates {
        // A bare soname goes through the dynamic linker's search; a path must exist.
        if path.components().count() > 1 && !path.exists() {
            tried.push(format!("{} (no such file)", path.display()));
            continue;
        }
        match open(path) {
            Ok(lib) => return Ok(lib),
            Err(why) => tried.push(format!("{} ({why})", path.display())),
        }
    }
    Err(format!(
        "NCCL could not be opened; tried {}. A multi-GPU drafter group needs it: reinstall the \
         torch==2.11.0 wheel (`make provision`), which ships nvidia/nccl/lib/libnccl.so.2 \
         beside torch/lib, or install the system NCCL 2 package",
        tried.join(", ")
    ))
}

fn open(path: &Path) -> Result<NcclLib, String> {
    // SAFETY: NCCL's initialisers only register its own state; no Rust invariant depends on
    // them. The library is kept for the process's life (it sits in a static once opened).
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    fn sym<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, String> {
        // SAFETY: each name is looked up with the C signature `nccl.h` declares for it.
        unsafe { lib.get::<T>(name) }
            .map(|s| *s)
            .map_err(|e| format!("missing {}: {e}", String::from_utf8_lossy(name)))
    }
    let get_version: GetVersionFn = sym(&lib, b"ncclGetVersion")?;
    let mut code: c_int = 0;
    // SAFETY: ncclGetVersion writes one int; it needs no GPU.
    let rc = unsafe { get_version(&mut code) };
    if rc != 0 {
        return Err(format!("ncclGetVersion returned {rc}"));
    }
    // The path the file really is (a link in the wheel, or a soname resolved by the linker is
    // reported as given).
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    Ok(NcclLib {
        path,
        version_code: code,
        get_error_string: sym(&lib, b"ncclGetErrorString")?,
        comm_init_all: sym(&lib, b"ncclCommInitAll")?,
        get_unique_id: sym(&lib, b"ncclGetUniqueId")?,
        comm_init_rank: sym(&lib, b"ncclCommInitRank")?,
        all_reduce: sym(&lib, b"ncclAllReduce")?,
        comm_abort: sym(&lib, b"ncclCommAbort")?,
        comm_destroy: sym(&lib, b"ncclCommDestroy")?,
        comm_get_async_error: sym(&lib, b"ncclCommGetAsyncError").ok(),
        _lib: lib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nccl_already_mapped_comes_first_then_the_wheel_copy_then_the_soname() {
        let maps = "\
7f00-7f01 r-xp 00000000 08:01 42 /opt/py/site-packages/torch/lib/libtorch_cpu.so
7f02-7f03 r-xp 00000000 08:01 43 /opt/py/site-packages/nvidia/nccl/lib/libnccl.so.2
7f03-7f04 r--p 00100000 08:01 43 /opt/py/site-packages/nvidia/nccl/lib/libnccl.so.2
7f05-7f06 r-xp 00000000 08:01 44 /usr/lib/libncclx_extras.so
7f07-7f08 rw-p 00000000 00:00 0
";
        let torch_lib = Path::new("/opt/py/site-packages/torch/lib");
        assert_eq!(
            candidates(maps, Some(torch_lib)),
            vec![
                PathBuf::from("/opt/py/site-packages/nvidia/nccl/lib/libnccl.so.2"),
                PathBuf::from("/opt/py/site-packages/torch/lib/../../nvidia/nccl/lib/libnccl.so.2"),
                PathBuf::from("libnccl.so.2"),
            ]
        );
        assert_eq!(candidates("", None), vec![PathBuf::from("libnccl.so.2")]);
    }

    #[test]
    fn version_codes_read_as_major_minor_patch() {
        assert_eq!(version_text(22809), "2.28.9");
        assert_eq!(version_text(21803), "2.18.3");
    }

    #[test]
    fn nothing_to_open_is_an_error_naming_each_path_and_what_to_do() {
        let err =
            open_first(&[PathBuf::from("/nonexistent/nvidia/nccl/lib/libnccl.so.2")]).unwrap_err();
        assert!(
            err.contains("/nonexistent/nvidia/nccl/lib/libnccl.so.2 (no such file)")
                && err.contains("make provision"),
            "{err}"
        );
    }

    #[test]
    fn the_wheel_nccl_beside_this_libtorch_opens_without_a_gpu() {
        // The project's venv is a torch wheel with CUDA libraries; a libtorch without the
        // wheel's NCCL beside it has nothing to test here.
        let Some(torch_lib) = crate::device::loaded_libtorch_dir() else {
            panic!("libtorch is not mapped into the test process");
        };
        let wheel = wheel_nccl(&torch_lib);
        if !wheel.exists() {
            eprintln!("no wheel NCCL at {}: skipped", wheel.display());
            return;
        }
        let lib = nccl().unwrap();
        assert_eq!(lib.path, wheel.canonicalize().unwrap());
        assert!(lib.version().starts_with("2."), "{}", lib.version());
        assert!(
            lib.error_string(4).contains("invalid argument"),
            "{}",
            lib.error_string(4)
        );
        // The watchdog's poll: present in every NCCL since 2.4, so in the wheel's.
        assert!(lib.comm_get_async_error.is_some());
    }
}
