//! The Prometheus exporter: `/metrics` over HTTP, read from the run's [`RunHandle`] like the
//! control socket's `status`. [`exposition`] turns one reading into the text format (pure);
//! [`server`] is the HTTP listener on the daemon's tokio runtime. Off unless `metrics.listen`
//! or `--metrics-listen` names an address; `runtime/guard_rails.rs` binds it.
//!
//! [`RunHandle`]: crate::run::handle::RunHandle
pub mod exposition;
pub mod server;

pub use server::{ExporterError, MetricsServer};

use std::net::SocketAddr;

use dflash_shared::events::Severity;

/// The journal line that says where `/metrics` is served, a warning when other machines can
/// reach it: the endpoint has no authentication, and serves the run's name, figures, GPUs and
/// environment fingerprint.
pub fn listening_note(local: SocketAddr) -> (Severity, String) {
    let url = format!("http://{local}/metrics");
    if local.ip().is_loopback() {
        (
            Severity::Info,
            format!("Prometheus metrics served at {url} (this machine only)"),
        )
    } else {
        (
            Severity::Warn,
            format!(
                "Prometheus metrics served at {url}, beyond loopback: anyone who can reach that \
                 address reads this run's name, figures, GPUs and environment, without \
                 authentication"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_beyond_loopback_is_journaled_as_a_warning_saying_what_it_exposes() {
        let (severity, text) = listening_note("127.0.0.1:9464".parse().unwrap());
        assert_eq!(severity, Severity::Info);
        assert_eq!(
            text,
            "Prometheus metrics served at http://127.0.0.1:9464/metrics (this machine only)"
        );
        assert_eq!(
            listening_note("[::1]:9464".parse().unwrap()).0,
            Severity::Info
        );
        // Only parsed, never bound: the tests use loopback addresses alone.
        let (severity, text) = listening_note("0.0.0.0:9464".parse().unwrap());
        assert_eq!(severity, Severity::Warn);
        assert!(
            text.contains("http://0.0.0.0:9464/metrics, beyond loopback"),
            "{text}"
        );
        assert!(text.contains("without authentication"), "{text}");
    }
}
