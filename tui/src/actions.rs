//! One flow for every destructive action: request → the daemon files a pending action and
//! states its consequences → the operator types the run name → confirm. Escape at any point
//! cancels, and the daemon is told so.
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::protocol::{Request, Response};

/// Keys the daemon refuses to change without an unlock, as dotted config paths.
pub use dflash_shared::config::UNLOCKABLE_KEYS;

/// How the console tells the daemon who confirmed.
pub const VIA_TUI: &str = "tui";

#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Unlock only: pick which locked key.
    ChoosingKey {
        index: usize,
    },
    /// Asked the daemon to file the request; waiting for the pending action.
    Requesting,
    /// The daemon filed it; the operator types the run name.
    Confirming {
        pending: PendingAction,
        typed: String,
        mismatch: bool,
    },
    Submitting {
        pending: PendingAction,
    },
    Done {
        outcome: String,
    },
    Failed {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ActionFlow {
    pub action: Action,
    pub run_name: String,
    /// What the console itself sees: last checkpoint, current throughput, cache size.
    pub local_consequences: Vec<String>,
    pub stage: Stage,
}

/// What the flow asks of the app after a key or a reply.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowStep {
    Stay,
    Send(Request),
    /// Close the modal, optionally telling the daemon first (cancel a filed action).
    Close(Option<Request>),
}

impl ActionFlow {
    /// Starts a flow; the returned request files the pending action (none yet when a key must
    /// be chosen first).
    pub fn start(
        action: Action,
        run_name: String,
        local_consequences: Vec<String>,
    ) -> (Self, Option<Request>) {
        let choosing = matches!(action, Action::UnlockKey { .. });
        let flow = Self {
            stage: if choosing {
                Stage::ChoosingKey { index: 0 }
            } else {
                Stage::Requesting
            },
            action: action.clone(),
            run_name,
            local_consequences,
        };
        let request = (!choosing).then_some(Request::RequestAction { action });
        (flow, request)
    }

    pub fn pending(&self) -> Option<&PendingAction> {
        match &self.stage {
            Stage::Confirming { pending, .. } | Stage::Submitting { pending } => Some(pending),
            _ => None,
        }
    }

