//! SIGINT/SIGTERM: the first one asks the run loop to checkpoint and exit 0 between steps; a
//! second SIGINT (Ctrl-C twice) kills at once, as users expect from a foreground program.
use std::sync::atomic::{AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::SeqCst);
    // SAFETY: restoring the default disposition is async-signal-safe and has no preconditions.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
    }
}

/// Installs the handlers. The handler only stores to an atomic (async-signal-safe).
pub fn install() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installing a handler that only touches an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// The stop signal received so far, if any (it stays set).
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// "SIGTERM", "SIGINT", or the number.
pub fn name(signal: i32) -> String {
    match signal {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        other => format!("signal {other}"),
    }
}
