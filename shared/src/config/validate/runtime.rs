//! The daemon's own sections: topology, queue, telemetry, control, TensorBoard, /metrics and
//! the nodes' heartbeat.
use std::collections::BTreeSet;

use super::positive;
use crate::config::daemon_sections::{
    parse_metrics_listen, HEARTBEAT_TIMEOUT_RANGE_S, MAX_CONNECTIONS_RANGE, METRICS_LISTEN_EXPECTED,
};
use crate::config::device::Device;
use crate::config::error::ConfigIssue;
use crate::config::Config;

pub(super) fn topology(c: &Config, v: &mut Vec<ConfigIssue>) {
    for (key, devices) in [
        ("topology.target_devices", &c.topology.target_devices),
        ("topology.drafter_devices", &c.topology.drafter_devices),
    ] {
        if devices.is_empty() {
            v.push(ConfigIssue::invalid(
                key,
                "at least one device (\"cpu\" or \"cuda:N\")",
                "an empty list",
            ));
            continue;
        }
        let mut seen = BTreeSet::new();
        for d in devices.iter().filter(|d| d.is_cuda()) {
            if !seen.insert(d) {
                v.push(ConfigIssue::invalid(
                    key,
                    "each GPU at most once (one worker thread per device)",
                    format!("{d} twice"),
                ));
            }
        }
        // CPU workers share the host; several are allowed (tests run 2+2 CPU topologies).
        let kinds: BTreeSet<bool> = devices.iter().map(Device::is_cuda).collect();
        if kinds.len() > 1 {
            v.push(
                ConfigIssue::invalid(key, "all \"cpu\" or all \"cuda:N\"", "a mix of both")
                    .with_hint("gradients and hidden states are exchanged within one device kind"),
            );
        }
    }
}

pub(super) fn runtime(c: &Config, v: &mut Vec<ConfigIssue>) {
    let q = &c.queue;
    positive(v, "queue.capacity", q.capacity);
    if q.high_watermark == 0 || q.high_watermark > q.capacity {
        v.push(ConfigIssue::invalid(
            "queue.high_watermark",
            format!("between 1 and queue.capacity ({})", q.capacity),
            q.high_watermark,
        ));
    }
    if q.low_watermark >= q.high_watermark {
        v.push(ConfigIssue::invalid(
            "queue.low_watermark",
            format!("less than queue.high_watermark ({})", q.high_watermark),
            q.low_watermark,
        ));
    }
    if q.byte_cap.bytes() == 0 {
        v.push(ConfigIssue::invalid(
            "queue.byte_cap",
            "a positive size",
            "0 B",
        ));
    }
    let t = &c.telemetry;
    if t.sample_interval_ms < 100 {
        v.push(ConfigIssue::invalid(
            "telemetry.sample_interval_ms",
            "at least 100",
            t.sample_interval_ms,
        ));
    }
    let mut names = BTreeSet::new();
    for (i, cache) in t.caches.iter().enumerate() {
        if cache.name.trim().is_empty() {
            v.push(ConfigIssue::invalid(
                format!("telemetry.caches[{i}].name"),
                "a name",
                "an empty string",
            ));
        } else if !names.insert(cache.name.as_str()) {
            v.push(ConfigIssue::invalid(
                format!("telemetry.caches[{i}].name"),
                "a name not used by another cache",
                format!("\"{}\" again", cache.name),
            ));
        }
        if cache.path.trim().is_empty() {
            v.push(ConfigIssue::invalid(
                format!("telemetry.caches[{i}].path"),
                "a path",
                "an empty string",
            ));
        }
    }
    let ctl = &c.control;
    if ctl.pending_action_expiry_s == 0 {
        v.push(ConfigIssue::invalid(
            "control.pending_action_expiry_s",
            "a positive number of seconds",
            0,
        ));
    }
    positive(v, "control.client_buffer_frames", ctl.client_buffer_frames);
    let range = MAX_CONNECTIONS_RANGE;
    if !range.contains(&ctl.max_connections) {
        v.push(ConfigIssue::invalid(
            "control.max_connections",
            format!("{} to {} connections", range.start(), range.end()),
            ctl.max_connections,
        ));
    }
    if let Some(cmd) = &ctl.poweroff_command {
        if cmd.first().is_none_or(|p| p.trim().is_empty()) {
            v.push(
                ConfigIssue::invalid(
                    "control.poweroff_command",
                    "a program and its arguments, e.g. [\"systemctl\", \"poweroff\"]",
                    "an empty command",
                )
                .with_hint("leave the key out to keep power-off disabled"),
            );
        }
    }
}

pub(super) fn tensorboard(c: &Config, v: &mut Vec<ConfigIssue>) {
    let dir = &c.tensorboard.dir;
    if !c.tensorboard.enabled {
        return;
    }
    if dir.trim().is_empty() {
        v.push(
            ConfigIssue::invalid(
                "tensorboard.dir",
                "a directory, relative to the run dir or absolute",
                "an empty string",
            )
            .with_hint(
                "leave the key out for <run dir>/tensorboard, or set tensorboard.enabled = false",
            ),
        );
    } else if dir.starts_with('~') || dir.contains("${") {
        v.push(
            ConfigIssue::invalid(
                "tensorboard.dir",
                "a plain path, relative to the run dir or absolute",
                format!("\"{dir}\""),
            )
            .with_hint("`~` and `${VAR}` are not expanded here; write the absolute path"),
        );
    }
}

pub(super) fn metrics(c: &Config, v: &mut Vec<ConfigIssue>) {
    if let Some(listen) = &c.metrics.listen {
        if let Err(found) = parse_metrics_listen(listen) {
            v.push(
                ConfigIssue::invalid("metrics.listen", METRICS_LISTEN_EXPECTED, found)
                    .with_hint("leave the key out to serve no /metrics endpoint"),
            );
        }
    }
}

/// `[nodes]`: the heartbeat timeout within its range, with what it bounds.
pub(super) fn nodes(c: &Config, v: &mut Vec<ConfigIssue>) {
    let t = c.nodes.heartbeat_timeout_s;
    let (lo, hi) = HEARTBEAT_TIMEOUT_RANGE_S;
    if !(t.is_finite() && (lo..=hi).contains(&t)) {
        v.push(
            ConfigIssue::invalid(
                "nodes.heartbeat_timeout_s",
                format!("a number of seconds from {lo} to {hi}, e.g. 10"),
                t,
            )
            .with_hint(
                "a node of a multi-node job whose heartbeat stops for this long is named and \
                 the others pause, within this and a fifth of it",
            ),
        );
    }
}
