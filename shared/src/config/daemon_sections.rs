//! The daemon-side sections: queue, telemetry, control plane, detectors, the metrics endpoint,
//! TensorBoard output, and how the nodes of a multi-node job watch each other.
use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::bytesize::ByteSize;
use crate::run_dir::{TENSORBOARD_DIR_NAME, WARMUP_FILE_NAME};

/// `[queue]`: the bounded hidden-state queue between target and drafter workers.
///
/// Producers block when the depth reaches `high_watermark` or the resident bytes reach
/// `byte_cap`, and resume once the depth is back at `low_watermark`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueSection {
    /// Hard maximum of items (batches of hidden states) in flight.
    pub capacity: usize,
    pub high_watermark: usize,
    pub low_watermark: usize,
    pub byte_cap: ByteSize,
}

impl Default for QueueSection {
    fn default() -> Self {
        Self {
            capacity: 16,
            high_watermark: 12,
            low_watermark: 4,
            byte_cap: ByteSize::gib(16),
        }
    }
}

/// One compile/kernel cache directory to watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheDirConfig {
    pub name: String,
    /// A path template: `~/`, `${VAR}`, `${VAR:-default}` and `{run_dir}` are expanded by
    /// [`super::paths::expand_path`].
    pub path: String,
}

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySection {
    /// GPU, host, queue and cache sampling period.
    pub sample_interval_ms: u64,
    /// Python whose packages go into the environment fingerprint. Unset: the interpreter of
    /// the environment libtorch was loaded from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    pub caches: Vec<CacheDirConfig>,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        Self {
            sample_interval_ms: 1000,
            python: None,
            caches: default_caches(),
        }
    }
}

/// The caches watched by default, with the locations their owners use when the override
/// variable is unset: TorchInductor `<tmp>/torchinductor_<user>`, Triton `~/.triton/cache`,
/// CUDA's JIT ComputeCache `~/.nv/ComputeCache`, and dflashd's own warmup record.
pub fn default_caches() -> Vec<CacheDirConfig> {
    let warmup = format!("{{run_dir}}/{WARMUP_FILE_NAME}");
    [
        (
            "torchinductor",
            "${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/torchinductor_${USER}}",
        ),
        ("triton", "${TRITON_CACHE_DIR:-~/.triton/cache}"),
        (
            "cuda_compute_cache",
            "${CUDA_CACHE_PATH:-~/.nv/ComputeCache}",
        ),
        ("dflash_warmup", warmup.as_str()),
    ]
    .into_iter()
    .map(|(name, path)| CacheDirConfig {
        name: name.into(),
        path: path.into(),
    })
    .collect()
}

/// `[control]`: the Unix-socket control plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlSection {
    /// Unset: `$XDG_RUNTIME_DIR/dflash/dflashd.sock`, or a private 0700 fallback directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// Unconfirmed destructive requests expire after this many seconds.
    pub pending_action_expiry_s: u64,
    /// Program and arguments run (without a shell) to power the machine off after a confirmed
    /// stop. Unset: power-off requests are refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poweroff_command: Option<Vec<String>>,
    /// Users besides the daemon's own allowed to connect.
    pub allowed_uids: Vec<u32>,
    /// Frames buffered per subscriber; a subscriber that falls this far behind is dropped.
    pub client_buffer_frames: usize,
    /// Control connections held at once (the last 4 are kept from subscribers, for requests
    /// such as a stop and its confirmation). Raise it for more dashboards than that.
    pub max_connections: usize,
}

/// `control.max_connections` when unset.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// The bounds `control.max_connections` is held to: room for the slots kept for requests
/// below, and far below a process's default file-descriptor limit above.
pub const MAX_CONNECTIONS_RANGE: std::ops::RangeInclusive<usize> = 8..=512;

