//! Resident memory of this process, read the way the Python reference reads it
//! (`benches/reference/benchutil.py`), so the two columns compare like with like.
//!
//! `VmHWM` in `/proc/self/status` is the peak resident set; writing `5` to
//! `/proc/self/clear_refs` resets it to the current RSS (Linux >= 4.0), which separates the
//! peak of the timed steps from the peak of loading.
use std::fs;

fn status_kb(field: &str) -> Option<f64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&status, field)
}

/// The value in kB of `field` in a `/proc/<pid>/status` text.
pub fn parse_status_kb(status: &str, field: &str) -> Option<f64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Current resident set in MiB.
pub fn rss_mb() -> Option<f64> {
    status_kb("VmRSS").map(|kb| kb / 1024.0)
}

/// Peak resident set in MiB (since start or the last [`reset_peak`]).
pub fn peak_rss_mb() -> Option<f64> {
    status_kb("VmHWM").map(|kb| kb / 1024.0)
}

/// Resets the peak to the current RSS; `false` where the kernel does not allow it.
pub fn reset_peak() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// glibc's mmap threshold while live memory is measured: every allocation of this size or more
/// gets its own mapping, which goes back to the kernel the moment it is freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const LIVE_MMAP_THRESHOLD: libc::c_int = 64 * 1024;

/// Makes the resident set follow live allocations from here on: pins glibc's mmap threshold
/// low (which also stops it from growing with the sizes freed so far) and hands free heap
/// pages back to the kernel. Without this the resident set keeps whatever the allocator
/// cached in earlier steps, and two processes that cached differently cannot be compared.
/// It lasts for the rest of the process and slows every large allocation (fresh pages fault
/// in), so it belongs to a last, untimed phase. `false` where the C library is not glibc.
pub fn follow_live_allocations() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: plain glibc tuning calls with valid arguments; no pointers involved.
        unsafe {
            let pinned = libc::mallopt(libc::M_MMAP_THRESHOLD, LIVE_MMAP_THRESHOLD) == 1;
            libc::malloc_trim(0);
            pinned
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// What glibc's allocator holds, from its own books (`mallinfo2`, every arena): unlike the
/// resident set, it tells a leak from fragmentation. A leak raises `in_use`; fragmentation
/// (free chunks stranded between live ones, arenas that grew and cannot shrink) raises
/// `free_in_arenas` and the resident set while `in_use` stays put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes handed out and not freed: heap chunks in use plus mmapped chunks.
    pub in_use: u64,
    /// Free bytes the arenas keep (candidates for `malloc_trim`, or stranded).
    pub free_in_arenas: u64,
    /// Of `in_use`, the bytes in chunks that have a mapping of their own.
    pub mapped: u64,
}

/// glibc's allocator statistics now; `None` where the C library is not glibc. Walks (and
/// briefly locks) every arena, so it is for between steps, not inside them.
pub fn heap_usage() -> Option<HeapUsage> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct by value.
        let info = unsafe { libc::mallinfo2() };
        Some(HeapUsage {
            in_use: (info.uordblks + info.hblkhd) as u64,
            free_in_arenas: info.fordblks as u64,
            mapped: info.hblkhd as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Hands every whole free page of glibc's heaps back to the kernel (`malloc_trim(0)`), so the
/// resident set then holds live allocations and the pages they share with free chunks, not
/// free chunks stranded between live ones. `false` where the C library is not glibc.
pub fn release_free_heap_pages() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a plain glibc call with a valid argument.
        unsafe { libc::malloc_trim(0) };
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Bytes the kernel says can be allocated without swapping (`MemAvailable`).
pub fn available_bytes() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    parse_status_kb(&meminfo, "MemAvailable").map(|kb| (kb * 1024.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_fields() {
        let text = "Name:\tdflashd\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(parse_status_kb(text, "VmHWM"), Some(204800.0));
        assert_eq!(parse_status_kb(text, "VmRSS"), Some(102400.0));
        assert_eq!(parse_status_kb(text, "VmSwap"), None);
        assert_eq!(parse_status_kb("VmHWMX: 1 kB", "VmHWM"), None);
    }

    #[test]
    fn the_peak_follows_a_large_allocation_and_can_be_reset() {
        let before = peak_rss_mb().expect("Linux /proc");
        let block = vec![1u8; 128 << 20];
        std::hint::black_box(&block);
        let during = peak_rss_mb().unwrap();
        assert!(
            during >= before + 100.0,
            "peak {before} -> {during} MiB after touching 128 MiB"
        );
        drop(block);
        if reset_peak() {
            let after = peak_rss_mb().unwrap();
            assert!(
                after < during,
                "reset peak {after} should drop below {during}"
            );
        }
    }
}
