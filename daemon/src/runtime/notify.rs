//! systemd readiness (`Type=notify`) through the `sd-notify` crate.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op. Ready is sent once the
//! control socket accepts connections, so `systemctl start` returns when a console can attach.
use sd_notify::NotifyState;

/// Whether the daemon was started by systemd with a notify socket.
pub fn under_systemd() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// Tells systemd startup is done, with a one-line status (shown by `systemctl status`).
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Updates the status line, e.g. "training step 9000, 12.8K tok/s".
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Tells systemd the daemon is shutting down on purpose (a checkpoint may take a while).
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(states: &[NotifyState<'_>]) {
    if !under_systemd() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        // Readiness is advisory here: systemd times the unit out if it never arrives.
        tracing::warn!(error = %e, "could not notify systemd");
    }
}
