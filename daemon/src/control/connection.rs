//! One client connection: peer check, versioned hello, then request/response frames
//! interleaved with pushed subscription frames.
//!
//! Bad input never ends the daemon and rarely the connection: garbage, an oversize frame or
//! an unknown request gets an error reply and the connection reads on. A wrong protocol
//! version gets an error reply and the connection closes, since nothing after it would parse.
//! A subscriber that cannot keep up gets a `Dropped` notice and is disconnected. A connection
//! that says no hello by the hello deadline, or sits idle past the idle timeout, or gives way
//! to a newer connection at the cap, is told why and closed.
//!
//! A request is answered by an in-flight future polled alongside the subscription stream, so
//! a slow request (a confirmed stop waits for the final checkpoint) never holds back pushed
//! frames. The protocol has no request ids, so the next request is read only once the reply
//! to the current one is written: replies stay in request order.
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dflash_shared::protocol::{
    negotiate, Access, ErrorCode, FrameError, Request, Response, ServerIdentity, Topic,
};
use tokio::io::BufWriter;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::admission::{Admission, Phase};
use super::cmd::{self, error, Caller, DispatchConfig};
use super::framing::{write_frame, FrameReader};
use crate::run::bus::Published;
use crate::run::handle::{RunHandle, Shutdown};

#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    pub hello_timeout: Duration,
    pub idle_timeout: Duration,
    /// A write that takes longer means the client stopped reading; it is disconnected.
    pub write_timeout: Duration,
    pub allowed_uids: Vec<u32>,
    pub dispatch: DispatchConfig,
}

/// Why a connection ended, for the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    ClientClosed,
    Refused(String),
    VersionMismatch,
    SlowSubscriber,
    WriteTimeout,
    Shutdown,
    NoHello,
    IdleTimeout,
    Evicted,
    Io(String),
}

/// This connection's place in the server's [`Admission`]; released when the task ends.
pub struct Slot {
    id: u64,
    admission: Arc<Mutex<Admission<Arc<Notify>>>>,
    evict: Arc<Notify>,
    phase: Phase,
}

impl Slot {
    pub fn new(id: u64, admission: Arc<Mutex<Admission<Arc<Notify>>>>, evict: Arc<Notify>) -> Self {
        Slot {
            id,
            admission,
            evict,
            phase: Phase::AwaitingHello,
        }
    }

    fn admission(&self) -> std::sync::MutexGuard<'_, Admission<Arc<Notify>>> {
        self.admission.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Becomes a subscriber now, before the reply is sent (see [`Admission::subscribe`]);
    /// the connection loop's next `set_phase` then finds the phase already recorded.
    fn subscribe(&self) -> Result<(), String> {
        self.admission()
            .subscribe(self.id, std::time::Instant::now())
    }