impl Default for ControlSection {
    fn default() -> Self {
        Self {
            socket: None,
            pending_action_expiry_s: 300,
            poweroff_command: None,
            allowed_uids: Vec::new(),
            client_buffer_frames: 1024,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// `[detectors]`: declared beside the monitor that reads it (`health/monitor.rs`), since the
/// detectors sit below the config.
pub use crate::health::DetectorsSection;

/// The default of `nodes.heartbeat_timeout_s`: long enough that no scheduling hiccup of a
/// live node's heartbeat thread (a store round trip every fifth of it) reaches it, short
/// against the collective timeout (`--collective-timeout-s`, 60 s by default) it improves on.
pub const DEFAULT_HEARTBEAT_TIMEOUT_S: f64 = 10.0;

/// The range `nodes.heartbeat_timeout_s` may take, seconds: below 1 s a loaded host's beat
/// could be late by that much; above an hour the collective timeout always comes first.
pub const HEARTBEAT_TIMEOUT_RANGE_S: (f64, f64) = (1.0, 3600.0);

/// `[nodes]`: how the nodes of a multi-node job (issue 23) watch each other. Every node bumps
/// a heartbeat counter in the job's store; a node whose counter has not advanced for
/// `heartbeat_timeout_s` is named and the others pause, within `heartbeat_timeout_s` and a
/// fifth of it (docs/SCALING.md, "A lost or stalled node"). A job key: every node must set
/// the same (the start's agreement compares it). Unused by a single node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodesSection {
    pub heartbeat_timeout_s: f64,
}

impl Default for NodesSection {
    fn default() -> Self {
        Self {
            heartbeat_timeout_s: DEFAULT_HEARTBEAT_TIMEOUT_S,
        }
    }
}

/// `[tensorboard]`: TensorBoard event files with a scalar for every number of each
/// `metrics.jsonl` line, written as training goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TensorboardSection {
    pub enabled: bool,
    /// Relative to the run dir, or absolute. Taken as written: `~` and `${VAR}` are not
    /// expanded here (validation refuses them rather than make a directory named `~`).
    pub dir: String,
}

impl Default for TensorboardSection {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: TENSORBOARD_DIR_NAME.into(),
        }
    }
}

/// `[metrics]`: the Prometheus `/metrics` endpoint. Off unless `listen` (or
/// `dflashd start --metrics-listen`) names an address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// `IP:PORT` (e.g. `127.0.0.1:9464`, `[::1]:9464`) or a bare port, which listens on
    /// loopback only. A non-loopback address serves the run's figures, unauthenticated, to
    /// anyone who can reach that address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

/// What an address for the metrics endpoint must look like; the text of every refusal.
pub const METRICS_LISTEN_EXPECTED: &str =
    "an IP address and port such as 127.0.0.1:9464 or [::1]:9464, or a bare port (loopback)";

/// Reads `metrics.listen` / `--metrics-listen`. A bare port means `127.0.0.1:PORT`: an address
/// other machines can reach is only ever one the operator wrote out. Host names are refused
/// rather than resolved, so what the daemon binds is exactly what was written.
pub fn parse_metrics_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    text.parse::<SocketAddr>().map_err(|_| {
        let host_name = text.rsplit_once(':').is_some_and(|(host, _)| {
            !host.contains(':') && host.chars().any(|c| c.is_ascii_alphabetic())
        });
        if text.is_empty() {
            "an empty string".to_string()
        } else if host_name {
            format!("\"{text}\" (a host name: write its IP address, e.g. 127.0.0.1 for localhost)")
        } else {
            format!("\"{text}\"")
        }
    })
}

#[cfg(test)]
mod metrics_listen_tests {
    use super::*;

    #[test]
    fn a_bare_port_listens_on_loopback_and_a_written_address_is_taken_as_written() {
        let parse = |s| parse_metrics_listen(s).unwrap();
        assert_eq!(parse("9464"), "127.0.0.1:9464".parse().unwrap());
        assert!(parse("9464").ip().is_loopback());
        assert_eq!(parse("[::1]:0"), "[::1]:0".parse().unwrap());
        assert_eq!(parse(" 0.0.0.0:9464 "), "0.0.0.0:9464".parse().unwrap());
        assert!(!parse("0.0.0.0:9464").ip().is_loopback());
    }

    #[test]
    fn a_host_name_or_a_bad_port_is_refused_saying_what_was_found() {
        let err = parse_metrics_listen("localhost:9464").unwrap_err();
        assert!(err.contains("a host name"), "{err}");
        assert_eq!(
            parse_metrics_listen("127.0.0.1:99999").unwrap_err(),
            "\"127.0.0.1:99999\""
        );
        assert_eq!(parse_metrics_listen("").unwrap_err(), "an empty string");
    }
}
