//! Destructive requests as pending actions: pure logic, no I/O.
//!
//! A request only files a [`PendingAction`] with its consequences worded from a [`StateView`].
//! It runs after a confirmation that names its id and carries the typed run name, and only if
//! the state checks still pass at that moment (the run may have moved on since the request).
//! Unconfirmed actions expire.
use std::collections::{BTreeMap, VecDeque};

use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::metrics::{CacheState, TimestampMs};
use dflash_shared::protocol::ErrorCode;
use dflash_shared::status::{CheckpointInfo, RunState};
use thiserror::Error;

use dflash_shared::format::{format_ago, format_bytes, format_duration_ms, format_tokens_per_s};

/// Keys that cannot change on resume or at run time without a confirmed unlock: the config's
/// dotted paths (`training.epochs`), which is what consoles send.
pub use dflash_shared::config::UNLOCKABLE_KEYS;
pub const DEFAULT_TTL_MS: i64 = 5 * 60_000;
/// Ids of recently expired actions, kept to tell "expired" apart from "never existed".
const EXPIRED_MEMORY: usize = 64;
/// Unconfirmed actions one control connection may hold at once. A console files one at a
/// time; more from one connection is a script gone wrong, and each one grows every status.
pub const DEFAULT_MAX_PENDING_PER_CLIENT: usize = 4;
/// Unconfirmed actions in all. Bounds the status reply (every pending action is listed in it)
/// far below the frame limit, whatever the clients do.
pub const DEFAULT_MAX_PENDING_TOTAL: usize = 32;

/// What the operator configured about destructive actions.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionPolicy {
    pub run_name: String,
    pub ttl_ms: i64,
    /// argv of the power-off command; `None` disables power-off (the default).
    pub poweroff_command: Option<Vec<String>>,
    /// The locked keys an unlock may name: those it can carry a run across
    /// (`dflash_shared::config::keys`, `Unlockable`).
    pub unlockable_keys: Vec<String>,
    pub max_pending_per_client: usize,
    pub max_pending_total: usize,
}

impl ActionPolicy {
    pub fn new(run_name: impl Into<String>) -> Self {
        ActionPolicy {
            run_name: run_name.into(),
            ttl_ms: DEFAULT_TTL_MS,
            poweroff_command: None,
            unlockable_keys: UNLOCKABLE_KEYS.iter().map(|k| k.to_string()).collect(),
            max_pending_per_client: DEFAULT_MAX_PENDING_PER_CLIENT,
            max_pending_total: DEFAULT_MAX_PENDING_TOTAL,
        }
    }
}

impl ActionPolicy {
    /// The dotted locked key `key` names: the key itself, its last segment (`epochs` for
    /// `training.epochs`) or `anchors` for `training.num_anchors`. `None` if it names none.
    pub fn canonical_locked_key(&self, key: &str) -> Option<String> {
        if self.unlockable_keys.iter().any(|k| k == key) {
            return Some(key.to_string());
        }
        let short = if key == "anchors" { "num_anchors" } else { key };
        let mut matches = self
            .unlockable_keys
            .iter()
            .filter(|k| k.rsplit('.').next() == Some(short));
        match (matches.next(), matches.next()) {
            (Some(only), None) => Some(only.clone()),
            _ => None,
        }
    }
}

/// The state an action is judged against, taken at request and again at confirmation.
#[derive(Debug, Clone, PartialEq)]
pub struct StateView {
    pub now_ms: TimestampMs,
    pub run_state: RunState,
    pub step: u64,
    pub last_checkpoint: Option<CheckpointInfo>,
    pub tokens_per_s: Option<f64>,
    /// Since when throughput has held its level, if the detectors call it stable.
    pub stable_since_ms: Option<TimestampMs>,
    pub caches: Vec<CacheState>,
    pub unlocked_keys: Vec<String>,
    /// The healthy record the run is judged against, if any.
    pub healthy_record: Option<HealthyRecordView>,
    /// The healthy record files that exist (the run dir's, the recipe's): what a forget removes.
    pub healthy_record_files: Vec<String>,
}

/// What a forget request says about the record it removes.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthyRecordView {
    pub tokens_per_s: f64,
    pub recorded_ms: TimestampMs,
    pub run_name: String,
    pub step: u64,
}

impl StateView {
    /// Whether worker threads are alive and may touch compile caches.
    pub fn workers_running(&self) -> bool {
        !matches!(
            self.run_state,
            RunState::Paused | RunState::Finished | RunState::Failed
        )
    }
}