    fn set_phase(&mut self, phase: Phase) {
        if phase != self.phase {
            self.phase = phase;
            self.admission()
                .set_phase(self.id, phase, std::time::Instant::now());
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let id = self.id;
        self.admission().release(id);
    }
}

struct Writer {
    out: BufWriter<OwnedWriteHalf>,
    timeout: Duration,
}

impl Writer {
    async fn send(&mut self, frame: &Response) -> Result<(), Ended> {
        match tokio::time::timeout(self.timeout, write_frame(&mut self.out, frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if is_disconnect(&e) => Err(Ended::ClientClosed),
            Ok(Err(e)) => Err(Ended::Io(e.to_string())),
            Err(_) => Err(Ended::WriteTimeout),
        }
    }
}

/// The reply to the request being answered.
type InFlight = Pin<Box<dyn Future<Output = Response> + Send>>;

/// How long a shutting-down connection still waits for the reply it owes.
const OWED_REPLY_GRACE: Duration = Duration::from_secs(10);

pub async fn serve(
    stream: UnixStream,
    handle: RunHandle,
    cfg: Arc<ConnectionConfig>,
    mut shutdown: Shutdown,
    mut slot: Slot,
) -> Ended {
    let (mut reader, mut writer, caller) = match admit(stream, &cfg, slot.id).await {
        Ok(admitted) => admitted,
        Err(ended) => return ended,
    };
    let mut conn = Conn {
        hello_done: false,
        access: Access::Full,
        topics: HashSet::new(),
        sub: None,
    };
    let mut in_flight: Option<InFlight> = None;
    // Until the hello: the hello deadline from accept. After it: the idle timeout from the
    // last frame, counted only while the connection neither waits on a reply nor subscribes.
    let quiet_deadline = tokio::time::sleep(cfg.hello_timeout);
    tokio::pin!(quiet_deadline);
    let evict = slot.evict.clone();
    loop {
        slot.set_phase(conn.phase(in_flight.is_some()));
        let quiet = conn.sub.is_none() && in_flight.is_none();
        let ended = tokio::select! {
            biased;
            reply = poll_in_flight(&mut in_flight) => {
                in_flight = None;
                quiet_deadline.as_mut().reset(Instant::now() + cfg.idle_timeout);
                writer.send(&reply).await.err()
            }
            _ = evict.notified() => Some(conn.evicted(&mut writer).await),
            _ = &mut quiet_deadline, if quiet => Some(conn.timed_out(&cfg, &mut writer).await),
            _ = shutdown.recv() => Some(conn.shut_down(in_flight.take(), &mut writer).await),
            published = recv_subscribed(&mut conn.sub) => {
                conn.on_published(published, &mut writer).await
            }
            inbound = reader.next(), if in_flight.is_none() => match inbound {
                Ok(None) => Some(Ended::ClientClosed),
                Ok(Some(frame)) => {
                    let had_hello = conn.hello_done;
                    let answer = conn.on_frame(frame, &handle, caller, &cfg, &mut writer, &mut slot).await;
                    if had_hello || conn.hello_done {
                        quiet_deadline.as_mut().reset(Instant::now() + cfg.idle_timeout);
                    }
                    match answer {
                        Ok(request) => { in_flight = request; None }
                        Err(ended) => Some(ended),
                    }
                }
                Err(e) if is_disconnect(&e) => Some(Ended::ClientClosed),
                Err(e) => Some(Ended::Io(e.to_string())),
            },
        };
        if let Some(ended) = ended {
            return ended;
        }
    }
}

/// The peer's credentials read and its uid checked against the allowed ones; a refused peer
/// is told why before the connection closes.
async fn admit(
    stream: UnixStream,
    cfg: &ConnectionConfig,
    connection: u64,
) -> Result<(FrameReader<OwnedReadHalf>, Writer, Caller), Ended> {
    let cred = stream.peer_cred();
    let (read_half, write_half) = stream.into_split();
    let mut writer = Writer {
        out: BufWriter::new(write_half),
        timeout: cfg.write_timeout,
    };
    let caller = match cred {
        Ok(c) => Caller {
            uid: c.uid(),
            pid: c.pid(),
            connection,
            // Until the hello says otherwise; only the hello sets it.
            access: Access::Full,
        },
        Err(e) => return Err(Ended::Io(format!("reading peer credentials: {e}"))),
    };
    if !cfg.allowed_uids.contains(&caller.uid) {
        let msg = format!(
            "uid {} may not use this daemon's control socket",
            caller.uid
        );
        let _ = writer
            .send(&error(ErrorCode::NotPermitted, msg.clone()))
            .await;
        return Err(Ended::Refused(msg));
    }
    Ok((FrameReader::new(read_half), writer, caller))
}

struct Conn {
    hello_done: bool,
    /// What the hello declared; fixed from then on (a second hello is refused).
    access: Access,
    topics: HashSet<Topic>,
    sub: Option<broadcast::Receiver<Arc<Published>>>,
}

impl Conn {
    /// What the connection is doing, for the admission's choice of whom to evict.
    fn phase(&self, awaiting_reply: bool) -> Phase {
        if !self.hello_done {
            Phase::AwaitingHello
        } else if self.sub.is_some() {
            Phase::Subscribed
        } else if awaiting_reply {
            Phase::Working
        } else {
            Phase::Idle
        }
    }

    /// The connection cap was reached and this connection was chosen to make room.
    async fn evicted(&self, writer: &mut Writer) -> Ended {
        let reason = if self.hello_done {
            "the daemon's connection limit was reached and this connection was the one \
            idle the longest; reconnect to go on"
        } else {
            "the daemon's connection limit was reached and this connection had not said \
            hello; reconnect and send the hello first"
        };
        let _ = writer.send(&error(ErrorCode::Refused, reason)).await;
        Ended::Evicted
    }

    /// No hello in time, or idle past the idle timeout after it.
    async fn timed_out(&self, cfg: &ConnectionConfig, writer: &mut Writer) -> Ended {
        if self.hello_done {
            let reason = format!(
                "no request for {} s and no subscription: the daemon closes idle \
            connections; reconnect to go on",
                cfg.idle_timeout.as_secs()
            );
            let _ = writer.send(&Response::Dropped { reason }).await;
            Ended::IdleTimeout
        } else {
            let reason = format!(
                "no hello within {} ms of connecting; the daemon closes connections that \
            do not start with a hello",
                cfg.hello_timeout.as_millis()
            );
            let _ = writer.send(&error(ErrorCode::HelloRequired, reason)).await;
            Ended::NoHello
        }
    }

