//! The run is the operator's alone: everything `dflashd start` creates (run dir, journal,
//! metrics, recording, effective config, fingerprint, checkpoints with the drafter's weights,
//! log files) is created without group or other access, directories 0700 and files 0600.
//!
//! One process umask does it for every writer, ours and libtorch's alike, so no file can be
//! forgotten. A stricter umask the operator set is kept: bits are only ever added.
/// Group and other get nothing.
const PRIVATE_BITS: u32 = 0o077;

/// The umask that keeps `current`'s restrictions and adds [`PRIVATE_BITS`].
pub fn private_umask(current: u32) -> u32 {
    current | PRIVATE_BITS
}

/// Sets the process umask to [`private_umask`] of the current one; returns the new umask.
/// Call it before any file of the run is created (and before any thread is started, as the
/// umask is process-wide).
pub fn restrict_umask() -> u32 {
    // SAFETY: umask only swaps the process's file-mode mask; it cannot fail. Reading it means
    // setting it, so it is set twice, before the daemon starts any thread.
    let current = unsafe { libc::umask(0o077) } as u32;
    let wanted = private_umask(current);
    unsafe { libc::umask(wanted as libc::mode_t) };
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_umask_only_gains_bits() {
        assert_eq!(private_umask(0o022), 0o077);
        assert_eq!(private_umask(0o002), 0o077);
        // A stricter umask of the operator's stays as strict.
        assert_eq!(private_umask(0o277), 0o277);
        assert_eq!(private_umask(0o177), 0o177);
    }
}
