//! A connected session with `dflashd`.
//!
//! The protocol has no request ids: the daemon answers requests in order, and frames it pushes to
//! subscribers (metrics, GPUs, queue, events, logs) are told apart by their type. So replies are
//! matched FIFO to requests, and pushed frames go to a bounded channel. A console that stops
//! draining that channel stops reading the socket, and the daemon drops it rather than slow down.
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::codec::FrameReader;
use super::{client_name, codec, ClientError};
use dflash_shared::events::Event;
use dflash_shared::protocol::{self, Access, ErrorCode, Request, Response, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a confirmed action may take to be answered (a stop waits for the checkpoint).
pub const ACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Journal pages fetched at most when catching up (the daemon sends 500 events a page).
pub const MAX_EVENT_PAGES: usize = 400;
const PUSH_CHANNEL: usize = 4096;

/// What the daemon said in its welcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub version: u32,
    pub run_name: String,
    pub daemon_pid: u32,
}

/// Something the daemon sent without being asked, or the end of the session.
#[derive(Debug)]
pub enum Push {
    Frame(Response),
    /// A frame that could not be read; the session goes on.
    Garbled(ClientError),
    /// The connection ended; nothing follows.
    Closed(String),
}

type ReplySender = oneshot::Sender<Result<Response, ClientError>>;

#[derive(Default)]
struct Waiting {
    replies: VecDeque<ReplySender>,
    closed: bool,
}