    /// The daemon is shutting down: the reply owed (a confirmed stop is answered just before
    /// shutdown), then what was already published (the stop's checkpoint events), then the
    /// notice.
    async fn shut_down(&mut self, owed: Option<InFlight>, writer: &mut Writer) -> Ended {
        if let Some(owed) = owed {
            if let Ok(reply) = tokio::time::timeout(OWED_REPLY_GRACE, owed).await {
                let _ = writer.send(&reply).await;
            }
        }
        self.flush_published(writer).await;
        let reason = "the daemon is shutting down".into();
        let _ = writer.send(&Response::Dropped { reason }).await;
        Ended::Shutdown
    }

    /// A frame from the live stream: sent when it is of a subscribed topic. A reader that fell
    /// behind is dropped, never waited for.
    async fn on_published(
        &mut self,
        published: Result<Arc<Published>, RecvError>,
        writer: &mut Writer,
    ) -> Option<Ended> {
        match published {
            Ok(p) if self.topics.contains(&p.topic) => writer.send(&p.frame).await.err(),
            Ok(_) => None,
            Err(RecvError::Lagged(n)) => {
                let reason = format!(
                    "this client fell {n} frames behind the live stream; the daemon never \
                     slows training for a reader. Reconnect to resume"
                );
                let _ = writer.send(&Response::Dropped { reason }).await;
                Some(Ended::SlowSubscriber)
            }
            Err(RecvError::Closed) => {
                self.sub = None;
                None
            }
        }
    }

    /// Handles one inbound frame. Connection-state requests (hello, subscribe) and bad
    /// frames are answered here; any other request comes back as the future of its reply.
    async fn on_frame(
        &mut self,
        frame: Result<Vec<u8>, FrameError>,
        handle: &RunHandle,
        caller: Caller,
        cfg: &ConnectionConfig,
        writer: &mut Writer,
        slot: &mut Slot,
    ) -> Result<Option<InFlight>, Ended> {
        let line = match frame {
            Err(e) => return writer.send(&e.to_reply()).await.map(|_| None),
            Ok(line) if line.iter().all(u8::is_ascii_whitespace) => return Ok(None),
            Ok(line) => line,
        };
        let req = match cmd::parse_request(&line) {
            Ok(r) => r,
            Err(reply) => return writer.send(&reply).await.map(|_| None),
        };
        if !self.hello_done {
            let identity = ServerIdentity {
                run_name: handle.run_name().to_string(),
                daemon_pid: std::process::id(),
            };
            let sent = match negotiate(&req, &identity) {
                Ok(welcome) => {
                    self.hello_done = true;
                    // Before the welcome goes out: a client that has its welcome must never
                    // be evicted as one that has not said hello (the loop would only mark it
                    // after this reply, racing the client's next connection).
                    slot.set_phase(Phase::Idle);
                    if let Request::Hello { client, access, .. } = &req {
                        self.access = *access;
                        tracing::debug!(uid = caller.uid, pid = ?caller.pid, %client, ?access, "control client connected");
                    }
                    writer.send(&welcome.into()).await
                }
                Err(reply) if reply.code == ErrorCode::VersionMismatch => {
                    writer.send(&reply.into()).await?;
                    Err(Ended::VersionMismatch)
                }
                Err(reply) => writer.send(&reply.into()).await,
            };
            return sent.map(|_| None);
        }
        match req {
            Request::Subscribe { topics } => {
                if self.sub.is_none() {
                    if let Err(why) = slot.subscribe() {
                        return writer
                            .send(&error(ErrorCode::Refused, why))
                            .await
                            .map(|_| None);
                    }
                }
                self.topics.extend(topics);
                if self.sub.is_none() {
                    self.sub = Some(handle.bus().subscribe());
                }
                writer.send(&Response::Ok).await.map(|_| None)
            }
            other => {
                let caller = Caller {
                    access: self.access,
                    ..caller
                };
                let (handle, dispatch_cfg) = (handle.clone(), cfg.dispatch.clone());
                Ok(Some(Box::pin(async move {
                    cmd::handle_request(&handle, caller, &dispatch_cfg, other).await
                })))
            }
        }
    }

    /// Forwards the subscribed frames already published, without waiting for more.
    async fn flush_published(&mut self, writer: &mut Writer) {
        let Some(sub) = self.sub.as_mut() else {
            return;
        };
        while let Ok(p) = sub.try_recv() {
            if self.topics.contains(&p.topic) && writer.send(&p.frame).await.is_err() {
                return;
            }
        }
    }
}

async fn poll_in_flight(in_flight: &mut Option<InFlight>) -> Response {
    match in_flight {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn recv_subscribed(
    sub: &mut Option<broadcast::Receiver<Arc<Published>>>,
) -> Result<Arc<Published>, RecvError> {
    match sub {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn is_disconnect(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::UnexpectedEof
    )
}
