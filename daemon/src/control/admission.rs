//! Which control connections the daemon holds, and which one gives way when it is full: pure
//! bookkeeping, no I/O (the server acts on its answers).
//!
//! Silent or forgotten clients must never lock the operator out. So at the connection limit a
//! new connection does not get refused while some held one does nothing: first the oldest
//! connection that has not said hello gives way, then the one idle the longest (past
//! `min_idle`). And subscribers, which hold their connection for as long as they watch, may
//! take at most `max - reserved` slots, so a `stop` or `confirm-stop` always finds one.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a held connection is doing, as far as giving way goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Connected, no hello yet (it has until the hello deadline).
    AwaitingHello,
    /// Said hello, has no request in flight and no subscription.
    Idle,
    /// A request is being answered.
    Working,
    /// Receives pushed frames.
    Subscribed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    /// Slots subscribers may never take.
    pub reserved: usize,
    /// An idle connection gives way only after this long: a client between two requests is
    /// not idle.
    pub min_idle: Duration,
}

#[derive(Debug)]
struct Slot<T> {
    phase: Phase,
    since: Instant,
    payload: T,
}

/// The connections held. `T` is what the server needs to reach one (its eviction signal).
#[derive(Debug)]
pub struct Admission<T> {
    limits: Limits,
    next_id: u64,
    slots: BTreeMap<u64, Slot<T>>,
}

/// A connection that gave way to a newer one.
#[derive(Debug, PartialEq, Eq)]
pub struct Evicted<T> {
    pub id: u64,
    pub phase: Phase,
    pub payload: T,
}

impl<T> Admission<T> {
    pub fn new(limits: Limits) -> Self {
        Admission {
            limits,
            next_id: 1,
            slots: BTreeMap::new(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn held(&self) -> usize {
        self.slots.len()
    }

    /// Admits a new connection, evicting one that does nothing if the daemon is full.
    /// `Err` is the refusal to send when every held connection is in use.
    pub fn admit(&mut self, now: Instant, payload: T) -> Result<(u64, Option<Evicted<T>>), String> {
        let evicted = if self.slots.len() >= self.limits.max_connections {
            let Some(victim) = self.victim(now) else {
                return Err(format!(
                    "connection limit ({}) reached and every connection is in use; try again \
                     later",
                    self.limits.max_connections
                ));
            };
            let slot = self.slots.remove(&victim).expect("victim is held");
            Some(Evicted {
                id: victim,
                phase: slot.phase,
                payload: slot.payload,
            })
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        self.slots.insert(
            id,
            Slot {
                phase: Phase::AwaitingHello,
                since: now,
                payload,
            },
        );
        Ok((id, evicted))
    }

    /// Records what connection `id` does now; `since` restarts when the phase changes.
    pub fn set_phase(&mut self, id: u64, phase: Phase, now: Instant) {
        if let Some(slot) = self.slots.get_mut(&id) {
            if slot.phase != phase {
                slot.phase = phase;
                slot.since = now;
            }
        }
    }

    /// Makes connection `id` a subscriber unless that would eat into the reserved slots. The
    /// check and the phase change are one step: a subscription granted is counted before its
    /// reply leaves, so the next subscriber's check sees it.
    pub fn subscribe(&mut self, id: u64, now: Instant) -> Result<(), String> {
        self.may_subscribe(id)?;
        self.set_phase(id, Phase::Subscribed, now);
        Ok(())
    }

    /// Whether connection `id` may subscribe without eating into the reserved slots.
    pub fn may_subscribe(&self, id: u64) -> Result<(), String> {
        if self.slots.get(&id).map(|s| s.phase) == Some(Phase::Subscribed) {
            return Ok(());
        }
        let subscribed = self
            .slots
            .values()
            .filter(|s| s.phase == Phase::Subscribed)
            .count();
        let allowed = self
            .limits
            .max_connections
            .saturating_sub(self.limits.reserved);
        if subscribed >= allowed {
            return Err(format!(
                "{subscribed} clients already subscribe; the last {} of the {} connections are \
                 kept for requests such as confirm-stop. Close a console or `tail --follow`",
                self.limits.reserved, self.limits.max_connections
            ));
        }
        Ok(())
    }

    pub fn release(&mut self, id: u64) {
        self.slots.remove(&id);
    }

    fn victim(&self, now: Instant) -> Option<u64> {
        let oldest = |phase: Phase, min_age: Duration| {
            self.slots
                .iter()
                .filter(|(_, s)| s.phase == phase && now.duration_since(s.since) >= min_age)
                .min_by_key(|(id, s)| (s.since, **id))
                .map(|(id, _)| *id)
        };
        oldest(Phase::AwaitingHello, Duration::ZERO)
            .or_else(|| oldest(Phase::Idle, self.limits.min_idle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> Limits {
        Limits {
            max_connections: max,
            reserved: 1,
            min_idle: Duration::from_secs(2),
        }
    }

    #[test]
    fn at_the_limit_the_oldest_silent_connection_gives_way_then_the_longest_idle() {
        let t0 = Instant::now();
        let mut a = Admission::new(limits(3));
        let (first, _) = a.admit(t0, "first").unwrap();
        let (second, _) = a.admit(t0 + Duration::from_millis(1), "second").unwrap();
        let (third, _) = a.admit(t0 + Duration::from_millis(2), "third").unwrap();
        a.set_phase(first, Phase::Working, t0);
        let (_, evicted) = a.admit(t0 + Duration::from_millis(3), "fourth").unwrap();
        let evicted = evicted.unwrap();
        assert_eq!((evicted.id, evicted.payload), (second, "second"));
        assert_eq!(a.held(), 3);

        // Everyone said hello: a fresh idle one does not give way, one idle long enough does.
        let t1 = t0 + Duration::from_secs(1);
        for id in a.slots.keys().copied().collect::<Vec<_>>() {
            a.set_phase(id, Phase::Working, t1);
        }
        a.set_phase(third, Phase::Idle, t1);
        let refused = a.admit(t1 + Duration::from_secs(1), "early").unwrap_err();
        assert!(refused.contains("connection limit (3)"), "{refused}");
        let (_, evicted) = a.admit(t1 + Duration::from_secs(3), "late").unwrap();
        assert_eq!(evicted.unwrap().id, third);
    }

    #[test]
    fn subscribers_leave_the_reserved_slots_free() {
        let t0 = Instant::now();
        let mut a = Admission::new(limits(3));
        let ids: Vec<u64> = (0..3).map(|_| a.admit(t0, ()).unwrap().0).collect();
        a.subscribe(ids[0], t0).unwrap();
        a.subscribe(ids[1], t0).unwrap();
        let refused = a.subscribe(ids[2], t0).unwrap_err();
        assert!(refused.contains("confirm-stop"), "{refused}");
        // A subscriber may subscribe to more topics.
        a.may_subscribe(ids[0]).unwrap();
        a.release(ids[0]);
        a.may_subscribe(ids[2]).unwrap();
    }
}
