//! Which node of a job stopped taking part, through the job's store (issue 23): every node's
//! daemon bumps a heartbeat counter in the TCPStore from a thread of its own, reads every
//! other node's, and a second thread judges them. Liveness only: no gradient and no number
//! of the training passes here; those go through Gloo or NCCL.
//!
//! Why a heartbeat: in a group of more than two ranks Gloo names a lost peer by its address
//! (`[10.0.0.2]:41234`), not its rank, and a node that hangs without closing its sockets (a
//! stopped process, a frozen host, a cut link) is only noticed at the collective timeout. A
//! counter that stops advancing names the node by its rank, and within a bound of its own:
//! the judge names a node whose counter has not moved for `timeout` (`nodes.heartbeat_timeout_s`),
//! and looks every half period, so a silent node is named within
//! [`LivenessBounds::bound`] = `timeout` + one period (a fifth of it), plus a store round trip.
//! Node 0 serves the store, so a store that refuses (node 0's process is gone) names node 0
//! at once, and a store operation outstanding for longer than `timeout` (node 0 stopped)
//! names it within the same bound.
//!
//! On a verdict the judge aborts this node's endpoints of the gradient group (a rank waiting
//! for the silent node returns at once, see `GlooGroup`'s abort), journals one line, and marks
//! this node as having left the group, so a node that comes back (a stopped process
//! continued) reads why its peers went. A node that stops on a failure of its own marks the
//! same ([`Liveness::quit`]); one whose run ends marks that it left ([`Drop`]), which names it
//! without an abort: its sockets close, so its peers' collectives fail by themselves.
//!
//! The judging is [`Watch`], pure, on milliseconds of a monotonic clock the threads read;
//! every node judges by its own clock, so no clock is compared across machines.
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::store::{StoreError, TcpStore};
use crate::collective::allreduce::AbortGroup;

/// The smallest heartbeat period: a timeout of one second beats every 200 ms, and none beats
/// faster than this, whatever the timeout.
const MIN_PERIOD: Duration = Duration::from_millis(100);

/// How often a node beats and how long a silence it forgives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessBounds {
    /// A node whose heartbeat has not advanced for longer than this is silent.
    pub timeout: Duration,
}

impl LivenessBounds {
    /// Beats and looks five times per timeout: a live node's counter moves several times
    /// within any window of `timeout`, even when one beat is late.
    pub fn period(&self) -> Duration {
        (self.timeout / 5).max(MIN_PERIOD)
    }

    /// The longest a silent node goes unnamed: its last beat is at most `timeout` old when
    /// the judge last found it fresh, and the judge looks every half period.
    pub fn bound(&self) -> Duration {
        self.timeout + self.period()
    }
}

/// Why a node no longer takes part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Silence {
    /// Its heartbeat did not advance for `for_ms`, more than the timeout.
    Stopped {
        node: u32,
        for_ms: u64,
        timeout_ms: u64,
    },
    /// The store node 0 serves refused an operation: node 0's process is gone.
    StoreLost { detail: String },
    /// A store operation has been outstanding for `for_ms`: node 0 (which serves the store)
    /// stopped, or the link to it is cut.
    StoreSilent { for_ms: u64, timeout_ms: u64 },
    /// The node gave up its part of the group: a failure of its own, or it found another node
    /// silent (`reason`).
    Quit { node: u32, reason: String },
    /// The node's run ended and it left the job (its schedule ended, or it was stopped).
    Left { node: u32 },
}

impl Silence {
    /// The node this names.
    pub fn node(&self) -> u32 {
        match self {
            Silence::Stopped { node, .. } | Silence::Quit { node, .. } | Silence::Left { node } => {
                *node
            }
            Silence::StoreLost { .. } | Silence::StoreSilent { .. } => 0,
        }
    }

    /// Whether this node's group must be aborted: every silence but a node that left, whose
    /// closed sockets end its peers' collectives by themselves (and whose last collective may
    /// still be completing on a slower peer, which an abort would fail).
    pub fn aborts(&self) -> bool {
        !matches!(self, Silence::Left { .. })
    }
}

