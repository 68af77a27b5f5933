//! `tail` lines: events, logs and metrics as one line each, human or JSON, with level and time
//! filters. Pure; the command does the I/O.
use dflash_shared::events::{Event, Severity};
use dflash_shared::format::format_si;
use dflash_shared::metrics::{StepMetrics, TimestampMs, TreeOracleTau};
use serde_json::json;

use crate::app::wording;
use crate::fmt;

/// Levels across events (info/warn/crit) and logs (trace…error); crit and error are one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn parse(text: &str) -> Result<Level, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "trace" => Ok(Level::Trace),
            "debug" => Ok(Level::Debug),
            "info" => Ok(Level::Info),
            "warn" | "warning" => Ok(Level::Warn),
            "error" | "crit" | "critical" => Ok(Level::Error),
            other => Err(format!(
                "unknown level '{other}': expected trace, debug, info, warn, error or crit"
            )),
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Level::Trace => "TRACE",
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

impl From<Severity> for Level {
    fn from(severity: Severity) -> Self {
        match severity {
            Severity::Info => Level::Info,
            Severity::Warn => Level::Warn,
            Severity::Crit => Level::Error,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Event(Event),
    /// Boxed: a metrics line (online and Domino figures included) is several times the size
    /// of the other variants.
    Metrics(Box<StepMetrics>),
    Log {
        ts_ms: TimestampMs,
        level: Level,
        line: String,
    },
}

impl Item {
    pub fn ts_ms(&self) -> TimestampMs {
        match self {
            Item::Event(e) => e.ts_ms,
            Item::Metrics(m) => m.ts_ms,
            Item::Log { ts_ms, .. } => *ts_ms,
        }
    }

    pub fn level(&self) -> Level {
        match self {
            Item::Event(e) => e.severity.into(),
            Item::Metrics(_) => Level::Info,
            Item::Log { level, .. } => *level,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Filter {
    pub min_level: Level,
    pub since_ms: Option<TimestampMs>,
}

impl Filter {
    pub fn keeps(&self, item: &Item) -> bool {
        item.level() >= self.min_level && self.since_ms.is_none_or(|since| item.ts_ms() >= since)
    }
}

/// `--since`: RFC 3339 ("2026-03-14T20:50:00Z"), a clock time today in UTC ("20:50"), or an
/// age ("90s", "10m", "2h", "1d").
pub fn parse_since(text: &str, now_ms: TimestampMs) -> Result<TimestampMs, String> {
    let text = text.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    if let Some((number, unit_ms)) = [
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ]
    .iter()
    .find_map(|(suffix, ms)| text.strip_suffix(suffix).map(|n| (n, *ms)))
    {
        if let Ok(n) = number.parse::<u32>() {
            return Ok(now_ms - i64::from(n) * unit_ms);
        }
    }
    if let Ok(time) = chrono::NaiveTime::parse_from_str(text, "%H:%M") {
        let today = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now_ms)
            .ok_or("the clock is out of range")?
            .date_naive();
        let at = today.and_time(time).and_utc().timestamp_millis();
        // A clock time later than now means yesterday.
        return Ok(if at > now_ms { at - 86_400_000 } else { at });
    }
    Err(format!(
        "cannot read --since '{text}': use RFC 3339 (2026-03-14T20:50:00Z), HH:MM (UTC) or an \
         age like 90s, 10m, 2h, 1d"
    ))
}

pub fn human(item: &Item) -> String {
    let at = fmt::rfc3339(item.ts_ms());
    let level = item.level().word();
    match item {
        Item::Event(e) => format!(
            "{at} {level:<5} event  {} {}",
            wording::kind_tag(&e.kind),
            wording::describe(&e.kind)
        ),
        Item::Metrics(m) => {
            let tau = m.tau.map_or("-".into(), |t| format!("{t:.2}"));
            // The same evaluation's tree figures by their metrics-line names.
            let tree: String = m.tau_tree.as_ref().map_or(String::new(), |tree| {
                let taus: String = tree
                    .by_budget
                    .iter()
                    .map(|(b, t)| format!(" {}={t:.2}", TreeOracleTau::key(*b)))
                    .collect();
                format!(" serve_tree_budget={}{taus}", tree.serve_budget)
            });
            let mfu = m.mfu.map_or("-".into(), |u| format!("{:.1}%", 100.0 * u));
            // The online figures by their metrics-line names, only on lines that have them.
            let online: String = m.online.as_ref().map_or(String::new(), |o| {
                let taus: String = o
                    .methods()
                    .iter()
                    .map(|(method, t)| format!(" online_tau_{method}={t:.2}"))
                    .collect();
                let serve = o
                    .serve_tree_budget
                    .map_or(String::new(), |b| format!(" online_serve_tree_budget={b}"));
                format!(
                    "{taus}{serve} online_eval_prompts={} online_eval_s={:.1}",
                    o.prompts, o.seconds
                )
            });
            format!(
                "{at} {level:<5} metric step={} epoch={} tok/s={} loss={:.4} acc={:.3} tau={tau}\
                 {tree}{online} lr={:.2e} grad_norm={:.3} draft_pos/s={} mfu={mfu}",
                m.step,
                m.epoch,
                format_si(m.tokens_per_s),
                m.loss,
                m.accuracy,
                m.lr,
                m.grad_norm,
                format_si(m.draft_positions_per_s),
            )
        }
        Item::Log { line, .. } => format!("{at} {level:<5} log    {line}"),
    }
}

/// One JSON object per line: `ts`, `ts_ms`, `level`, `source` and the payload.
pub fn json_line(item: &Item) -> String {
    let base = |source: &str, payload: serde_json::Value| {
        json!({
            "ts": fmt::rfc3339(item.ts_ms()),
            "ts_ms": item.ts_ms(),
            "level": item.level().word().to_ascii_lowercase(),
            "source": source,
            "data": payload,
        })
    };
    let value = match item {
        Item::Event(e) => base("event", serde_json::to_value(e).unwrap_or_default()),
        Item::Metrics(m) => base("metrics", serde_json::to_value(m).unwrap_or_default()),
        Item::Log { line, .. } => base("log", json!({ "line": line })),
    };
    value.to_string()
}

/// A line of the daemon's log files: tracing's JSON format when it parses, else the human
/// format ("2026-03-14T20:52:00.123Z  WARN target: message").
pub fn parse_log_line(line: &str) -> Option<Item> {
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(line) {
        let ts_ms = value
            .get("timestamp")
            .and_then(|t| t.as_str())
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())?
            .timestamp_millis();
        let level = Level::parse(value.get("level")?.as_str()?).ok()?;
        let message = value
            .pointer("/fields/message")
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| {
                value
                    .get("fields")
                    .map(|f| f.to_string())
                    .unwrap_or_default()
            });
        return Some(Item::Log {
            ts_ms,
            level,
            line: message,
        });
    }
    let mut words = line.split_whitespace();
    let ts_ms = chrono::DateTime::parse_from_rfc3339(words.next()?)
        .ok()?
        .timestamp_millis();
    let level = Level::parse(words.next()?).ok()?;
    let rest: Vec<&str> = words.collect();
    Some(Item::Log {
        ts_ms,
        level,
        line: rest.join(" "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::events::EventKind;

    const NOW: i64 = 1_773_522_180_000; // 2026-03-14T21:03:00Z

    #[test]
    fn since_accepts_rfc3339_ages_and_clock_times() {
        assert_eq!(
            parse_since("2026-03-14T20:52:00Z", NOW),
            Ok(NOW - 11 * 60_000)
        );
        assert_eq!(parse_since("10m", NOW), Ok(NOW - 600_000));
        assert_eq!(parse_since("2h", NOW), Ok(NOW - 7_200_000));
        assert_eq!(parse_since("20:52", NOW), Ok(NOW - 11 * 60_000));
        assert_eq!(parse_since("21:10", NOW), Ok(NOW + 7 * 60_000 - 86_400_000));
        assert!(parse_since("yesterday", NOW)
            .unwrap_err()
            .contains("yesterday"));
    }

    #[test]
    fn levels_order_and_filter() {
        assert!(Level::parse("crit").unwrap() > Level::parse("warn").unwrap());
        assert!(Level::parse("loud").is_err());
        let event = Item::Event(Event {
            seq: 1,
            ts_ms: NOW,
            severity: Severity::Warn,
            kind: EventKind::Note {
                message: "x".into(),
            },
        });
        let keep = |min_level, since_ms| {
            Filter {
                min_level,
                since_ms,
            }
            .keeps(&event)
        };
        assert!(keep(Level::Info, None));
        assert!(keep(Level::Warn, Some(NOW)));
        assert!(!keep(Level::Error, None));
        assert!(!keep(Level::Info, Some(NOW + 1)));
    }

    #[test]
    fn json_lines_parse_back_and_human_lines_have_the_time_first() {
        let item = Item::Event(Event {
            seq: 3,
            ts_ms: NOW,
            severity: Severity::Crit,
            kind: EventKind::EnvironmentDrift {
                field: "torch".into(),
                before: "2.11.0+cu128".into(),
                after: "2.9.1+cu130".into(),
            },
        });
        let value: serde_json::Value = serde_json::from_str(&json_line(&item)).unwrap();
        assert_eq!(value["level"], "error");
        assert_eq!(value["data"]["kind"], "environment_drift");
        assert_eq!(
            human(&item),
            "2026-03-14T21:03:00.000Z ERROR event  env-drift torch 2.11.0+cu128 → 2.9.1+cu130"
        );
    }

    #[test]
    fn a_metrics_line_shows_its_tree_and_online_figures_by_their_names_and_keeps_them_in_json() {
        let mut m = StepMetrics {
            ts_ms: NOW,
            step: 50,
            epoch: 1,
            loss: 2.0,
            accuracy: 0.5,
            tau: Some(3.5),
            tau_tree: None,
            lr: 1e-3,
            grad_norm: 0.25,
            tokens_per_s: 900.0,
            draft_positions_per_s: 4_000.0,
            mfu: None,
            workers: vec![],
            times: Default::default(),
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        };
        assert!(!human(&Item::Metrics(Box::new(m.clone()))).contains("online"));
        m.tau_tree = Some(TreeOracleTau {
            serve_budget: 16,
            by_budget: [(8, 3.25), (16, 3.75)].into_iter().collect(),
        });
        m.online = Some(dflash_shared::metrics::OnlineAcceptance {
            tau_chain: 2.5,
            tau_ddtree: [(16, 3.0)].into_iter().collect(),
            serve_tree_budget: Some(16),
            offline_tau: Some(3.5),
            base: None,
            prompts: 8,
            seconds: 1.25,
        });
        let item = Item::Metrics(Box::new(m));
        assert!(
            human(&item).contains(
                " tau=3.50 serve_tree_budget=16 tau_tree_oracle_8=3.25 \
                 tau_tree_oracle_16=3.75 online_tau_chain=2.50 online_tau_ddtree_16=3.00 \
                 online_serve_tree_budget=16 online_eval_prompts=8 online_eval_s=1.2 lr="
            ),
            "{}",
            human(&item)
        );
        let value: serde_json::Value = serde_json::from_str(&json_line(&item)).unwrap();
        assert_eq!(value["data"]["online_tau_ddtree_16"], 3.0);
        assert_eq!(value["data"]["tau_tree_oracle_16"], 3.75);
        assert_eq!(value["data"]["serve_tree_budget"], 16);
    }

    #[test]
    fn log_lines_in_both_tracing_formats() {
        let json = r#"{"timestamp":"2026-03-14T21:03:00.000Z","level":"WARN","fields":{"message":"slow"},"target":"dflashd"}"#;
        assert_eq!(
            parse_log_line(json),
            Some(Item::Log {
                ts_ms: NOW,
                level: Level::Warn,
                line: "slow".into()
            })
        );
        let human = "2026-03-14T21:03:00.000Z  INFO dflashd::runtime: step 5";
        assert_eq!(
            parse_log_line(human),
            Some(Item::Log {
                ts_ms: NOW,
                level: Level::Info,
                line: "dflashd::runtime: step 5".into()
            })
        );
        assert_eq!(parse_log_line("no time here"), None);
    }
}
