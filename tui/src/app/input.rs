//! Keys. Destructive actions sit on capital letters only and never run without the modal.
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use dflash_shared::actions::Action;

use super::{consequences, App, Effect, ReplayControl, Source, View};
use crate::actions::{ActionFlow, FlowStep};

/// Every key, as the help screen lists it: (keys, what they do, destructive).
pub const KEYMAP: &[(&str, &str, bool)] = &[
    (
        "1-6",
        "Overview, GPUs, Queue, Caches, Events, Checkpoints",
        false,
    ),
    ("Tab ← → h l", "previous / next view", false),
    ("↑ ↓ k j", "move the selection or scroll", false),
    ("PgUp PgDn g G", "page, first, last", false),
    (
        "/",
        "Events: filter by text (Enter keeps, Esc clears)",
        false,
    ),
    (
        "f",
        "Events: cycle the minimum level (all, warn, crit)",
        false,
    ),
    ("Space + -", "Replay: pause, faster, slower", false),
    ("?", "this help", false),
    (
        "q  Ctrl-C",
        "quit the console (the daemon keeps training)",
        false,
    ),
    ("S", "stop the run: checkpoint, then exit", true),
    ("K", "kill the run: no final checkpoint", true),
    ("P", "stop the run and power off the machine", true),
    ("D", "Caches: delete the selected cache", true),
    ("U", "unlock a locked config key", true),
    ("F", "forget the healthy record (learn anew)", true),
];

const PAGE: usize = 10;

impl App {
    pub(super) fn on_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        if let Some(flow) = &mut self.modal {
            return match flow.on_key(key) {
                FlowStep::Stay => Vec::new(),
                FlowStep::Send(request) => vec![Effect::Send(request)],
                FlowStep::Close(cancel) => {
                    self.modal = None;
                    cancel.map(Effect::Send).into_iter().collect()
                }
            };
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && key.code == KeyCode::Char('c') {
            return vec![Effect::Quit];
        }
        if self.editing_filter {
            self.edit_filter(key);
            return Vec::new();
        }
        if self.help_open {
            match key.code {
                KeyCode::Char('q') => return vec![Effect::Quit],
                KeyCode::Esc | KeyCode::Char('?') | KeyCode::Enter => self.help_open = false,
                _ => {}
            }
            return Vec::new();
        }
        match key.code {
            KeyCode::Char('q') => return vec![Effect::Quit],
            KeyCode::Char('?') => self.help_open = true,
            KeyCode::Char(c @ '1'..='6') => {
                self.view = View::ALL[(c as u8 - b'1') as usize];
            }
            KeyCode::Tab | KeyCode::Right | KeyCode::Char('l') => self.view = self.view.step(true),
            KeyCode::BackTab | KeyCode::Left | KeyCode::Char('h') => {
                self.view = self.view.step(false)
            }
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-(PAGE as i64)),
            KeyCode::PageDown => self.move_selection(PAGE as i64),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(i64::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(i64::MAX / 2),
            KeyCode::Char('/') if self.view == View::Events => self.editing_filter = true,
            KeyCode::Char('f') if self.view == View::Events => {
                self.event_filter.cycle_severity();
                self.selection.events_scroll = 0;
            }
            KeyCode::Esc if self.view == View::Events => {
                self.event_filter.text.clear();
            }
            KeyCode::Char(' ') => return self.replay_control(ReplayControl::TogglePause),
            KeyCode::Char('+') | KeyCode::Char('=') => {
                return self.replay_control(ReplayControl::Faster)
            }
            KeyCode::Char('-') => return self.replay_control(ReplayControl::Slower),
            KeyCode::Char('S') => return self.begin_action(Action::StopRun),
            KeyCode::Char('K') => return self.begin_action(Action::Kill),
            KeyCode::Char('P') => return self.begin_action(Action::PowerOff),
            KeyCode::Char('U') => {
                return self.begin_action(Action::UnlockKey { key: String::new() })
            }
            KeyCode::Char('F') => return self.begin_action(Action::ForgetHealthyRecord),
            KeyCode::Char('D') => {
                if self.view != View::Caches {
                    self.notify("D deletes the cache selected in the Caches view (4)");
                    return Vec::new();
                }
                let Some(name) = self.selected_cache_name() else {
                    self.notify("no cache selected");
                    return Vec::new();
                };
                return self.begin_action(Action::DeleteCache { name });
            }
            _ => {}
        }
        Vec::new()
    }

    fn edit_filter(&mut self, key: KeyEvent) {
        match key.code {
            KeyCode::Enter => self.editing_filter = false,
            KeyCode::Esc => {
                self.event_filter.text.clear();
                self.editing_filter = false;
            }
            KeyCode::Backspace => {
                self.event_filter.text.pop();
            }
            KeyCode::Char(c) => self.event_filter.text.push(c),
            _ => {}
        }
        self.selection.events_scroll = 0;
    }

    fn replay_control(&mut self, control: ReplayControl) -> Vec<Effect> {
        match self.source {
            Source::Replay(_) => vec![Effect::Replay(control)],
            Source::Live { .. } => Vec::new(),
        }
    }

    fn begin_action(&mut self, action: Action) -> Vec<Effect> {
        if matches!(self.source, Source::Replay(_)) {
            self.notify("this is a replay: there is no daemon to act on");
            return Vec::new();
        }
        if self.read_only {
            self.notify("read-only console (--read-only): actions are disabled");
            return Vec::new();
        }
        let Some(run_name) = self.run_name().map(str::to_string) else {
            self.notify("not connected to a run yet: nothing to act on");
            return Vec::new();
        };
        let local = consequences::local_consequences(&action, self);
        let (flow, request) = ActionFlow::start(action, run_name, local);
        self.modal = Some(flow);
        request.map(Effect::Send).into_iter().collect()
    }

    fn selected_cache_name(&self) -> Option<String> {
        let caches = &self.status.as_ref()?.caches;
        caches
            .get(self.selection.cache.min(caches.len().checked_sub(1)?))
            .map(|c| c.name.clone())
    }

    fn move_selection(&mut self, delta: i64) {
        let clamp = |value: usize, len: usize| -> usize {
            let moved = (value as i64).saturating_add(delta).max(0) as usize;
            moved.min(len.saturating_sub(1))
        };
        let status = self.status.as_ref();
        match self.view {
            View::Gpus => {
                let len = self.telemetry.gpus.len();
                self.selection.gpu = clamp(self.selection.gpu, len);
            }
            View::Caches => {
                let len = status.map_or(0, |s| s.caches.len());
                self.selection.cache = clamp(self.selection.cache, len);
            }
            View::Checkpoints => {
                let len = status.map_or(0, |s| s.checkpoints.len());
                self.selection.checkpoint = clamp(self.selection.checkpoint, len);
            }
            View::Events => {
                // Up scrolls back in time: the offset counts from the newest event.
                let len = self.journal.filtered(&self.event_filter).count();
                let offset = (self.selection.events_scroll as i64).saturating_sub(delta);
                self.selection.events_scroll = (offset.max(0) as usize).min(len.saturating_sub(1));
            }
            View::Overview | View::Queue => {}
        }
    }
}