/// A silence, to the hundredth: just past a timeout of 2 s reads 2.05 s, not 2.0 s.
fn seconds(ms: u64) -> String {
    format!("{:.2} s", ms as f64 / 1e3)
}

/// The timeout as the config writes it (`2`, `2.5`, `10`).
fn timeout_text(ms: u64) -> String {
    format!("{}", ms as f64 / 1e3)
}

impl std::fmt::Display for Silence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Silence::Stopped {
                node,
                for_ms,
                timeout_ms,
            } => write!(
                f,
                "node {node}'s heartbeat has not advanced for {}, more than \
                 nodes.heartbeat_timeout_s = {}: its process stopped or hung, or its host froze \
                 or lost the network",
                seconds(*for_ms),
                timeout_text(*timeout_ms)
            ),
            Silence::StoreLost { detail } => write!(
                f,
                "node 0 is gone: the job's store it serves refused ({detail})"
            ),
            Silence::StoreSilent { for_ms, timeout_ms } => write!(
                f,
                "node 0, which serves the job's store, has not answered for {}, more than \
                 nodes.heartbeat_timeout_s = {}: its process stopped or hung, or its host froze \
                 or lost the network",
                seconds(*for_ms),
                timeout_text(*timeout_ms)
            ),
            Silence::Quit { node, reason } => write!(
                f,
                "node {node} left the gradient group ({reason}); its journal says more"
            ),
            Silence::Left { node } => write!(f, "node {node}'s run ended and it left the job"),
        }
    }
}

/// What one node has seen of another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerState {
    Beating,
    Left,
    Quit(String),
}

#[derive(Debug, Clone)]
struct Peer {
    count: i64,
    changed_at: u64,
    state: PeerState,
}

/// One node's judgement of the others, pure: fed what the heartbeat thread read and when
/// (milliseconds of one monotonic clock), asked for a verdict on every tick.
#[derive(Debug, Clone)]
pub struct Watch {
    me: u32,
    timeout_ms: u64,
    peers: Vec<Peer>,
    op_since: Option<u64>,
    store_lost: Option<String>,
    last_tick: u64,
}

impl Watch {
    /// Node `me` of `nnodes`, at `now`: every node counts as fresh now (the heartbeats start
    /// together, right after the group's join, which every rank waits for).
    pub fn new(me: u32, nnodes: u32, timeout: Duration, now: u64) -> Self {
        let peer = Peer {
            count: 0,
            changed_at: now,
            state: PeerState::Beating,
        };
        Watch {
            me,
            timeout_ms: timeout.as_millis().max(1) as u64,
            peers: vec![peer; nnodes as usize],
            op_since: None,
            store_lost: None,
            last_tick: now,
        }
    }

    /// Node `node`'s counter read `count` at `now`.
    pub fn beat_seen(&mut self, node: u32, count: i64, now: u64) {
        if let Some(p) = self.peers.get_mut(node as usize) {
            if p.count != count {
                p.count = count;
                p.changed_at = now;
            }
        }
    }

    /// Node `node` marked that it left or quit (a mark, once made, stays).
    pub fn state_seen(&mut self, node: u32, state: PeerState) {
        if let Some(p) = self.peers.get_mut(node as usize) {
            if p.state == PeerState::Beating {
                p.state = state;
            }
        }
    }

    pub fn op_started(&mut self, now: u64) {
        self.op_since = Some(now);
    }

    pub fn op_ended(&mut self) {
        self.op_since = None;
    }

    /// A store operation failed: the store's host (node 0) is gone.
    pub fn store_failed(&mut self, detail: String) {
        self.op_since = None;
        self.store_lost.get_or_insert(detail);
    }

