//! Active alerts and how they are explained: what happened, since when, and what changed in
//! the journal just before.
use std::collections::BTreeMap;

use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::status::Alert;

use dflash_shared::health;

use super::journal::Journal;
use super::wording;
use crate::fmt::DisplayClock;

/// How far back "Before it" looks in the journal when the daemon did not say.
pub const CONTEXT_WINDOW_MS: i64 = 60 * 60 * 1000;

/// Alerts by detector. The daemon's status snapshot is authoritative when it arrives; journal
/// events in between start and end alerts so the console never lags a poll behind.
#[derive(Debug, Clone, Default)]
pub struct ActiveAlerts {
    by_detector: BTreeMap<String, Alert>,
}

impl ActiveAlerts {
    pub fn replace_all(&mut self, alerts: &[Alert]) {
        self.by_detector = alerts
            .iter()
            .map(|a| (a.detector.clone(), a.clone()))
            .collect();
    }

    pub fn apply_event(&mut self, event: &Event) {
        match &event.kind {
            EventKind::RegressionStarted {
                detector,
                level,
                message,
            } => {
                // Warn → Crit keeps the time the regression began, as the daemon's
                // `HealthMonitor` does.
                let began = self.by_detector.get(detector).map(|a| a.since_ms);
                let alert = Alert {
                    detector: detector.clone(),
                    level: *level,
                    since_ms: began.unwrap_or(event.ts_ms),
                    message: message.clone(),
                    preceded_by: Vec::new(),
                    since_healthy: Vec::new(),
                };
                self.by_detector.insert(detector.clone(), alert);
            }
            EventKind::RegressionEnded { detector, .. } => {
                self.by_detector.remove(detector);
            }
            _ => {}
        }
    }

    /// Most severe first, then oldest first.
    pub fn sorted(&self) -> Vec<&Alert> {
        let mut alerts: Vec<&Alert> = self.by_detector.values().collect();
        alerts.sort_by(|a, b| b.level.cmp(&a.level).then(a.since_ms.cmp(&b.since_ms)));
        alerts
    }

    pub fn worst(&self) -> Option<Severity> {
        self.by_detector.values().map(|a| a.level).max()
    }

    pub fn is_empty(&self) -> bool {
        self.by_detector.is_empty()
    }
}

/// What the console knows about throughput when it words an alert.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThroughputNow {
    pub tokens_per_s: Option<f64>,
    pub baseline_tokens_per_s: Option<f64>,
}

pub fn is_throughput_detector(detector: &str) -> bool {
    let d = detector.to_ascii_lowercase();
    d.contains("throughput") || d.contains("tok")
}

fn health_level(severity: Severity) -> health::Level {
    match severity {
        Severity::Info => health::Level::Ok,
        Severity::Warn => health::Level::Warn,
        Severity::Crit => health::Level::Crit,
    }
}

/// Whose verdict an alert is. The daemon's wins: the console shows its own verdict of a
/// detector (`memory:gpuN`, `queue`, judged by the same shared detectors with the daemon's
/// thresholds) only while the daemon has sent no alert of that detector, and labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Daemon,
    Console,
}

/// The label a console verdict carries in the Alerts panel.
pub const CONSOLE_LABEL: &str = "(console's verdict; dflashd sent none)";

/// The daemon's alerts, then the console's own where the daemon has none of that detector:
/// most severe first, then oldest first. Nothing is counted twice.
pub fn merged<'a>(
    daemon: &'a ActiveAlerts,
    console: impl IntoIterator<Item = &'a Alert>,
) -> Vec<(&'a Alert, Verdict)> {
    let mut all: Vec<(&Alert, Verdict)> = daemon
        .sorted()
        .into_iter()
        .map(|a| (a, Verdict::Daemon))
        .collect();
    for alert in console {
        if !daemon.by_detector.contains_key(&alert.detector) {
            all.push((alert, Verdict::Console));
        }
    }
    all.sort_by(|(a, _), (b, _)| b.level.cmp(&a.level).then(a.since_ms.cmp(&b.since_ms)));
    all
}

/// An alert in words: the headline, and what changed in the journal just before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub level: Severity,
    /// The detectors it stands for: one, or the siblings a grouped line folds.
    pub detectors: Vec<String>,
    pub verdict: Verdict,
    pub since_ms: i64,
    /// The detector's own sentence ("GPU 5 memory volatile: range …").
    pub message: String,
    /// "4.3K tok/s, Crit since 21:03 (baseline 21.5K)"
    pub head: String,
    /// "torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52", oldest first.
    pub before: Vec<String>,
}

impl Explanation {
    /// "4.3K tok/s, Crit since 21:03 (baseline 21.5K). Before it: torch 2.11.0+cu128 →
    /// 2.9.1+cu130 at 20:52; TorchInductor compile cache deleted at 21:00."
    pub fn sentence(&self) -> String {
        if self.before.is_empty() {
            format!(
                "{}. Nothing changed in the journal in the hour before.",
                self.head
            )
        } else {
            format!("{}. Before it: {}.", self.head, self.before.join("; "))
        }
    }
}

