//! TEST HARNESS, not the daemon: a small task that speaks the control-plane protocol (shared
//! framing and handshake) over a real Unix socket, serving a scripted state and recording every
//! request it receives. It lets the client, the console loop and the CLI commands be tested
//! against a real socket with exact, scripted states (an incident's snapshot and journal,
//! pending actions, what follows a confirmed stop) and without building `dflashd`;
//! `tests/e2e_console.rs` runs the console against the real daemon.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use dflash_shared::actions::PendingAction;
use dflash_shared::events::Event;
use dflash_shared::protocol::{
    self, decode_request, encode_frame, ErrorCode, Request, Response, ServerIdentity,
};
use dflash_shared::status::StatusSnapshot;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

/// What the harness serves and what it saw.
#[derive(Debug, Clone)]
pub struct Script {
    pub run_name: String,
    pub daemon_pid: u32,
    pub status: StatusSnapshot,
    pub events: Vec<Event>,
    pub config: serde_json::Value,
    pub pending: Vec<PendingAction>,
    /// Consequences attached to every filed action.
    pub consequences: Vec<String>,
    /// Pushed to the confirming connection after a confirmed stop, then it is closed.
    pub after_confirm: Vec<Response>,
    /// Every request received, in order, across connections.
    pub requests: Vec<Request>,
    /// Events per `events` reply, like the daemon's page limit.
    pub events_per_reply: usize,
    next_action: u32,
}

impl Script {
    pub fn new(status: StatusSnapshot) -> Self {
        Self {
            run_name: status.run.name.clone(),
            daemon_pid: 4242,
            status,
            events: Vec::new(),
            config: serde_json::json!({}),
            pending: Vec::new(),
            consequences: Vec::new(),
            after_confirm: Vec::new(),
            requests: Vec::new(),
            events_per_reply: usize::MAX,
            next_action: 1,
        }
    }
}

pub struct TestDaemon {
    pub socket: PathBuf,
    script: Arc<Mutex<Script>>,
    pushes: broadcast::Sender<Response>,
    accept: JoinHandle<()>,
}

impl TestDaemon {
    pub async fn start(socket: &Path, script: Script) -> Self {
        Self::start_shared(socket, Arc::new(Mutex::new(script))).await
    }

