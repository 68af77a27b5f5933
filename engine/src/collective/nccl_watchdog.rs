//! The watchdog of a cross-process NCCL endpoint (issue 23): while one of its collectives is
//! outstanding, a thread of its own polls `ncclCommGetAsyncError` and calls `ncclCommAbort` on
//! an asynchronous error or once the collective timeout has passed, so a rank whose peer died
//! or hung returns an error instead of blocking forever in the GPU kernel NCCL launched.
//!
//! Why a thread and a poll: `ncclAllReduce` only enqueues; the host learns of the result when
//! it next waits on the stream, and a peer that died on a network transport can leave the
//! kernel spinning with nothing on the host to notice. NCCL documents `ncclCommGetAsyncError`
//! and `ncclCommAbort` as safe from another thread while a collective is in flight; the abort
//! ends the kernel, and the waiting host thread returns.
//!
//! NOT RUN ON A GPU: the machines this was written on have none, so no NCCL collective, no
//! poll and no abort here has ever executed. What is tested is the decision
//! ([`decide`], pure: a poll's result and the time elapsed → keep waiting, or abort and why)
//! and the watchdog's bookkeeping without a communicator.
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::nccl_lib::NcclResult;

/// `ncclInProgress`: a non-blocking operation still running (NCCL ≥ 2.14); not an error.
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// What one poll of `ncclCommGetAsyncError` gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncPoll {
    /// The query succeeded; the communicator's asynchronous state (`ncclSuccess` = 0).
    State(NcclResult),
    /// The query itself returned this error.
    QueryFailed(NcclResult),
    /// This NCCL does not export `ncclCommGetAsyncError` (only the timeout can abort).
    Unavailable,
}

/// Why the watchdog aborted a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortReason {
    /// NCCL reported an asynchronous error (`code`): a peer's connection failed, or NCCL's own
    /// internal error.
    AsyncError(NcclResult),
    /// `ncclCommGetAsyncError` itself failed with `code`.
    QueryFailed(NcclResult),
    /// The collective was outstanding for `after`, at least the collective timeout.
    Timeout { after: Duration },
}

/// The watchdog's decision after one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    KeepWaiting,
    Abort(AbortReason),
}

/// What to do after a poll that gave `poll`, the collective outstanding for `elapsed`, under
/// `timeout`. An error NCCL reports wins over the clock (it says what went wrong); a state of
/// success or "in progress", or no way to ask, leaves only the timeout. Pure.
pub fn decide(poll: AsyncPoll, elapsed: Duration, timeout: Duration) -> Decision {
    match poll {
        AsyncPoll::State(code) if code != 0 && code != NCCL_IN_PROGRESS => {
            Decision::Abort(AbortReason::AsyncError(code))
        }
        AsyncPoll::QueryFailed(code) => Decision::Abort(AbortReason::QueryFailed(code)),
        AsyncPoll::State(_) | AsyncPoll::Unavailable if elapsed >= timeout => {
            Decision::Abort(AbortReason::Timeout { after: elapsed })
        }
        AsyncPoll::State(_) | AsyncPoll::Unavailable => Decision::KeepWaiting,
    }
}

/// How often the watchdog polls: twenty times per timeout, at least every 100 ms and at most
/// every 10 ms (a poll is one cheap call into NCCL).
pub fn poll_interval(timeout: Duration) -> Duration {
    (timeout / 20).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

/// What the watchdog thread needs of the communicator: one poll, and the abort. The NCCL
/// endpoint gives its communicator; the tests give a scripted one.
pub trait Watched: Send + 'static {
    /// One `ncclCommGetAsyncError`; `None` once the communicator is gone (aborted or
    /// destroyed by its owner), when there is nothing left to watch.
    fn poll(&self) -> Option<AsyncPoll>;
    /// `ncclCommAbort`, unless the communicator is already gone.
    fn abort(&self);
}