/// "GPU 5 memory volatile: …, Warn since 21:02", with the console's label on its own verdicts.
fn plain_head(
    message: &str,
    level: Severity,
    since_ms: i64,
    verdict: Verdict,
    clock: DisplayClock,
) -> String {
    let label = match verdict {
        Verdict::Daemon => String::new(),
        Verdict::Console => format!(" {CONSOLE_LABEL}"),
    };
    format!(
        "{}{label}, {} since {}",
        message.trim_end_matches('.'),
        wording::severity_word(level),
        clock.hm(since_ms)
    )
}

/// The daemon's own `preceded_by` wins; without it the console searches its journal the same
/// way the daemon does (`dflash_shared::health::explain_alert`).
pub fn explain(
    alert: &Alert,
    throughput: ThroughputNow,
    journal: &Journal,
    clock: DisplayClock,
) -> Explanation {
    explain_as(alert, Verdict::Daemon, throughput, journal, clock)
}

pub fn explain_as(
    alert: &Alert,
    verdict: Verdict,
    throughput: ThroughputNow,
    journal: &Journal,
    clock: DisplayClock,
) -> Explanation {
    let offset = clock.offset_at(alert.since_ms);
    let head = match (
        is_throughput_detector(&alert.detector),
        throughput.tokens_per_s,
    ) {
        (true, Some(now)) => health::throughput_headline(
            now,
            health_level(alert.level),
            Some(alert.since_ms),
            throughput.baseline_tokens_per_s,
            offset,
        ),
        _ => plain_head(&alert.message, alert.level, alert.since_ms, verdict, clock),
    };
    let before = if alert.preceded_by.is_empty() {
        health::explain_alert(alert.since_ms, journal.events(), CONTEXT_WINDOW_MS)
            .iter()
            .map(|p| p.sentence(offset))
            .collect()
    } else {
        alert.preceded_by.clone()
    };
    Explanation {
        level: alert.level,
        detectors: vec![alert.detector.clone()],
        verdict,
        since_ms: alert.since_ms,
        message: alert.message.clone(),
        head,
        before: health::grouping::group_gpu_sentences(&before),
    }
}