    pub fn on_key(&mut self, key: KeyEvent) -> FlowStep {
        let ctrl_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        if key.code == KeyCode::Esc || ctrl_c {
            let cancel = self.pending().map(|p| Request::Cancel {
                action_id: p.id.clone(),
            });
            return FlowStep::Close(cancel);
        }
        match &mut self.stage {
            Stage::ChoosingKey { index } => match key.code {
                KeyCode::Up | KeyCode::Char('k') => {
                    *index = index.saturating_sub(1);
                    FlowStep::Stay
                }
                KeyCode::Down | KeyCode::Char('j') => {
                    *index = (*index + 1).min(UNLOCKABLE_KEYS.len() - 1);
                    FlowStep::Stay
                }
                KeyCode::Enter => {
                    let key = UNLOCKABLE_KEYS[*index].to_string();
                    self.action = Action::UnlockKey { key };
                    self.stage = Stage::Requesting;
                    FlowStep::Send(Request::RequestAction {
                        action: self.action.clone(),
                    })
                }
                _ => FlowStep::Stay,
            },
            Stage::Confirming {
                pending,
                typed,
                mismatch,
            } => match key.code {
                KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                    typed.push(c);
                    *mismatch = false;
                    FlowStep::Stay
                }
                KeyCode::Backspace => {
                    typed.pop();
                    *mismatch = false;
                    FlowStep::Stay
                }
                KeyCode::Enter if *typed == self.run_name => {
                    let request = Request::Confirm {
                        action_id: pending.id.clone(),
                        run_name: typed.clone(),
                        via: VIA_TUI.into(),
                    };
                    self.stage = Stage::Submitting {
                        pending: pending.clone(),
                    };
                    FlowStep::Send(request)
                }
                KeyCode::Enter => {
                    *mismatch = true;
                    FlowStep::Stay
                }
                _ => FlowStep::Stay,
            },
            Stage::Requesting | Stage::Submitting { .. } => FlowStep::Stay,
            Stage::Done { .. } | Stage::Failed { .. } => FlowStep::Close(None),
        }
    }

    /// Takes the daemon's reply to a request this flow sent. Returns false when the reply is
    /// not this flow's (the app then handles it).
    pub fn on_reply(&mut self, request: &Request, result: &Result<Response, String>) -> bool {
        match (request, &self.stage) {
            (Request::RequestAction { action }, Stage::Requesting) if *action == self.action => {
                self.stage = match result {
                    Ok(Response::Pending { action }) => Stage::Confirming {
                        pending: action.clone(),
                        typed: String::new(),
                        mismatch: false,
                    },
                    Ok(other) => Stage::Failed {
                        message: format!("unexpected reply to the request: {other:?}"),
                    },
                    Err(message) => Stage::Failed {
                        message: message.clone(),
                    },
                };
                true
            }
            (Request::Confirm { action_id, .. }, Stage::Submitting { pending })
                if *action_id == pending.id =>
            {
                self.stage = match result {
                    Ok(Response::Executed { outcome, .. }) => Stage::Done {
                        outcome: outcome.clone(),
                    },
                    Ok(Response::Ok) => Stage::Done {
                        outcome: "confirmed; the daemon is acting on it".into(),
                    },
                    Ok(other) => Stage::Failed {
                        message: format!("unexpected reply to the confirmation: {other:?}"),
                    },
                    Err(message) => Stage::Failed {
                        message: message.clone(),
                    },
                };
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn pending(action: Action) -> PendingAction {
        PendingAction {
            id: "act-7".into(),
            action,
            requested_by_uid: 1000,
            created_ms: 0,
            expires_ms: 300_000,
            consequences: vec!["last checkpoint 14 min ago".into()],
        }
    }

    fn type_text(flow: &mut ActionFlow, text: &str) {
        for c in text.chars() {
            assert_eq!(flow.on_key(key(KeyCode::Char(c))), FlowStep::Stay);
        }
    }

    #[test]
    fn stop_needs_the_exact_run_name_before_confirming() {
        let (mut flow, request) = ActionFlow::start(Action::StopRun, "qwen-drafter".into(), vec![]);
        let request = request.expect("files the request at once");
        assert_eq!(
            request,
            Request::RequestAction {
                action: Action::StopRun
            }
        );
        let reply = Ok(Response::Pending {
            action: pending(Action::StopRun),
        });
        assert!(flow.on_reply(&request, &reply));

        type_text(&mut flow, "qwen");
        assert_eq!(flow.on_key(key(KeyCode::Enter)), FlowStep::Stay);
        assert!(matches!(
            flow.stage,
            Stage::Confirming { mismatch: true, .. }
        ));

        type_text(&mut flow, "-drafter");
        let confirm = match flow.on_key(key(KeyCode::Enter)) {
            FlowStep::Send(request) => request,
            other => panic!("expected a confirmation, got {other:?}"),
        };
        assert_eq!(
            confirm,
            Request::Confirm {
                action_id: "act-7".into(),
                run_name: "qwen-drafter".into(),
                via: "tui".into(),
            }
        );
        let done = Ok(Response::Executed {
            action_id: "act-7".into(),
            outcome: "checkpoint step 1200 written; stopping".into(),
        });
        assert!(flow.on_reply(&confirm, &done));
        assert!(matches!(flow.stage, Stage::Done { .. }));
        assert_eq!(flow.on_key(key(KeyCode::Char('x'))), FlowStep::Close(None));
    }

    #[test]
    fn escape_after_filing_cancels_the_pending_action() {
        let (mut flow, request) = ActionFlow::start(Action::PowerOff, "run".into(), vec![]);
        flow.on_reply(
            &request.unwrap(),
            &Ok(Response::Pending {
                action: pending(Action::PowerOff),
            }),
        );
        assert_eq!(
            flow.on_key(key(KeyCode::Esc)),
            FlowStep::Close(Some(Request::Cancel {
                action_id: "act-7".into()
            }))
        );
    }

    #[test]
    fn unlock_asks_which_key_before_filing() {
        let (mut flow, request) = ActionFlow::start(
            Action::UnlockKey { key: String::new() },
            "run".into(),
            vec![],
        );
        assert!(request.is_none());
        flow.on_key(key(KeyCode::Down));
        flow.on_key(key(KeyCode::Char('j')));
        assert_eq!(
            flow.on_key(key(KeyCode::Enter)),
            FlowStep::Send(Request::RequestAction {
                action: Action::UnlockKey {
                    key: UNLOCKABLE_KEYS[2].into()
                }
            })
        );
    }

    #[test]
    fn a_refusal_is_shown_and_replies_for_other_requests_are_not_taken() {
        let (mut flow, request) = ActionFlow::start(Action::Kill, "run".into(), vec![]);
        assert!(!flow.on_reply(&Request::Status, &Ok(Response::Ok)));
        assert!(flow.on_reply(
            &request.unwrap(),
            &Err("the daemon refused (NotPermitted)".into())
        ));
        assert!(matches!(flow.stage, Stage::Failed { .. }));
    }
}