/// Who files a request: the peer's uid (SO_PEERCRED) and the control connection it came over.
/// Every peer the daemon admits shares one uid, so "per client" counts by connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requester {
    pub uid: u32,
    pub connection: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ActionError {
    #[error("no pending action {0}")]
    NoSuchAction(String),
    #[error("pending action {id} expired at its deadline; file the request again")]
    Expired { id: String },
    #[error(
        "the typed run name {typed:?} does not match this run ({expected:?}); nothing was done"
    )]
    WrongRunName { typed: String, expected: String },
    #[error("refused: {0}")]
    Refused(String),
    #[error(
        "{held} unconfirmed actions are already pending ({scope} limit {limit}); confirm one \
         (`dflash-tui confirm-stop`), cancel one, or wait until the oldest expires in {expires_in}"
    )]
    TooManyPending {
        held: usize,
        limit: usize,
        scope: &'static str,
        expires_in: String,
    },
}

impl ActionError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ActionError::NoSuchAction(_) | ActionError::Expired { .. } => ErrorCode::NoSuchAction,
            ActionError::WrongRunName { .. } => ErrorCode::WrongRunName,
            ActionError::Refused(_) | ActionError::TooManyPending { .. } => ErrorCode::Refused,
        }
    }
}

/// A confirmed action that passed its re-check; the caller carries it out.
#[derive(Debug, Clone, PartialEq)]
pub struct Approved {
    pub pending: PendingAction,
    /// For `DeleteCache`: the directory judged at request time (re-verified at confirmation).
    pub cache_path: Option<String>,
}

#[derive(Debug, Clone)]
struct Entry {
    pending: PendingAction,
    cache_path: Option<String>,
    connection: u64,
}

#[derive(Debug, Default)]
pub struct PendingActions {
    entries: BTreeMap<String, Entry>,
    recently_expired: VecDeque<String>,
}

/// A short id such as "stop-3fa9c2"; `nonce` comes from the caller's RNG.
pub fn action_id(action: &Action, nonce: u32) -> String {
    let kind = match action {
        Action::StopRun => "stop",
        Action::Kill => "kill",
        Action::PowerOff => "poweroff",
        Action::DeleteCache { .. } => "delcache",
        Action::UnlockKey { .. } => "unlock",
        Action::ForgetHealthyRecord => "forget",
    };
    format!("{kind}-{:06x}", nonce & 0xff_ffff)
}

impl PendingActions {
    /// Files `action` if its state checks pass. `id` must be unique (see [`action_id`]).
    pub fn request(
        &mut self,
        id: String,
        action: Action,
        by: Requester,
        view: &StateView,
        policy: &ActionPolicy,
    ) -> Result<PendingAction, ActionError> {
        self.expire(view.now_ms);
        self.check_room(by, view.now_ms, policy)?;
        let cache_path = check(&action, view, policy)?;
        if self.entries.contains_key(&id) {
            return Err(ActionError::Refused(format!(
                "action id {id} is already in use"
            )));
        }
        let pending = PendingAction {
            id: id.clone(),
            consequences: consequences(&action, view, policy),
            action,
            requested_by_uid: by.uid,
            created_ms: view.now_ms,
            expires_ms: view.now_ms + policy.ttl_ms,
        };
        self.entries.insert(
            id,
            Entry {
                pending: pending.clone(),
                cache_path,
                connection: by.connection,
            },
        );
        Ok(pending)
    }