    /// The verdict at `now`, if any. A node that left is named only when nothing else is (it
    /// never aborts). A tick long after the last one (this process was itself stopped, or
    /// starved of the CPU for half the timeout) judges nobody: every node is counted fresh
    /// from now, so a node that was stopped and continued does not blame the others for its
    /// own gap.
    pub fn tick(&mut self, now: u64) -> Option<Silence> {
        let gap = now.saturating_sub(self.last_tick);
        self.last_tick = now;
        if gap > self.timeout_ms / 2 {
            for p in &mut self.peers {
                p.changed_at = p.changed_at.max(now);
            }
            if let Some(since) = self.op_since.as_mut() {
                *since = (*since).max(now);
            }
            return None;
        }
        let me = self.me;
        let others: Vec<(u32, &Peer)> = (0u32..)
            .zip(&self.peers)
            .filter(|(n, _)| *n != me)
            .collect();
        let quit = others.iter().find_map(|(n, p)| match &p.state {
            PeerState::Quit(reason) => Some((*n, reason.clone())),
            _ => None,
        });
        if let Some((node, reason)) = quit {
            return Some(Silence::Quit { node, reason });
        }
        let node0_left = self.me != 0 && self.peers[0].state == PeerState::Left;
        if let Some(detail) = &self.store_lost {
            if self.me != 0 {
                return Some(if node0_left {
                    Silence::Left { node: 0 }
                } else {
                    Silence::StoreLost {
                        detail: detail.clone(),
                    }
                });
            }
        }
        if let Some(since) = self.op_since {
            let for_ms = now.saturating_sub(since);
            if self.me != 0 && !node0_left && for_ms > self.timeout_ms {
                return Some(Silence::StoreSilent {
                    for_ms,
                    timeout_ms: self.timeout_ms,
                });
            }
        }
        // While a store operation is outstanding, nothing new can be read of anyone: each
        // node's silence counts only up to the operation's start, and the store's host is
        // judged by the operation instead (above). Otherwise a stopped store host would make
        // every node look silent, and the one whose counter last moved earliest be named.
        let read_until = self.op_since.unwrap_or(now);
        let stopped = others
            .iter()
            .filter(|(_, p)| p.state == PeerState::Beating)
            .map(|(n, p)| (*n, read_until.saturating_sub(p.changed_at)))
            .filter(|(_, for_ms)| *for_ms > self.timeout_ms)
            .max_by_key(|(n, for_ms)| (*for_ms, std::cmp::Reverse(*n)));
        if let Some((node, for_ms)) = stopped {
            return Some(Silence::Stopped {
                node,
                for_ms,
                timeout_ms: self.timeout_ms,
            });
        }
        others
            .iter()
            .find(|(_, p)| p.state == PeerState::Left)
            .map(|(node, _)| Silence::Left { node: *node })
    }
}

/// What the daemon hands the judge: the endpoints to abort and where to journal.
pub struct OnSilence {
    /// This node's endpoints of the gradient group.
    pub aborts: Vec<Arc<dyn AbortGroup>>,
    /// One line per verdict that aborts (never for a node that left).
    pub journal: Box<dyn Fn(String) + Send + Sync>,
}

#[derive(Default)]
struct State {
    watch: Option<Watch>,
    /// The first verdict that aborted; it stays.
    verdict: Option<Silence>,
    /// A node that left, the latest seen.
    left: Option<Silence>,
    /// This node's own mark, to publish: `quit: reason` (the first reason stays).
    quit: Option<String>,
    quit_published: bool,
    /// Nodes known gone (a verdict named them, or a collective lost them): node 0's leaving
    /// does not wait for their marks.
    gone: Vec<u32>,
    stop: bool,
    /// The heartbeat thread wrote its leaving mark (or could not) and ended.
    beater_done: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    origin: Instant,
    me: u32,
    nnodes: u32,
    bounds: LivenessBounds,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Sleeps until the state changes (a notify) or `limit` passes, whichever comes first.
    fn wait<'a>(&self, st: MutexGuard<'a, State>, limit: Duration) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(st, limit)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// Sleeps while `pending` holds, for at most `limit` in all.
    fn wait_while<'a>(
        &self,
        st: MutexGuard<'a, State>,
        limit: Duration,
        pending: impl FnMut(&mut State) -> bool,
    ) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout_while(st, limit, pending)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }
}

