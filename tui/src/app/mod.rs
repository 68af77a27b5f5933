//! Console state, fed by one event channel (keys, ticks, the daemon link, a replay), and the
//! reducer that turns events into state changes and effects. Drawing reads this state only.
pub mod alerts;
mod consequences;
pub mod freshness;
pub mod history;
mod input;
pub mod journal;
pub mod telemetry;
pub mod wording;

use crossterm::event::KeyEvent;
use dflash_shared::metrics::TimestampMs;
use dflash_shared::protocol::{Request, Response};
use dflash_shared::run_end::{run_ending, RunEnding};
use dflash_shared::status::{
    Dflash2Acceptance, DominoAcceptance, DsparkAcceptance, OnlineEvalStatus, StatusSnapshot,
};

use crate::actions::ActionFlow;
use crate::client::supervisor::LinkEvent;
use crate::client::Welcome;
use crate::fmt::DisplayClock;
use alerts::{ActiveAlerts, ThroughputNow, Verdict};
use dflash_shared::events::Severity;
use dflash_shared::status::Alert;
use freshness::Freshness;
use history::Series;
use journal::{EventFilter, Journal, LogLine};
use telemetry::Telemetry;

pub use input::KEYMAP;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Overview,
    Gpus,
    Queue,
    Caches,
    Events,
    Checkpoints,
}

impl View {
    pub const ALL: [View; 6] = [
        View::Overview,
        View::Gpus,
        View::Queue,
        View::Caches,
        View::Events,
        View::Checkpoints,
    ];

    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "Overview",
            View::Gpus => "GPUs",
            View::Queue => "Queue",
            View::Caches => "Caches",
            View::Events => "Events",
            View::Checkpoints => "Checkpoints",
        }
    }

    /// The digit that opens the view.
    pub fn key(self) -> char {
        let index = View::ALL.iter().position(|v| *v == self).unwrap_or(0);
        char::from(b'1' + index as u8)
    }

    fn step(self, forward: bool) -> View {
        let index = View::ALL.iter().position(|v| *v == self).unwrap_or(0);
        let n = View::ALL.len();
        View::ALL[if forward {
            (index + 1) % n
        } else {
            (index + n - 1) % n
        }]
    }
}