/// Sibling alerts folded into one line (`dflash_shared::health::grouping`): the memory alerts
/// of GPUs 5, 6 and 7 with the same wording, of the same level and from the same side, read
/// "GPU 5–7 memory volatile, Warn since 21:02". A folded line keeps the place, and the
/// context, of its first member; it is since the earliest of them.
pub fn group(explanations: Vec<Explanation>, clock: DisplayClock) -> Vec<Explanation> {
    let messages: Vec<&str> = explanations
        .iter()
        .map(|e| e.message.trim_end_matches('.'))
        .collect();
    let mut buckets: BTreeMap<(Severity, Verdict), Vec<usize>> = BTreeMap::new();
    for (i, e) in explanations.iter().enumerate() {
        buckets.entry((e.level, e.verdict)).or_default().push(i);
    }
    let mut lines: Vec<(usize, Explanation)> = Vec::new();
    for ((level, verdict), members) in buckets {
        let items: Vec<(&str, &str)> = members
            .iter()
            .map(|&i| (explanations[i].detectors[0].as_str(), messages[i]))
            .collect();
        for g in health::grouping::group(&items) {
            let indices: Vec<usize> = g.members.iter().map(|&m| members[m]).collect();
            let first = indices[0];
            let mut line = explanations[first].clone();
            if indices.len() > 1 {
                let since = indices
                    .iter()
                    .map(|&i| explanations[i].since_ms)
                    .min()
                    .unwrap_or(line.since_ms);
                line.detectors = indices
                    .iter()
                    .map(|&i| explanations[i].detectors[0].clone())
                    .collect();
                line.since_ms = since;
                line.head = plain_head(&g.headline, level, since, verdict, clock);
            }
            lines.push((first, line));
        }
    }
    lines.sort_by_key(|(first, _)| *first);
    lines.into_iter().map(|(_, line)| line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T2052: i64 = 1_773_521_520_000;
    const T2100: i64 = 1_773_522_000_000;
    const T2103: i64 = 1_773_522_180_000;

    fn incident_journal() -> Journal {
        let mut journal = Journal::default();
        journal.insert(Event {
            seq: 10,
            ts_ms: T2052,
            severity: Severity::Warn,
            kind: EventKind::EnvironmentDrift {
                field: "torch".into(),
                before: "2.11.0+cu128".into(),
                after: "2.9.1+cu130".into(),
            },
        });
        journal.insert(Event {
            seq: 11,
            ts_ms: T2100,
            severity: Severity::Warn,
            kind: EventKind::CacheChanged {
                name: "torchinductor".into(),
                path: "/x".into(),
                change: "deleted".into(),
            },
        });
        journal
    }

    fn crit_event(seq: u64, ts_ms: i64, level: Severity) -> Event {
        Event {
            seq,
            ts_ms,
            severity: level,
            kind: EventKind::RegressionStarted {
                detector: "throughput".into(),
                level,
                message: "throughput 20% of baseline".into(),
            },
        }
    }

    #[test]
    fn a_throughput_alert_names_the_changes_before_it() {
        let journal = incident_journal();
        let mut alerts = ActiveAlerts::default();
        alerts.apply_event(&crit_event(12, T2103, Severity::Crit));
        let alert = alerts.sorted()[0];
        let text = explain(
            alert,
            ThroughputNow {
                tokens_per_s: Some(4_300.0),
                baseline_tokens_per_s: Some(21_500.0),
            },
            &journal,
            DisplayClock::utc(),
        )
        .sentence();
        assert_eq!(
            text,
            "4.3K tok/s, Crit since 21:03 (baseline 21.5K). Before it: torch 2.11.0+cu128 → \
             2.9.1+cu130 at 20:52; TorchInductor compile cache deleted at 21:00."
        );
    }

    /// One home for an event's words (`dflash_shared::events::wording`): the alert's "Before
    /// it" names each preceding event by the words its events-view line begins with.
    #[test]
    fn an_alert_and_the_events_view_word_an_event_alike() {
        let mut journal = Journal::default();
        let kinds = [
            EventKind::EnvironmentChanged {
                field: "code_git_commit".into(),
                before: "0123456789abcdef0123".into(),
                after: "fedcba9876543210fedc".into(),
            },
            EventKind::CacheChanged {
                name: "torchinductor".into(),
                path: "/srv/dflash/cache/torchinductor".into(),
                change: "deleted (was 2.1 GB, 418 entries)".into(),
            },
            EventKind::ActionExecuted {
                action_id: "act-3".into(),
                outcome: "deleted /srv/dflash/cache/torchinductor".into(),
            },
            EventKind::RunStarted {
                run_name: "qwen36-27b-dflash".into(),
                resumed_from_step: Some(12_000),
            },
        ];
        for (i, kind) in kinds.iter().enumerate() {
            journal.insert(Event {
                seq: 20 + i as u64,
                ts_ms: T2052 + 60_000 * i as i64,
                severity: Severity::Warn,
                kind: kind.clone(),
            });
        }
        let mut alerts = ActiveAlerts::default();
        alerts.apply_event(&crit_event(30, T2103, Severity::Crit));
        let explanation = explain(
            alerts.sorted()[0],
            ThroughputNow::default(),
            &journal,
            DisplayClock::utc(),
        );
        assert_eq!(explanation.before.len(), kinds.len(), "{explanation:?}");
        for (before, kind) in explanation.before.iter().zip(&kinds) {
            let (words, _at) = before.rsplit_once(" at ").unwrap();
            assert!(
                wording::describe(kind).starts_with(words),
                "alert: {before:?}, events view: {:?}",
                wording::describe(kind)
            );
        }
        assert_eq!(
            explanation.before,
            [
                "code commit 0123456789ab → fedcba987654 at 20:52",
                "TorchInductor compile cache deleted at 20:53",
                "operator action act-3: deleted /srv/dflash/cache/torchinductor at 20:54",
                "daemon restarted, resumed at step 12,000 at 20:55",
            ]
        );
        assert_eq!(
            wording::describe(&kinds[0]),
            "code commit 0123456789ab → fedcba987654 (informational; resume not held)"
        );
        assert_eq!(
            wording::describe(&kinds[1]),
            "TorchInductor compile cache deleted (was 2.1 GB, 418 entries) \
             (/srv/dflash/cache/torchinductor)"
        );
    }

    #[test]
    fn the_daemons_own_context_wins_and_other_detectors_use_their_message() {
        let alert = Alert {
            detector: "memory_flatness".into(),
            level: Severity::Warn,
            since_ms: T2103,
            message: "GPU memory volatile on cuda:5.".into(),
            preceded_by: vec!["compile cache deleted at 21:00".into()],
            since_healthy: Vec::new(),
        };
        let text = explain(
            &alert,
            ThroughputNow::default(),
            &Journal::default(),
            DisplayClock::utc(),
        )
        .sentence();
        assert_eq!(
            text,
            "GPU memory volatile on cuda:5, Warn since 21:03. Before it: compile cache deleted at 21:00."
        );
    }

    #[test]
    fn escalation_keeps_when_the_regression_began_and_an_end_clears() {
        let mut alerts = ActiveAlerts::default();
        alerts.apply_event(&crit_event(1, 1_000, Severity::Warn));
        alerts.apply_event(&crit_event(2, 2_000, Severity::Crit));
        alerts.apply_event(&crit_event(3, 3_000, Severity::Crit));
        assert_eq!(alerts.sorted()[0].since_ms, 1_000);
        assert_eq!(alerts.sorted()[0].level, Severity::Crit);
        assert_eq!(alerts.worst(), Some(Severity::Crit));
        alerts.apply_event(&Event {
            seq: 4,
            ts_ms: 4_000,
            severity: Severity::Info,
            kind: EventKind::RegressionEnded {
                detector: "throughput".into(),
                message: "back to baseline".into(),
            },
        });
        assert!(alerts.is_empty());
    }
}