fn beat_key(n: u32) -> String {
    format!("liveness/beat/{n}")
}

fn state_key(n: u32) -> String {
    format!("liveness/state/{n}")
}

const LEFT: &[u8] = b"left";
const QUIT_PREFIX: &str = "quit: ";

fn parse_state(bytes: &[u8]) -> PeerState {
    let text = String::from_utf8_lossy(bytes);
    match text.strip_prefix(QUIT_PREFIX) {
        Some(reason) => PeerState::Quit(reason.to_string()),
        None if bytes == LEFT => PeerState::Left,
        None => PeerState::Quit(text.into_owned()),
    }
}

/// One node's heartbeat and judge; dropping it marks the node as having left.
pub struct Liveness {
    shared: Arc<Shared>,
    judge: Option<JoinHandle<()>>,
    /// Dropped after [`Drop::drop`] wrote the leaving mark (fields drop after it).
    _store: Arc<TcpStore>,
}

impl Liveness {
    /// Starts node `node` of `nnodes`'s heartbeat over its own connection to the job's store
    /// (a c10d TCPStore client holds its lock through a wait, so the checkpoint witness's
    /// waits on the node's main connection must not delay a beat), and its judge.
    /// `connect_timeout` bounds the connection (the collective timeout). Holds `store`, the
    /// node's own handle (on node 0, the server), until this node's leaving mark is written:
    /// node 0's mark must reach its own store before the store closes.
    pub fn start(
        store: &Arc<TcpStore>,
        node: u32,
        nnodes: u32,
        bounds: LivenessBounds,
        connect_timeout: Duration,
        on_silence: OnSilence,
    ) -> Result<Self, StoreError> {
        if node >= nnodes {
            return Err(StoreError::BadInput(format!(
                "node {node} is outside a job of {nnodes} nodes"
            )));
        }
        if bounds.timeout.is_zero() {
            return Err(StoreError::BadInput(
                "a heartbeat timeout of 0 would name every node at once: give at least 1 s".into(),
            ));
        }
        let own = TcpStore::connect(store.host(), store.port(), nnodes as usize, connect_timeout)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            origin: Instant::now(),
            me: node,
            nnodes,
            bounds,
        });
        shared.lock().watch = Some(Watch::new(node, nnodes, bounds.timeout, 0));
        // Detached on purpose: a beat blocked on a stopped store host must not hold up this
        // node's exit; the thread ends at the store's own timeout or with the process.
        let beater = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("dflash-heartbeat".into())
            .spawn(move || beat(&beater, &own))
            .map_err(|e| StoreError::BadInput(format!("starting the heartbeat thread: {e}")))?;
        let judged = Arc::clone(&shared);
        let judge = std::thread::Builder::new()
            .name("dflash-liveness".into())
            .spawn(move || judge(&judged, on_silence))
            .map_err(|e| StoreError::BadInput(format!("starting the liveness judge: {e}")))?;
        Ok(Liveness {
            shared,
            judge: Some(judge),
            _store: Arc::clone(store),
        })
    }

    pub fn bounds(&self) -> LivenessBounds {
        self.shared.bounds
    }

    /// The verdict that aborted the group, else a node that left, if any; never waits.
    pub fn verdict(&self) -> Option<Silence> {
        let st = self.shared.lock();
        st.verdict.clone().or_else(|| st.left.clone())
    }

    /// [`Self::verdict`], waiting up to `limit` for one: a collective that failed without
    /// naming its peer waits here for the judge to name the node (a killed node's heartbeat
    /// has stopped; the judge names it within the bound).
    pub fn wait_verdict(&self, limit: Duration) -> Option<Silence> {
        let st = self.shared.wait_while(self.shared.lock(), limit, |st| {
            st.verdict.is_none() && st.left.is_none()
        });
        st.verdict.clone().or_else(|| st.left.clone())
    }

    /// A collective lost `node` (its connection closed): node 0 then leaves without waiting
    /// for its mark.
    pub fn note_lost(&self, node: u32) {
        let mut st = self.shared.lock();
        if !st.gone.contains(&node) {
            st.gone.push(node);
        }
    }

    /// Marks this node as having given up its part of the group (`reason`), for the others
    /// to read at their next beat. Never blocks on the store.
    pub fn quit(&self, reason: &str) {
        self.shared
            .lock()
            .quit
            .get_or_insert_with(|| reason.to_string());
        self.shared.changed.notify_all();
    }
}