#[derive(Default)]
struct State {
    /// When the collective now outstanding was enqueued.
    since: Option<Instant>,
    /// Why the watchdog aborted; stays (the communicator is gone for good).
    aborted: Option<AbortReason>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    timeout: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One endpoint's watchdog thread; dropping it stops the thread.
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread watching `comm`'s collectives under `timeout` (the collective
    /// timeout; never zero: the process group refuses a zero timeout before any join).
    pub fn start(comm: impl Watched, timeout: Duration) -> Result<Self, String> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            timeout,
        });
        let watching = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("dflash-nccl-watchdog".into())
            .spawn(move || watch(&watching, &comm))
            .map_err(|e| format!("starting the NCCL watchdog: {e}"))?;
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    /// A collective was just enqueued: watch it. An earlier abort stays the answer.
    pub fn begin(&self) -> Result<(), AbortReason> {
        let mut st = self.shared.lock();
        if let Some(why) = &st.aborted {
            return Err(why.clone());
        }
        st.since = Some(Instant::now());
        self.shared.changed.notify_all();
        Ok(())
    }

    /// The collective the caller waited for returned: `Err` when the watchdog aborted it.
    pub fn end(&self) -> Result<(), AbortReason> {
        let mut st = self.shared.lock();
        st.since = None;
        match &st.aborted {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(shared: &Shared, comm: &dyn Watched) {
    let interval = poll_interval(shared.timeout);
    let mut st = shared.lock();
    loop {
        if st.stop || st.aborted.is_some() {
            return;
        }
        let Some(since) = st.since else {
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        // The poll and the abort run without the lock: `begin`/`end` never wait on NCCL.
        drop(st);
        let decision = match comm.poll() {
            Some(poll) => decide(poll, since.elapsed(), shared.timeout),
            None => return,
        };
        st = shared.lock();
        if let Decision::Abort(why) = decision {
            // Only the collective it judged: one that ended meanwhile is not aborted.
            if st.since == Some(since) {
                comm.abort();
                st.aborted = Some(why);
                shared.changed.notify_all();
                return;
            }
            continue;
        }
        st = shared
            .changed
            .wait_timeout(st, interval)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(60);

    #[test]
    fn an_async_error_aborts_at_once_and_otherwise_only_the_timeout_does() {
        let s = Duration::from_secs;
        assert_eq!(decide(AsyncPoll::State(0), s(59), T), Decision::KeepWaiting);
        assert_eq!(
            decide(AsyncPoll::State(NCCL_IN_PROGRESS), s(1), T),
            Decision::KeepWaiting
        );
        assert_eq!(
            decide(AsyncPoll::Unavailable, s(30), T),
            Decision::KeepWaiting
        );
        // ncclRemoteError (6): a peer's connection failed; at once, whatever the clock.
        assert_eq!(
            decide(AsyncPoll::State(6), Duration::ZERO, T),
            Decision::Abort(AbortReason::AsyncError(6))
        );
        assert_eq!(
            decide(AsyncPoll::State(2), s(61), T),
            Decision::Abort(AbortReason::AsyncError(2))
        );
        assert_eq!(
            decide(AsyncPoll::QueryFailed(4), s(1), T),
            Decision::Abort(AbortReason::QueryFailed(4))
        );
        for poll in [
            AsyncPoll::State(0),
            AsyncPoll::State(NCCL_IN_PROGRESS),
            AsyncPoll::Unavailable,
        ] {
            assert_eq!(
                decide(poll, s(60), T),
                Decision::Abort(AbortReason::Timeout { after: s(60) }),
                "{poll:?}"
            );
        }
    }

    #[test]
    fn the_poll_interval_is_a_twentieth_of_the_timeout_within_10_to_100_ms() {
        assert_eq!(poll_interval(T), Duration::from_millis(100));
        assert_eq!(
            poll_interval(Duration::from_secs(1)),
            Duration::from_millis(50)
        );
        assert_eq!(
            poll_interval(Duration::from_millis(50)),
            Duration::from_millis(10)
        );
    }

    /// A communicator whose polls say what the test scripted, counting aborts. Not NCCL: the
    /// watchdog's bookkeeping (when it polls, what it aborts, what `end` answers) is all this
    /// checks; the NCCL calls themselves need a GPU.
    #[derive(Clone)]
    struct Scripted {
        poll: Arc<Mutex<AsyncPoll>>,
        aborts: Arc<Mutex<u32>>,
    }

    impl Watched for Scripted {
        fn poll(&self) -> Option<AsyncPoll> {
            Some(*self.poll.lock().unwrap())
        }
        fn abort(&self) {
            *self.aborts.lock().unwrap() += 1;
        }
    }

    fn scripted(poll: AsyncPoll) -> Scripted {
        Scripted {
            poll: Arc::new(Mutex::new(poll)),
            aborts: Arc::new(Mutex::new(0)),
        }
    }

    #[test]
    fn a_collective_that_ends_in_time_is_left_alone_and_one_past_the_timeout_is_aborted_once() {
        let comm = scripted(AsyncPoll::State(0));
        let dog = Watchdog::start(comm.clone(), Duration::from_millis(300)).unwrap();
        dog.begin().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(dog.end(), Ok(()));
        // Idle (no collective outstanding) for longer than the timeout: nothing happens.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(*comm.aborts.lock().unwrap(), 0);
        let started = Instant::now();
        dog.begin().unwrap();
        while *comm.aborts.lock().unwrap() == 0 {
            assert!(started.elapsed() < Duration::from_secs(5), "never aborted");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(
            matches!(dog.end(), Err(AbortReason::Timeout { after }) if after >= Duration::from_millis(300))
        );
        // The communicator is gone: every later collective is refused with the same reason.
        assert!(matches!(dog.begin(), Err(AbortReason::Timeout { .. })));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(*comm.aborts.lock().unwrap(), 1);
    }

    #[test]
    fn an_async_error_during_a_collective_aborts_it_within_a_poll() {
        let comm = scripted(AsyncPoll::State(0));
        let dog = Watchdog::start(comm.clone(), T).unwrap();
        dog.begin().unwrap();
        *comm.poll.lock().unwrap() = AsyncPoll::State(6);
        let started = Instant::now();
        while *comm.aborts.lock().unwrap() == 0 {
            assert!(started.elapsed() < Duration::from_secs(5), "never aborted");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(dog.end(), Err(AbortReason::AsyncError(6)));
    }
}
