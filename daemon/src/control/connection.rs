//! One client connection: peer check, versioned hello, then request/response frames
//! interleaved with pushed subscription frames.
//!
//! Bad input never ends the daemon and rarely the connection: garbage, an oversize frame or
//! an unknown request gets an error reply and the connection reads on. A wrong protocol
//! version gets an error reply and the connection closes, since nothing after it would parse.
//! A subscriber that cannot keep up gets a `Dropped` notice and is disconnected.
//!
//! A request is answered by an in-flight future polled alongside the subscription stream, so
//! a slow request (a confirmed stop waits for the final checkpoint) never holds back pushed
//! frames. The protocol has no request ids, so the next request is read only once the reply
//! to the current one is written: replies stay in request order.
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use dflash_shared::protocol::{
    negotiate, ErrorCode, FrameError, Request, Response, ServerIdentity, Topic,
};
use tokio::io::BufWriter;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::broadcast::{self, error::RecvError};

use super::cmd::{self, error, Caller, DispatchConfig};
use super::framing::{write_frame, FrameReader};
use crate::run::bus::Published;
use crate::run::handle::{RunHandle, Shutdown};

#[derive(Debug, Clone)]
pub struct ConnectionConfig {
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
    Io(String),
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
) -> Ended {
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
        },
        Err(e) => return Ended::Io(format!("reading peer credentials: {e}")),
    };
    if !cfg.allowed_uids.contains(&caller.uid) {
        let msg = format!(
            "uid {} may not use this daemon's control socket",
            caller.uid
        );
        let _ = writer
            .send(&error(ErrorCode::NotPermitted, msg.clone()))
            .await;
        return Ended::Refused(msg);
    }
    let mut reader = FrameReader::new(read_half);
    let mut conn = Conn {
        hello_done: false,
        topics: HashSet::new(),
        sub: None,
    };
    let mut in_flight: Option<InFlight> = None;
    loop {
        let ended = tokio::select! {
            biased;
            reply = poll_in_flight(&mut in_flight) => {
                in_flight = None;
                writer.send(&reply).await.err()
            }
            _ = shutdown.recv() => {
                // The reply owed (a confirmed stop is answered just before shutdown), then
                // what was already published (the stop's checkpoint events), then the notice.
                if let Some(owed) = in_flight.take() {
                    if let Ok(reply) = tokio::time::timeout(OWED_REPLY_GRACE, owed).await {
                        let _ = writer.send(&reply).await;
                    }
                }
                conn.flush_published(&mut writer).await;
                let _ = writer.send(&Response::Dropped { reason: "the daemon is shutting down".into() }).await;
                Some(Ended::Shutdown)
            }
            published = recv_subscribed(&mut conn.sub) => {
                match published {
                    Ok(p) if conn.topics.contains(&p.topic) => writer.send(&p.frame).await.err(),
                    Ok(_) => None,
                    Err(RecvError::Lagged(n)) => {
                        let reason = format!(
                            "this client fell {n} frames behind the live stream; the daemon never \
                             slows training for a reader. Reconnect to resume"
                        );
                        let _ = writer.send(&Response::Dropped { reason }).await;
                        Some(Ended::SlowSubscriber)
                    }
                    Err(RecvError::Closed) => { conn.sub = None; None }
                }
            }
            inbound = reader.next(), if in_flight.is_none() => match inbound {
                Ok(None) => Some(Ended::ClientClosed),
                Ok(Some(frame)) => match conn.on_frame(frame, &handle, caller, &cfg, &mut writer).await {
                    Ok(request) => { in_flight = request; None }
                    Err(ended) => Some(ended),
                },
                Err(e) if is_disconnect(&e) => Some(Ended::ClientClosed),
                Err(e) => Some(Ended::Io(e.to_string())),
            },
        };
        if let Some(ended) = ended {
            return ended;
        }
    }
}

struct Conn {
    hello_done: bool,
    topics: HashSet<Topic>,
    sub: Option<broadcast::Receiver<Arc<Published>>>,
}

impl Conn {
    /// Handles one inbound frame. Connection-state requests (hello, subscribe) and bad
    /// frames are answered here; any other request comes back as the future of its reply.
    async fn on_frame(
        &mut self,
        frame: Result<Vec<u8>, FrameError>,
        handle: &RunHandle,
        caller: Caller,
        cfg: &ConnectionConfig,
        writer: &mut Writer,
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
                    if let Request::Hello { client, .. } = &req {
                        tracing::debug!(uid = caller.uid, pid = ?caller.pid, %client, "control client connected");
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
                self.topics.extend(topics);
                if self.sub.is_none() {
                    self.sub = Some(handle.bus().subscribe());
                }
                writer.send(&Response::Ok).await.map(|_| None)
            }
            other => {
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