impl Drop for Liveness {
    /// Marks this node as having left, and on node 0, which serves the store, waits up to two
    /// periods for every other node to mark the same or read it, so that they read a node
    /// that left rather than a store that vanished.
    fn drop(&mut self) {
        let limit = self.shared.bounds.period() * 3;
        {
            let mut st = self.shared.lock();
            st.stop = true;
            self.shared.changed.notify_all();
            drop(self.shared.wait_while(st, limit, |st| !st.beater_done));
        }
        if let Some(judge) = self.judge.take() {
            let _ = judge.join();
        }
    }
}

/// The heartbeat thread: bumps this node's counter, reads the others' and their marks, and
/// publishes this node's own mark; at the end, marks that it left.
fn beat(shared: &Shared, store: &TcpStore) {
    let (me, nnodes) = (shared.me, shared.nnodes);
    let period = shared.bounds.period();
    loop {
        let (stop, quit) = {
            let st = shared.lock();
            let quit = (!st.quit_published).then(|| st.quit.clone()).flatten();
            (st.stop, quit)
        };
        if stop {
            leave(shared, store);
            return;
        }
        let started = shared.now();
        if let Some(w) = shared.lock().watch.as_mut() {
            w.op_started(started);
        }
        let read = (|| -> Result<Vec<(u32, i64, Option<PeerState>)>, StoreError> {
            if let Some(reason) = &quit {
                store.set(&state_key(me), format!("{QUIT_PREFIX}{reason}").as_bytes())?;
            }
            store.add(&beat_key(me), 1)?;
            let mut seen = Vec::new();
            for n in (0..nnodes).filter(|&n| n != me) {
                let count = store.add(&beat_key(n), 0)?;
                let key = state_key(n);
                let state = if store.check(&[&key])? {
                    Some(parse_state(&store.get(&key, period)?))
                } else {
                    None
                };
                seen.push((n, count, state));
            }
            Ok(seen)
        })();
        let now = shared.now();
        let failed = {
            let mut st = shared.lock();
            let failed = match (&read, st.watch.as_mut()) {
                (Ok(seen), Some(w)) => {
                    w.op_ended();
                    for (n, count, state) in seen {
                        w.beat_seen(*n, *count, now);
                        if let Some(s) = state {
                            w.state_seen(*n, s.clone());
                        }
                    }
                    false
                }
                (Err(e), Some(w)) => {
                    w.store_failed(e.to_string());
                    true
                }
                (_, None) => true,
            };
            if quit.is_some() && read.is_ok() {
                st.quit_published = true;
            }
            failed
        };
        if failed {
            // The store is gone: nothing more to beat into, and nothing to mark at the end.
            let mut st = shared.lock();
            st.beater_done = true;
            shared.changed.notify_all();
            return;
        }
        let mut st = shared.lock();
        if !st.stop && (st.quit.is_none() || st.quit_published) {
            st = shared.wait(st, period);
        }
        drop(st);
    }
}