    /// Refuses a new request when its connection, or the daemon as a whole, holds the most
    /// unconfirmed actions it may. The refusal says when room frees up by itself.
    fn check_room(
        &self,
        by: Requester,
        now_ms: TimestampMs,
        policy: &ActionPolicy,
    ) -> Result<(), ActionError> {
        let mine: Vec<&Entry> = self
            .entries
            .values()
            .filter(|e| e.connection == by.connection)
            .collect();
        let full = |held: Vec<&Entry>, limit: usize, scope: &'static str| {
            let oldest = held
                .iter()
                .map(|e| e.pending.expires_ms)
                .min()
                .unwrap_or(now_ms);
            ActionError::TooManyPending {
                held: held.len(),
                limit,
                scope,
                expires_in: format_duration_ms((oldest - now_ms).max(0)),
            }
        };
        if mine.len() >= policy.max_pending_per_client {
            return Err(full(mine, policy.max_pending_per_client, "per-connection"));
        }
        if self.entries.len() >= policy.max_pending_total {
            let all = self.entries.values().collect();
            return Err(full(all, policy.max_pending_total, "daemon-wide"));
        }
        Ok(())
    }

    /// Confirms `id`. The run name must be typed exactly; the state is checked again.
    /// A wrong run name leaves the action pending (a typo should not cost a new request);
    /// a failed re-check removes it, since its consequences no longer describe the state.
    pub fn confirm(
        &mut self,
        id: &str,
        typed_run_name: &str,
        view: &StateView,
        policy: &ActionPolicy,
    ) -> Result<Approved, ActionError> {
        self.expire(view.now_ms);
        let Some(entry) = self.entries.get(id) else {
            return Err(self.missing(id));
        };
        if typed_run_name != policy.run_name {
            return Err(ActionError::WrongRunName {
                typed: typed_run_name.to_string(),
                expected: policy.run_name.clone(),
            });
        }
        let recheck = check(&entry.pending.action, view, policy);
        let entry = self.entries.remove(id).expect("entry was just found");
        let cache_path = recheck?;
        if cache_path != entry.cache_path {
            return Err(ActionError::Refused(format!(
                "the cache directory changed since the request ({:?} -> {:?}); file the request again",
                entry.cache_path, cache_path
            )));
        }
        Ok(Approved {
            pending: entry.pending,
            cache_path,
        })
    }

    pub fn cancel(&mut self, id: &str, now_ms: TimestampMs) -> Result<PendingAction, ActionError> {
        self.expire(now_ms);
        match self.entries.remove(id) {
            Some(e) => Ok(e.pending),
            None => Err(self.missing(id)),
        }
    }

    /// Removes and returns the actions whose deadline has passed.
    pub fn expire(&mut self, now_ms: TimestampMs) -> Vec<PendingAction> {
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.pending.expires_ms <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        let mut out = Vec::with_capacity(expired.len());
        for id in expired {
            if let Some(e) = self.entries.remove(&id) {
                out.push(e.pending);
            }
            if self.recently_expired.len() == EXPIRED_MEMORY {
                self.recently_expired.pop_front();
            }
            self.recently_expired.push_back(id);
        }
        out
    }

    /// Pending actions, oldest first.
    pub fn list(&self) -> Vec<PendingAction> {
        let mut v: Vec<_> = self.entries.values().map(|e| e.pending.clone()).collect();
        v.sort_by_key(|p| p.created_ms);
        v
    }

    fn missing(&self, id: &str) -> ActionError {
        if self.recently_expired.iter().any(|e| e == id) {
            ActionError::Expired { id: id.to_string() }
        } else {
            ActionError::NoSuchAction(id.to_string())
        }
    }
}

/// The state checks of `action`; returns the cache directory a `DeleteCache` would remove.
fn check(
    action: &Action,
    view: &StateView,
    policy: &ActionPolicy,
) -> Result<Option<String>, ActionError> {
    let refuse = |m: String| Err(ActionError::Refused(m));
    match action {
        Action::StopRun | Action::Kill | Action::PowerOff
            if matches!(view.run_state, RunState::Stopping | RunState::Finished) =>
        {
            refuse(format!("the run is already {}", state_word(view.run_state)))
        }
        Action::PowerOff if policy.poweroff_command.is_none() => refuse(
            "power-off is disabled; set control.poweroff_command in the config to enable it".into(),
        ),
        Action::StopRun | Action::Kill | Action::PowerOff => Ok(None),
        Action::DeleteCache { name } => {
            let Some(cache) = view.caches.iter().find(|c| &c.name == name) else {
                let known: Vec<&str> = view.caches.iter().map(|c| c.name.as_str()).collect();
                return refuse(format!(
                    "no cache named {name:?}; known caches: {}",
                    known.join(", ")
                ));
            };
            if view.workers_running() {
                return refuse(format!(
                    "workers are running (run is {}); deleting the {name} cache under live workers \
                     forces a cold recompile that can race first compilation. Stop the run first",
                    state_word(view.run_state)
                ));
            }
            if !cache.present {
                return refuse(format!(
                    "the {name} cache at {} is not there; nothing to delete",
                    cache.path
                ));
            }
            Ok(Some(cache.path.clone()))
        }
        Action::UnlockKey { key } => {
            let Some(canonical) = policy.canonical_locked_key(key) else {
                let named = |k: &&str| *k == key || k.rsplit('.').next() == Some(key);
                let why = if dflash_shared::config::LOCKED_KEYS.iter().any(named) {
                    "is fixed for the run: no unlock can carry a change of it (start a new run \
                     in another run dir)"
                } else {
                    "is not a locked key"
                };
                return refuse(format!(
                    "{key:?} {why}; the keys an unlock can carry are {}",
                    policy.unlockable_keys.join(", ")
                ));
            };
            let already = view
                .unlocked_keys
                .iter()
                .any(|k| policy.canonical_locked_key(k).as_deref() == Some(canonical.as_str()));
            if already {
                return refuse(format!("{key:?} is already unlocked"));
            }
            Ok(None)
        }
        Action::ForgetHealthyRecord
            if view.healthy_record.is_none() && view.healthy_record_files.is_empty() =>
        {
            refuse(
                "there is no healthy record to forget: throughput is judged against this run's                  own rate, and no record is on file for this run or its recipe"
                    .into(),
            )
        }
        Action::ForgetHealthyRecord => Ok(None),
    }
}