pub struct Session {
    socket: PathBuf,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Arc<Mutex<Waiting>>,
    reader: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Session {
    /// Connects, says hello and checks the version. Pushed frames arrive on the returned receiver.
    pub async fn connect(
        socket: &Path,
    ) -> Result<(Session, Welcome, mpsc::Receiver<Push>), ClientError> {
        Self::connect_with(socket, Access::Full).await
    }

    /// [`Session::connect`] with the access the hello declares: a read-only connection is held
    /// to it by the daemon, which refuses its requests, confirmations and cancels.
    pub async fn connect_with(
        socket: &Path,
        access: Access,
    ) -> Result<(Session, Welcome, mpsc::Receiver<Push>), ClientError> {
        crate::paths::check_fallback_socket_dir(socket)?;
        let stream = UnixStream::connect(socket).await.map_err(|source| {
            use std::io::ErrorKind::{ConnectionRefused, NotFound};
            match source.kind() {
                NotFound | ConnectionRefused => ClientError::NoDaemon {
                    path: socket.to_path_buf(),
                    reason: source.to_string(),
                },
                _ => ClientError::Connect {
                    path: socket.to_path_buf(),
                    cause: source,
                },
            }
        })?;
        let (read, mut write) = stream.into_split();
        let mut frames = FrameReader::new(read);

        let hello = codec::encode(&protocol::hello_with(client_name(), access))?;
        if let Err(sent) = write_frame(&mut write, &hello).await {
            return Err(refusal_behind(&mut frames, socket, sent).await);
        }
        let first = tokio::time::timeout(HELLO_TIMEOUT, frames.next())
            .await
            .map_err(|_| ClientError::HelloTimeout {
                path: socket.to_path_buf(),
                timeout_ms: HELLO_TIMEOUT.as_millis() as u64,
            })?;
        let welcome = match first {
            None => return Err(ClientError::Closed),
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => welcome_from(&frame)?,
        };

        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let (push_tx, push_rx) = mpsc::channel(PUSH_CHANNEL);
        let reader = tokio::spawn(read_frames(frames, Arc::clone(&waiting), push_tx));
        let session = Session {
            socket: socket.to_path_buf(),
            writer: tokio::sync::Mutex::new(write),
            waiting,
            reader,
        };
        Ok((session, welcome, push_rx))
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request and waits for its reply. A daemon `Error` reply becomes `Err(Daemon)`.
    pub async fn request(&self, request: &Request) -> Result<Response, ClientError> {
        self.request_with_timeout(request, REQUEST_TIMEOUT).await
    }

    /// Like [`Session::request`] with a caller-chosen wait: a confirmed stop is answered only
    /// after the daemon has written its checkpoint.
    pub async fn request_with_timeout(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let frame = codec::encode(request)?;
        let (tx, rx) = oneshot::channel();
        {
            // Queue the reply slot and write under one lock, so slots stay in request order.
            let mut writer = self.writer.lock().await;
            {
                let mut waiting = self.waiting.lock().expect("waiting-list lock poisoned");
                if waiting.closed {
                    return Err(ClientError::Closed);
                }
                waiting.replies.push_back(tx);
            }
            write_frame(&mut writer, &frame).await?;
        }
        let reply = tokio::time::timeout(timeout, rx)
            .await
            .map_err(|_| ClientError::RequestTimeout {
                timeout_ms: timeout.as_millis() as u64,
            })?
            .map_err(|_| ClientError::Closed)??;
        match reply {
            Response::Error { code, message } => Err(ClientError::Daemon { code, message }),
            other => Ok(other),
        }
    }
}

impl Session {
    /// Every journal event after `after_seq`, oldest first, paging through the daemon's
    /// per-reply limit (it answers at most a few hundred events per `events` request).
    pub async fn events_after(
        &self,
        mut after_seq: Option<u64>,
        max_pages: usize,
    ) -> Result<Vec<Event>, ClientError> {
        let mut all = Vec::new();
        for _ in 0..max_pages {
            let page = match self
                .request(&Request::Events {
                    after_seq,
                    last: None,
                })
                .await?
            {
                Response::Events { events } => events,
                other => {
                    return Err(ClientError::UnexpectedReply {
                        expected: "journal events",
                        got: codec::preview(&format!("{other:?}")),
                    })
                }
            };
            let newest = page.iter().map(|e| e.seq).max();
            all.extend(page);
            match newest {
                Some(seq) if after_seq.is_none_or(|after| seq > after) => after_seq = Some(seq),
                _ => break,
            }
        }
        Ok(all)
    }
}

/// Why the daemon closed a connection our hello could not be written to. A daemon at its
/// connection limit answers with the reason and closes; that reply is still in our receive
/// buffer, and it is what the operator needs to read, not the broken pipe it caused.
async fn refusal_behind(
    frames: &mut FrameReader<tokio::net::unix::OwnedReadHalf>,
    socket: &Path,
    sent: ClientError,
) -> ClientError {
    match tokio::time::timeout(Duration::from_secs(1), frames.next()).await {
        Ok(Some(Ok(Response::Error { code, message }))) => ClientError::Daemon { code, message },
        _ => ClientError::ClosedBeforeHello {
            path: socket.to_path_buf(),
            reason: sent.to_string(),
        },
    }
}

fn welcome_from(frame: &Response) -> Result<Welcome, ClientError> {
    match protocol::accept_welcome(frame) {
        Ok(w) => Ok(Welcome {
            version: w.version,
            run_name: w.run_name,
            daemon_pid: w.daemon_pid,
        }),
        Err(e) if e.code == ErrorCode::VersionMismatch => Err(ClientError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: e.message,
        }),
        Err(e) if matches!(frame, Response::Error { .. }) => Err(ClientError::Daemon {
            code: e.code,
            message: e.message,
        }),
        Err(e) => Err(ClientError::Handshake { got: e.message }),
    }
}

async fn write_frame(writer: &mut OwnedWriteHalf, frame: &[u8]) -> Result<(), ClientError> {
    writer.write_all(frame).await?;
    Ok(())
}

async fn read_frames(
    mut frames: FrameReader<tokio::net::unix::OwnedReadHalf>,
    waiting: Arc<Mutex<Waiting>>,
    pushes: mpsc::Sender<Push>,
) {
    let reason = loop {
        match frames.next().await {
            None => break "the daemon closed the connection".to_string(),
            Some(Err(ClientError::Io(e))) => break format!("read error: {e}"),
            Some(Err(e)) => {
                let _ = pushes.send(Push::Garbled(e)).await;
            }
            Some(Ok(frame)) if frame.is_pushed() => {
                let _ = pushes.send(Push::Frame(frame)).await;
            }
            Some(Ok(reply)) => {
                let slot = waiting
                    .lock()
                    .expect("waiting-list lock poisoned")
                    .replies
                    .pop_front();
                match slot {
                    Some(slot) => {
                        let _ = slot.send(Ok(reply));
                    }
                    // An error about something we did not ask (e.g. a frame it could not
                    // read) still matters to the operator.
                    None => {
                        let _ = pushes.send(Push::Frame(reply)).await;
                    }
                }
            }
        }
    };
    let orphans = {
        let mut waiting = waiting.lock().expect("waiting-list lock poisoned");
        waiting.closed = true;
        std::mem::take(&mut waiting.replies)
    };
    for slot in orphans {
        let _ = slot.send(Err(ClientError::Closed));
    }
    let _ = pushes.send(Push::Closed(reason)).await;
}