/// Where the console's data comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Live { socket: String },
    Replay(ReplayState),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplayState {
    pub file: String,
    pub position: usize,
    pub total: usize,
    pub speed: f64,
    pub paused: bool,
    pub finished: bool,
    pub skipped_lines: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LinkState {
    Connecting {
        attempt: u32,
    },
    Connected {
        welcome: Welcome,
        since_ms: TimestampMs,
    },
    Lost {
        reason: String,
        retry_at_ms: TimestampMs,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReplayControl {
    TogglePause,
    Faster,
    Slower,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AppEvent {
    Key(KeyEvent),
    Resize,
    /// The current time: the wall clock when live, the recording's clock in a replay.
    Tick(TimestampMs),
    Link(LinkEvent),
    /// A recorded frame being replayed.
    Recorded(Response),
    ReplayProgress {
        position: usize,
        speed: f64,
        paused: bool,
        finished: bool,
    },
    /// SIGTERM or SIGHUP: leave like `q`, restoring the terminal.
    Shutdown,
}

impl From<LinkEvent> for AppEvent {
    fn from(event: LinkEvent) -> Self {
        AppEvent::Link(event)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Quit,
    Send(Request),
    Replay(ReplayControl),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    pub gpu: usize,
    pub cache: usize,
    pub checkpoint: usize,
    /// Lines scrolled up from the newest event; 0 follows the tail.
    pub events_scroll: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub text: String,
    pub until_ms: TimestampMs,
}

const NOTICE_MS: i64 = 6_000;

pub struct App {
    pub source: Source,
    pub link: LinkState,
    pub read_only: bool,
    pub now_ms: TimestampMs,
    pub clock: DisplayClock,
    pub status: Option<StatusSnapshot>,
    /// When each status frame came, on the console's clock (replay: the recording's).
    pub status_seen: Series,
    pub telemetry: Telemetry,
    pub journal: Journal,
    pub alerts: ActiveAlerts,
    pub view: View,
    pub help_open: bool,
    pub modal: Option<ActionFlow>,
    pub selection: Selection,
    pub event_filter: EventFilter,
    pub editing_filter: bool,
    pub notice: Option<Notice>,
    pub garbled_frames: u64,
}

impl App {
    pub fn new(source: Source, read_only: bool, now_ms: TimestampMs, clock: DisplayClock) -> Self {
        // A replay has no daemon to act on.
        let read_only = read_only || matches!(source, Source::Replay(_));
        Self {
            source,
            link: LinkState::Connecting { attempt: 0 },
            read_only,
            now_ms,
            clock,
            status: None,
            status_seen: Series::new(4_096, telemetry::RETENTION_MS),
            telemetry: Telemetry::default(),
            journal: Journal::default(),
            alerts: ActiveAlerts::default(),
            view: View::Overview,
            help_open: false,
            modal: None,
            selection: Selection::default(),
            event_filter: EventFilter::default(),
            editing_filter: false,
            notice: None,
            garbled_frames: 0,
        }
    }

    pub fn handle(&mut self, event: AppEvent) -> Vec<Effect> {
        match event {
            AppEvent::Key(key) => return self.on_key(key),
            AppEvent::Resize => {}
            AppEvent::Tick(now) => self.now_ms = self.now_ms.max(now),
            AppEvent::Recorded(frame) => self.apply_frame(frame),
            AppEvent::ReplayProgress {
                position,
                speed,
                paused,
                finished,
            } => {
                if let Source::Replay(state) = &mut self.source {
                    state.position = position;
                    state.speed = speed;
                    state.paused = paused;
                    state.finished = finished;
                }
            }
            AppEvent::Link(link) => return self.on_link(link),
            AppEvent::Shutdown => return vec![Effect::Quit],
        }
        Vec::new()
    }

    fn on_link(&mut self, event: LinkEvent) -> Vec<Effect> {
        match event {
            LinkEvent::Connecting { attempt } => {
                if !matches!(self.link, LinkState::Lost { .. }) || attempt == 1 {
                    self.link = LinkState::Connecting { attempt };
                }
            }
            LinkEvent::Connected(welcome) => {
                self.link = LinkState::Connected {
                    welcome,
                    since_ms: self.now_ms,
                };
            }
            LinkEvent::Lost { reason, retry_in } => {
                self.link = LinkState::Lost {
                    reason,
                    retry_at_ms: self.now_ms + retry_in.as_millis() as i64,
                };
            }
            LinkEvent::Frame(frame) => self.apply_frame(frame),
            LinkEvent::Garbled(reason) => {
                self.garbled_frames += 1;
                self.notify(format!("unreadable frame from the daemon: {reason}"));
            }
            LinkEvent::Reply { request, result } => return self.on_reply(request, result),
        }
        Vec::new()
    }

    fn on_reply(&mut self, request: Request, result: Result<Response, String>) -> Vec<Effect> {
        if let Some(flow) = &mut self.modal {
            if flow.on_reply(&request, &result) {
                return Vec::new();
            }
        }
        match (&request, result) {
            // The operator closed the modal before the daemon filed it: withdraw it.
            (Request::RequestAction { .. }, Ok(Response::Pending { action })) => {
                vec![Effect::Send(Request::Cancel {
                    action_id: action.id,
                })]
            }
            (_, Err(message)) => {
                self.notify(message);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    pub fn apply_frame(&mut self, frame: Response) {
        match frame {
            Response::Status(snapshot) => {
                self.alerts.replace_all(&snapshot.alerts);
                self.telemetry
                    .apply_thresholds(snapshot.detectors.as_ref(), snapshot.run.started_ms);
                self.telemetry.apply_gpus(&snapshot.gpus);
                self.telemetry.apply_queue(&snapshot.queue);
                self.status = Some(*snapshot);
                self.status_seen.push(self.now_ms, 1.0);
            }
            Response::Metrics(metrics) => self.telemetry.apply_metrics(&metrics),
            Response::Gpus { telemetry } => self.telemetry.apply_gpus(&telemetry),
            Response::Queue(stats) => self.telemetry.apply_queue(&stats),
            Response::Event(event) => {
                self.alerts.apply_event(&event);
                self.journal.insert(*event);
            }
            Response::Events { events } => {
                for event in &events {
                    self.alerts.apply_event(event);
                }
                self.journal.extend(events);
            }
            Response::Log { level, line } => self.journal.push_log(LogLine {
                ts_ms: self.now_ms,
                level,
                line,
            }),
            Response::Dropped { reason } => {
                self.notify(format!("the daemon dropped this console: {reason}"))
            }
            Response::Error { code, message } => {
                self.notify(format!("daemon error ({code:?}): {message}"))
            }
            Response::Welcome { .. }
            | Response::Ok
            | Response::Json { .. }
            | Response::Pending { .. }
            | Response::Executed { .. } => {}
        }
    }

    pub fn notify(&mut self, text: impl Into<String>) {
        self.notice = Some(Notice {
            text: text.into(),
            until_ms: self.now_ms + NOTICE_MS,
        });
    }

    pub fn active_notice(&self) -> Option<&str> {
        self.notice
            .as_ref()
            .filter(|n| n.until_ms >= self.now_ms)
            .map(|n| n.text.as_str())
    }

    pub fn run_name(&self) -> Option<&str> {
        if let Some(status) = &self.status {
            return Some(&status.run.name);
        }
        match &self.link {
            LinkState::Connected { welcome, .. } => Some(&welcome.run_name),
            _ => None,
        }
    }

    pub fn tokens_per_s(&self) -> Option<f64> {
        match (&self.telemetry.last_metrics, &self.status) {
            (Some(m), _) => Some(m.tokens_per_s),
            (None, Some(s)) => Some(s.throughput.tokens_per_s),
            (None, None) => None,
        }
    }

    /// Draft positions per second and MFU of the latest step (MFU `None` where a device's
    /// peak is unknown), from the live metrics or else the status.
    pub fn draft_rate(&self) -> Option<(f64, Option<f64>)> {
        match (&self.telemetry.last_metrics, &self.status) {
            (Some(m), _) => Some((m.draft_positions_per_s, m.mfu)),
            (None, Some(s)) => Some((s.throughput.draft_positions_per_s, s.throughput.mfu)),
            (None, None) => None,
        }
    }

    pub fn baseline_tokens_per_s(&self) -> Option<f64> {
        self.status
            .as_ref()
            .and_then(|s| s.throughput.baseline_tokens_per_s)
    }

    pub fn throughput_now(&self) -> ThroughputNow {
        ThroughputNow {
            tokens_per_s: self.tokens_per_s(),
            baseline_tokens_per_s: self.baseline_tokens_per_s(),
        }
    }

    /// The newest online evaluation: from the metrics stream or the last status, whichever
    /// is newer (a console that attaches mid-run has only the status's).
    pub fn last_online(&self) -> Option<&OnlineEvalStatus> {
        let from_metrics = self.telemetry.last_online.as_ref();
        let from_status = self.status.as_ref().and_then(|s| s.last_online.as_ref());
        match (from_metrics, from_status) {
            (Some(a), Some(b)) => Some(if a.ts_ms >= b.ts_ms { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// A Domino run's newest training-batch acceptance (`accept_len`, `base_accept_len`):
    /// from the metrics stream or the last status, whichever is newer.
    pub fn last_domino(&self) -> Option<DominoAcceptance> {
        let from_metrics = self.telemetry.last_metrics.as_ref().and_then(|m| {
            m.domino.map(|d| DominoAcceptance {
                step: m.step,
                ts_ms: m.ts_ms,
                accept_len: d.accept_len,
                base_accept_len: d.base_accept_len,
            })
        });
        let from_status = self.status.as_ref().and_then(|s| s.last_domino);
        match (from_metrics, from_status) {
            (Some(a), Some(b)) => Some(if a.ts_ms >= b.ts_ms { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// A DSpark run's newest training-batch acceptance and confidence calibration: from the
    /// metrics stream or the last status, whichever is newer.
    pub fn last_dspark(&self) -> Option<DsparkAcceptance> {
        let from_metrics = self.telemetry.last_metrics.as_ref().and_then(|m| {
            m.dspark
                .as_ref()
                .map(|d| DsparkAcceptance::from_step(m.step, m.ts_ms, d))
        });
        let from_status = self.status.as_ref().and_then(|s| s.last_dspark);
        match (from_metrics, from_status) {
            (Some(a), Some(b)) => Some(if a.ts_ms >= b.ts_ms { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// A DFlash2 run's newest training-batch acceptance: from the metrics stream or the last
    /// status, whichever is newer.
    pub fn last_dflash2(&self) -> Option<Dflash2Acceptance> {
        let from_metrics = self.telemetry.last_metrics.as_ref().and_then(|m| {
            m.dflash2
                .as_ref()
                .map(|d| Dflash2Acceptance::from_step(m.step, m.ts_ms, d))
        });
        let from_status = self.status.as_ref().and_then(|s| s.last_dflash2);
        match (from_metrics, from_status) {
            (Some(a), Some(b)) => Some(if a.ts_ms >= b.ts_ms { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// (step, epoch): the newer of the metrics stream and the last status.
    pub fn step_epoch(&self) -> Option<(u64, u32)> {
        let from_metrics = self
            .telemetry
            .last_metrics
            .as_ref()
            .map(|m| (m.step, m.epoch));
        let from_status = self.status.as_ref().map(|s| (s.run.step, s.run.epoch));
        match (from_metrics, from_status) {
            (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// When the run reaches the end of its last epoch: the daemon's estimate, else the step
    /// rate over the last minutes of metrics.
    /// How the run ended, once the daemon journaled its stop (the console keeps the events
    /// it was sent, so this survives the daemon exiting). `None` while it runs.
    pub fn ended(&self) -> Option<RunEnding> {
        run_ending(self.journal.events())
    }

    pub fn eta_ms(&self) -> Option<TimestampMs> {
        if self.ended().is_some() {
            return None;
        }
        let status = self.status.as_ref()?;
        if let Some(eta) = status.run.eta_ms {
            return Some(eta);
        }
        let (step, _) = self.step_epoch()?;
        let steps_left = status.run.total_steps.checked_sub(step)?;
        let rate = self.telemetry.step_rate_per_ms(10 * 60 * 1000)?;
        let last_ts = self.telemetry.steps.last()?.0;
        Some(last_ts + (steps_left as f64 / rate) as i64)
    }

    /// The daemon's active alerts, and the console's own verdicts where the daemon sent none
    /// of that detector (`alerts::merged`), most severe first.
    pub fn shown_alerts(&self) -> Vec<(&Alert, Verdict)> {
        alerts::merged(&self.alerts, self.telemetry.console_alerts())
    }

    /// The worst level among the shown alerts: what the header badge says, the daemon's and
    /// the console's verdicts counted once each.
    pub fn worst_alert(&self) -> Option<Severity> {
        self.shown_alerts().iter().map(|(a, _)| a.level).max()
    }

    /// Every shown alert in words, most severe first.
    pub fn explained_alerts(&self) -> Vec<alerts::Explanation> {
        self.shown_alerts()
            .into_iter()
            .map(|(a, verdict)| {
                alerts::explain_as(a, verdict, self.throughput_now(), &self.journal, self.clock)
            })
            .collect()
    }

    /// The Alerts panel's lines: [`App::explained_alerts`] with sibling alerts folded.
    pub fn alert_lines(&self) -> Vec<alerts::Explanation> {
        alerts::group(self.explained_alerts(), self.clock)
    }

    /// The metrics stream: the run's main figures (tok/s, step, loss, ETA). `None` before
    /// its first line.
    pub fn metrics_freshness(&self) -> Option<Freshness> {
        freshness::of_series(&self.telemetry.tokens_per_s, self.now_ms)
    }

    pub fn gpu_freshness(&self) -> Option<Freshness> {
        freshness::of_series(&self.telemetry.gpu_readings, self.now_ms)
    }

    pub fn queue_freshness(&self) -> Option<Freshness> {
        freshness::of_series(&self.telemetry.queue_depth, self.now_ms)
    }

    /// The last status the daemon answered: what the header's run state rests on.
    pub fn status_freshness(&self) -> Option<Freshness> {
        freshness::of_series(&self.status_seen, self.now_ms)
    }

    /// How old the run's figures are when they are stale: the metrics stream's age, or, with
    /// no metrics line yet, the status's. `None` while fresh, or before any data.
    pub fn stale(&self) -> Option<Freshness> {
        self.metrics_freshness()
            .or_else(|| self.status_freshness())
            .filter(Freshness::is_stale)
    }

    /// Neither a metrics line nor a status yet: nothing to call healthy.
    pub fn no_data(&self) -> bool {
        self.telemetry.tokens_per_s.is_empty() && self.status.is_none()
    }

    /// The daemon's word on the run state is not live: the status is stale, or (attached)
    /// the link is down. Then the header says what the daemon last said and when.
    pub fn status_is_old(&self) -> bool {
        let link_down = matches!(self.source, Source::Live { .. })
            && !matches!(self.link, LinkState::Connected { .. });
        link_down || self.status_freshness().is_some_and(|f| f.is_stale())
    }
}