/// The leaving mark; node 0 then holds its store for the others to read it: until every node
/// not known gone marked that it left or quit, at most two periods (a live node reads the
/// marks once a period).
fn leave(shared: &Shared, store: &TcpStore) {
    let (me, nnodes) = (shared.me, shared.nnodes);
    let period = shared.bounds.period();
    if store.set(&state_key(me), LEFT).is_ok() && me == 0 {
        let gone = shared.lock().gone.clone();
        let keys: Vec<String> = (1..nnodes)
            .filter(|n| !gone.contains(n))
            .map(state_key)
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let deadline = Instant::now() + period * 2;
        while !keys.is_empty() && Instant::now() < deadline {
            if store.check(&keys).unwrap_or(true) {
                break;
            }
            std::thread::sleep(period / 4);
        }
    }
    let mut st = shared.lock();
    st.beater_done = true;
    shared.changed.notify_all();
}

/// The judge: ticks the watch every half period; on a verdict that aborts, aborts this
/// node's endpoints, marks this node as having quit, and journals once.
fn judge(shared: &Shared, on_silence: OnSilence) {
    let half = shared.bounds.period() / 2;
    loop {
        let verdict = {
            let mut st = shared.lock();
            if st.stop {
                return;
            }
            let now = shared.now();
            let Some(v) = st.watch.as_mut().and_then(|w| w.tick(now)) else {
                drop(shared.wait(st, half));
                continue;
            };
            if !v.aborts() {
                if st.left.as_ref() != Some(&v) {
                    st.left = Some(v);
                    shared.changed.notify_all();
                }
                None
            } else if st.verdict.is_none() {
                st.verdict = Some(v.clone());
                st.gone.push(v.node());
                // This node's own failure already explains its pause; a verdict after it
                // would only add a line about what followed from it.
                let own_failure_first = st.quit.is_some();
                st.quit
                    .get_or_insert_with(|| format!("it stopped waiting: {v}"));
                shared.changed.notify_all();
                Some((v, own_failure_first))
            } else {
                None
            }
        };
        if let Some((v, own_failure_first)) = verdict {
            // The line first: it says why the failures the abort releases happened.
            if !own_failure_first {
                (on_silence.journal)(format!(
                    "{v}; the job's gradient group is aborted on this node, and the run pauses \
                     at its next collective"
                ));
            }
            for abort in &on_silence.aborts {
                abort.abort();
            }
        }
        let st = shared.lock();
        if st.stop {
            return;
        }
        drop(shared.wait(st, half));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn watch(me: u32, n: u32) -> Watch {
        Watch::new(me, n, T, 0)
    }

    /// Every node beats every `period`; the watch ticks every half period up to `until`.
    fn run(w: &mut Watch, beating: &[u32], until: u64) -> Option<(u64, Silence)> {
        let (period, mut counts) = (2_000, vec![0i64; 8]);
        let mut now = 0;
        while now <= until {
            if now % period == 0 {
                for &n in beating {
                    counts[n as usize] += 1;
                    w.beat_seen(n, counts[n as usize], now);
                }
            }
            if let Some(v) = w.tick(now) {
                return Some((now, v));
            }
            now += period / 2;
        }
        None
    }

    #[test]
    fn live_nodes_are_never_named_and_a_stopped_one_is_named_within_the_bound() {
        let mut w = watch(0, 4);
        assert_eq!(run(&mut w, &[1, 2, 3], 600_000), None);
        // Node 2 stops beating at 10 s: named once its counter is more than 10 s old, and
        // within timeout + one period.
        let mut w = watch(0, 4);
        assert_eq!(run(&mut w, &[1, 2, 3], 10_000), None);
        let mut now = 10_000;
        let bound = LivenessBounds { timeout: T }.bound().as_millis() as u64;
        let named = loop {
            now += 1_000;
            if now % 2_000 == 0 {
                w.beat_seen(1, (now / 2_000) as i64 + 100, now);
                w.beat_seen(3, (now / 2_000) as i64 + 100, now);
            }
            if let Some(v) = w.tick(now) {
                break (now, v);
            }
            assert!(now < 60_000, "never named");
        };
        assert!(
            matches!(named.1, Silence::Stopped { node: 2, for_ms, timeout_ms: 10_000 } if for_ms > 10_000),
            "{:?}",
            named.1
        );
        assert!(named.0 - 10_000 <= bound, "{named:?}");
        assert!(named.1.to_string().starts_with(
            "node 2's heartbeat has not advanced for 11.00 s, more than \
                 nodes.heartbeat_timeout_s = 10: "
        ));
        assert!(named.1.aborts());
    }

    #[test]
    fn the_store_host_is_named_when_its_store_refuses_or_stops_answering() {
        let mut w = watch(1, 2);
        w.store_failed("Connection reset by peer".into());
        let v = w.tick(500).unwrap();
        assert_eq!(v.node(), 0);
        assert!(v.to_string().starts_with("node 0 is gone"), "{v}");
        // A store operation outstanding past the timeout: node 0 stopped. Nothing is read
        // meanwhile, so neither node's counter moves; the store's host is named, not the
        // node whose counter happened to move first.
        let mut w = watch(2, 3);
        w.beat_seen(1, 1, 0);
        w.beat_seen(0, 1, 500);
        w.op_started(1_000);
        let mut now = 1_000;
        let v = loop {
            now += 1_000;
            if let Some(v) = w.tick(now) {
                break v;
            }
        };
        assert_eq!(now, 12_000);
        assert!(
            matches!(v, Silence::StoreSilent { for_ms: 11_000, .. }),
            "{v:?}"
        );
        // Node 0 never blames its own store.
        let mut w = watch(0, 2);
        w.store_failed("closed".into());
        w.beat_seen(1, 1, 400);
        assert_eq!(w.tick(500), None);
    }

    #[test]
    fn a_node_that_left_is_named_without_an_abort_and_a_quit_one_with_its_reason() {
        let mut w = watch(0, 3);
        w.state_seen(2, PeerState::Left);
        let v = w.tick(1_000).unwrap();
        assert_eq!(v, Silence::Left { node: 2 });
        assert!(!v.aborts());
        // Its silence is expected: still only "left" long after.
        for t in (1_000..=30_000).step_by(1_000) {
            w.beat_seen(1, t as i64, t);
            assert_eq!(w.tick(t), Some(Silence::Left { node: 2 }));
        }
        w.state_seen(1, PeerState::Quit("a NaN loss".into()));
        let v = w.tick(31_000).unwrap();
        assert!(v.aborts());
        assert_eq!(
            v.to_string(),
            "node 1 left the gradient group (a NaN loss); its journal says more"
        );
        // Node 0 left, then its store went away: a node that left, not a lost store.
        let mut w = watch(1, 2);
        w.state_seen(0, PeerState::Left);
        w.store_failed("Connection reset by peer".into());
        assert_eq!(w.tick(100), Some(Silence::Left { node: 0 }));
        assert_eq!(parse_state(b"left"), PeerState::Left);
        assert_eq!(parse_state(b"quit: x"), PeerState::Quit("x".into()));
    }

    #[test]
    fn a_node_that_was_itself_stopped_blames_nobody_for_its_own_gap() {
        let mut w = watch(1, 3);
        w.op_started(1_000);
        // This process was stopped from 1 s to 60 s: the others' counters look old, the
        // store operation long outstanding; nobody is named, and all count fresh again.
        assert_eq!(w.tick(1_000), None);
        assert_eq!(w.tick(60_000), None);
        w.op_ended();
        for t in (61_000..70_000).step_by(1_000) {
            w.beat_seen(0, t as i64, t);
            w.beat_seen(2, t as i64, t);
            assert_eq!(w.tick(t), None, "at {t}");
        }
    }

    #[test]
    fn the_bounds_beat_five_times_per_timeout_and_never_faster_than_100_ms() {
        let b = LivenessBounds {
            timeout: Duration::from_secs(10),
        };
        assert_eq!(b.period(), Duration::from_secs(2));
        assert_eq!(b.bound(), Duration::from_secs(12));
        let fast = LivenessBounds {
            timeout: Duration::from_millis(300),
        };
        assert_eq!(fast.period(), Duration::from_millis(100));
    }
}