    /// Restarts on the same socket with the same script (a daemon restart).
    pub async fn start_shared(socket: &Path, script: Arc<Mutex<Script>>) -> Self {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("bind the harness socket");
        let (pushes, _) = broadcast::channel(1024);
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&script), pushes.clone()));
        Self {
            socket: socket.to_path_buf(),
            script,
            pushes,
            accept,
        }
    }

    pub fn script(&self) -> Arc<Mutex<Script>> {
        Arc::clone(&self.script)
    }

    /// Sends a frame to every subscribed connection.
    pub fn push(&self, frame: Response) {
        let _ = self.pushes.send(frame);
    }

    /// A handle that pushes frames from another task.
    pub fn pusher(&self) -> broadcast::Sender<Response> {
        self.pushes.clone()
    }

    pub fn requests(&self) -> Vec<Request> {
        self.script.lock().unwrap().requests.clone()
    }

    /// Stops listening and drops every connection, like a daemon that exits.
    pub fn stop(self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

async fn accept_loop(
    listener: UnixListener,
    script: Arc<Mutex<Script>>,
    pushes: broadcast::Sender<Response>,
) {
    let mut connections = tokio::task::JoinSet::new();
    // Aborting this task drops the set, which aborts every connection with it.
    while let Ok((stream, _)) = listener.accept().await {
        connections.spawn(serve(stream, Arc::clone(&script), pushes.subscribe()));
    }
}

async fn serve(
    stream: UnixStream,
    script: Arc<Mutex<Script>>,
    mut pushes: broadcast::Receiver<Response>,
) {
    let (read, mut write) = stream.into_split();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Option<Response>>();
    let writer = tokio::spawn(async move {
        while let Some(Some(frame)) = out_rx.recv().await {
            let bytes = encode_frame(&frame).expect("harness frames encode");
            if write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut lines = BufReader::new(read).lines();
    let mut subscribed = false;
    let mut greeted = false;
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { break };
                let request = match decode_request(line.as_bytes()) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = out_tx.send(Some(e.to_reply()));
                        continue;
                    }
                };
                script.lock().unwrap().requests.push(request.clone());
                if !greeted {
                    let identity = {
                        let s = script.lock().unwrap();
                        ServerIdentity { run_name: s.run_name.clone(), daemon_pid: s.daemon_pid }
                    };
                    match protocol::negotiate(&request, &identity) {
                        Ok(welcome) => {
                            greeted = true;
                            let _ = out_tx.send(Some(welcome.into()));
                            continue;
                        }
                        Err(e) => {
                            let _ = out_tx.send(Some(e.into()));
                            break;
                        }
                    }
                }
                if matches!(request, Request::Subscribe { .. }) {
                    subscribed = true;
                }
                let (reply, then_close) = answer(&script, request);
                let _ = out_tx.send(Some(reply));
                if let Some(frames) = then_close {
                    for frame in frames {
                        let _ = out_tx.send(Some(frame));
                    }
                    break;
                }
            }
            push = pushes.recv(), if subscribed => match push {
                Ok(frame) => { let _ = out_tx.send(Some(frame)); }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    let _ = out_tx.send(None);
    let _ = writer.await;
}

/// The reply to one request, and the frames to send before closing when the request ends the
/// connection (a confirmed stop).
fn answer(script: &Arc<Mutex<Script>>, request: Request) -> (Response, Option<Vec<Response>>) {
    let mut s = script.lock().unwrap();
    let reply = match request {
        Request::Status => {
            let mut status = s.status.clone();
            status.pending_actions = s.pending.clone();
            Response::Status(Box::new(status))
        }
        Request::Events { after_seq, .. } => Response::Events {
            events: s
                .events
                .iter()
                .filter(|e| after_seq.is_none_or(|after| e.seq > after))
                .take(s.events_per_reply)
                .cloned()
                .collect(),
        },
        Request::Config => Response::Json {
            value: s.config.clone(),
        },
        Request::Subscribe { .. } => Response::Ok,
        Request::RequestAction { action } => {
            let id = format!("act-{}", s.next_action);
            s.next_action += 1;
            let now = s.status.run.started_ms;
            let pending = PendingAction {
                id,
                action,
                requested_by_uid: 1000,
                created_ms: now,
                expires_ms: now + 300_000,
                consequences: s.consequences.clone(),
            };
            s.pending.push(pending.clone());
            Response::Pending { action: pending }
        }
        Request::Confirm {
            action_id,
            run_name,
            ..
        } => {
            let Some(at) = s.pending.iter().position(|p| p.id == action_id) else {
                return (
                    error(
                        ErrorCode::NoSuchAction,
                        format!("no pending action {action_id}"),
                    ),
                    None,
                );
            };
            if run_name != s.run_name {
                return (
                    error(ErrorCode::WrongRunName, "that is not the run name"),
                    None,
                );
            }
            s.pending.remove(at);
            let reply = Response::Executed {
                action_id,
                outcome: "checkpointing, then stopping".into(),
            };
            let after = std::mem::take(&mut s.after_confirm);
            return (reply, (!after.is_empty()).then_some(after));
        }
        Request::Cancel { action_id } => {
            s.pending.retain(|p| p.id != action_id);
            Response::Ok
        }
        Request::Hello { .. } => error(ErrorCode::BadFrame, "hello twice"),
        Request::Fingerprint | Request::Caches | Request::Checkpoints => Response::Json {
            value: serde_json::Value::Null,
        },
    };
    (reply, None)
}

fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error {
        code,
        message: message.into(),
    }
}