/// Sentences that tell the operator what the action costs, from the current state.
pub fn consequences(action: &Action, view: &StateView, policy: &ActionPolicy) -> Vec<String> {
    let mut out = Vec::new();
    let checkpoint = match &view.last_checkpoint {
        Some(c) => format!(
            "last checkpoint {} (step {})",
            format_ago(c.written_ms, view.now_ms),
            c.step
        ),
        None => "no checkpoint written yet".to_string(),
    };
    let throughput = match (view.tokens_per_s, view.stable_since_ms) {
        (Some(t), Some(since)) => Some(format!(
            "stable at {} tok/s for {}",
            format_tokens_per_s(t),
            format_duration_ms(view.now_ms - since)
        )),
        (Some(t), None) => Some(format!(
            "running at {} tok/s (not yet stable)",
            format_tokens_per_s(t)
        )),
        (None, _) => None,
    };
    match action {
        Action::StopRun | Action::PowerOff => {
            out.push(checkpoint);
            out.extend(throughput);
            out.push(format!(
                "writes a final checkpoint at step {}, then the daemon exits",
                view.step
            ));
            if let (Action::PowerOff, Some(cmd)) = (action, &policy.poweroff_command) {
                out.push(format!(
                    "then runs `{}` to power off the machine",
                    cmd.join(" ")
                ));
            }
        }
        Action::Kill => {
            out.push(checkpoint);
            out.extend(throughput);
            let lost = match &view.last_checkpoint {
                Some(c) => format!(
                    "steps {}..{} since the last checkpoint are lost",
                    c.step + 1,
                    view.step
                ),
                None => format!("all {} steps of this run are lost", view.step),
            };
            out.push(format!("no final checkpoint: {lost}"));
        }
        Action::DeleteCache { name } => {
            if let Some(c) = view.caches.iter().find(|c| &c.name == name) {
                out.push(format!(
                    "{} cache, {} entries at {}",
                    format_bytes(c.size_bytes),
                    c.entries,
                    c.path
                ));
            }
            out.push(
                "the next start recompiles cold (minutes per device before full speed)".into(),
            );
        }
        Action::UnlockKey { key } => {
            out.push(format!(
                "{key:?} may then change on resume; the change is journaled"
            ));
            // What an unlock cannot admit, said before the operator confirms it.
            if policy.canonical_locked_key(key).as_deref() == Some("drafter.target_layer_ids") {
                out.push(
                    "tap layers may move, but their number may not: it sets the drafter's fc \
                     input width, and a resume with another count is still refused"
                        .into(),
                );
            }
            out.push(
                "a run resumed with a different value is no longer comparable to its history"
                    .into(),
            );
        }
        Action::ForgetHealthyRecord => {
            if let Some(r) = &view.healthy_record {
                out.push(format!(
                    "throughput is judged against {} tok/s, recorded {} by run {} at step {}",
                    format_tokens_per_s(r.tokens_per_s),
                    format_ago(r.recorded_ms, view.now_ms),
                    r.run_name,
                    r.step
                ));
            }
            out.extend(throughput);
            for file in &view.healthy_record_files {
                out.push(format!("deletes {file}"));
            }
            out.push(
                "the baseline is then learned from this run's own rate: a slow rate now is \
                 learned as normal, and a restart or a new run of this recipe is no longer \
                 judged against the record"
                    .into(),
            );
            out.push(
                "a new record is written once the run has been healthy again for \
                 detectors.healthy.after_ok_s"
                    .into(),
            );
        }
    }
    out
}

fn state_word(s: RunState) -> &'static str {
    match s {
        RunState::Starting => "starting",
        RunState::WarmingUp => "warming up",
        RunState::Training => "training",
        RunState::Evaluating => "evaluating",
        RunState::Checkpointing => "checkpointing",
        RunState::Paused => "paused",
        RunState::Stopping => "stopping",
        RunState::Finished => "finished",
        RunState::Failed => "failed",
    }
}

#[cfg(test)]
#[path = "pending_tests.rs"]
mod tests;
