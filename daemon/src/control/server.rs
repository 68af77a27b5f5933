//! The control socket: bind safely, accept with a connection cap, shut down by broadcast.
//!
//! Admission: at the connection cap a connection that has not said hello, or one idle past
//! a grace, gives way to the newcomer ([`super::admission`]); connections that never say hello
//! are closed at the hello deadline and idle ones after `idle_timeout`.
//!
//! Binding: the socket lives in a private 0700 directory (the directory is the guard, so
//! there is no window between bind and chmod); an existing socket is removed only after a
//! connect probe shows nobody listens on it. Shutdown: [`RunHandle::request_shutdown`]
//! broadcasts to the accept loop and every connection; [`ControlServer::run`] returns once
//! all connection tasks have finished, and removes the socket if it is still ours.
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dflash_shared::events::{EventKind, Severity};
use dflash_shared::protocol::ErrorCode;
use thiserror::Error;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Notify};

use super::admission::{Admission, Limits};
use super::cmd::{error, DispatchConfig};
use super::connection::{self, ConnectionConfig, Ended, Slot};
use super::framing::write_frame;
use crate::run::handle::RunHandle;
use crate::run::paths::{check_socket_path_len, current_uid, ensure_private_dir, PathError};

/// `control.max_connections` when the config leaves it out (its one home is the config schema).
pub use dflash_shared::config::DEFAULT_MAX_CONNECTIONS;
/// Connections subscribers may never take, so a request (a stop, its confirmation) gets in.
pub const DEFAULT_RESERVED_FOR_REQUESTS: usize = 4;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub socket_path: PathBuf,
    pub max_connections: usize,
    pub reserved_for_requests: usize,
    /// A connection that has not said hello by then is closed.
    pub hello_timeout: Duration,
    /// A connection with no subscription and no request for this long is closed.
    pub idle_timeout: Duration,
    /// At the cap, an idle connection gives way to a new one once idle this long.
    pub evict_idle_after: Duration,
    pub write_timeout: Duration,
    /// Peers allowed to connect; by default only our own effective uid.
    pub allowed_uids: Vec<u32>,
    pub dispatch: DispatchConfig,
    /// How often unconfirmed pending actions are checked for expiry.
    pub expiry_tick: Duration,
}

impl ServerConfig {
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        ServerConfig {
            socket_path: socket_path.into(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            reserved_for_requests: DEFAULT_RESERVED_FOR_REQUESTS,
            hello_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10 * 60),
            evict_idle_after: Duration::from_secs(2),
            write_timeout: Duration::from_secs(5),
            allowed_uids: vec![current_uid()],
            dispatch: DispatchConfig::default(),
            expiry_tick: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Error)]
pub enum ServerError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("another daemon is listening on {0}; stop it or pass another --socket")]
    SocketInUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
}

#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    config: ServerConfig,
    handle: RunHandle,
    /// (dev, inode) of the socket we bound, so shutdown never removes a successor's socket.
    identity: (u64, u64),
    stale_removed: bool,
}

impl ControlServer {
    /// Binds the socket. Must be called inside a tokio runtime.
    pub fn bind(config: ServerConfig, handle: RunHandle) -> Result<Self, ServerError> {
        let path = config.socket_path.clone();
        check_socket_path_len(&path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        ensure_private_dir(dir)?;
        let stale_removed = remove_stale_socket(&path)?;
        let io_err = |action: &'static str| {
            let path = path.clone();
            move |source| ServerError::Io {
                action,
                path,
                cause: source,
            }
        };
        let listener = UnixListener::bind(&path).map_err(io_err("binding"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("setting mode 0600 on"))?;
        let meta = std::fs::symlink_metadata(&path).map_err(io_err("inspecting"))?;
        Ok(ControlServer {
            listener,
            config,
            handle,
            identity: (meta.dev(), meta.ino()),
            stale_removed,
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.config.socket_path
    }

    /// Whether binding replaced a socket left behind by a dead daemon.
    pub fn removed_stale_socket(&self) -> bool {
        self.stale_removed
    }

    /// Serves until shutdown is requested on the handle, then waits for every connection.
    pub async fn run(self) {
        let ControlServer {
            listener,
            config,
            handle,
            identity,
            ..
        } = self;
        let admission = Arc::new(std::sync::Mutex::new(Admission::new(Limits {
            max_connections: config.max_connections,
            reserved: config
                .reserved_for_requests
                .min(config.max_connections.saturating_sub(1)),
            min_idle: config.evict_idle_after,
        })));
        let conn_cfg = Arc::new(ConnectionConfig {
            hello_timeout: config.hello_timeout,
            idle_timeout: config.idle_timeout,
            write_timeout: config.write_timeout,
            allowed_uids: config.allowed_uids.clone(),
            dispatch: config.dispatch.clone(),
        });
        // Each connection task holds a sender; when all are dropped, `recv` returns None.
        let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
        let mut shutdown = handle.shutdown_listener();
        let mut expiry = tokio::time::interval(config.expiry_tick);
        let mut accept_backoff = Duration::from_millis(50);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.recv() => break,
                _ = expiry.tick() => expire_pending(&handle),
                accepted = listener.accept() => match accepted {
                    Ok((mut stream, _)) => {
                        accept_backoff = Duration::from_millis(50);
                        let evict = Arc::new(Notify::new());
                        let admitted = admission.lock().unwrap_or_else(|e| e.into_inner())
                            .admit(std::time::Instant::now(), evict.clone());
                        let id = match admitted {
                            Ok((id, evicted)) => {
                                if let Some(e) = evicted {
                                    tracing::info!(connection = e.id, phase = ?e.phase, "a control connection gave way to a new one at the connection limit");
                                    e.payload.notify_one();
                                }
                                id
                            }
                            Err(msg) => {
                                tracing::warn!("{msg}");
                                // Off the accept loop, so a client that never reads cannot
                                // stall it; the client's hello is read first, so its write
                                // does not meet a closed socket and it reads this reason.
                                tokio::spawn(async move {
                                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                                        write_frame(&mut stream, &error(ErrorCode::Refused, msg)).await?;
                                        let mut sink = [0u8; 4096];
                                        tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await
                                    }).await;
                                });
                                continue;
                            }
                        };
                        let slot = Slot::new(id, admission.clone(), evict);
                        let (h, c, s, done) = (handle.clone(), conn_cfg.clone(), handle.shutdown_listener(), done_tx.clone());
                        tokio::spawn(async move {
                            let ended = connection::serve(stream, h, c, s, slot).await;
                            log_end(&ended);
                            drop(done);
                        });
                    }
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning, keep serving.
                        tracing::error!(error = %e, "accepting a control connection failed; retrying in {accept_backoff:?}");
                        tokio::time::sleep(accept_backoff).await;
                        accept_backoff = (accept_backoff * 2).min(Duration::from_secs(5));
                    }
                },
            }
        }
        drop(listener);
        drop(done_tx);
        let _ = done_rx.recv().await;
        remove_if_ours(&config.socket_path, identity);
    }
}

fn expire_pending(handle: &RunHandle) {
    let expired = handle.with_pending(|p| p.expire(dflash_shared::clock::now_ms()));
    for a in expired {
        if !handle.withdrawal_gets_a_line(&a.id, "expired") {
            continue;
        }
        handle.record_event_logged(
            Severity::Info,
            EventKind::Note {
                message: format!(
                    "pending action {} ({}) expired unconfirmed",
                    a.id,
                    a.action.title()
                ),
            },
        );
    }
}

fn log_end(ended: &Ended) {
    match ended {
        Ended::ClientClosed | Ended::Shutdown => {
            tracing::debug!(?ended, "control connection ended")
        }
        Ended::Refused(m) => tracing::warn!("refused control connection: {m}"),
        other => tracing::info!(ended = ?other, "control connection ended"),
    }
}

/// Removes `path` if it is a socket nobody listens on. Returns whether it removed one.
fn remove_stale_socket(path: &Path) -> Result<bool, ServerError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(ServerError::Io {
                action: "inspecting",
                path: path.into(),
                cause: source,
            })
        }
    };
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_socket() {
        return Err(ServerError::NotASocket(path.into()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(ServerError::SocketInUse(path.into())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|source| ServerError::Io {
                action: "removing stale socket",
                path: path.into(),
                cause: source,
            })?;
            tracing::info!(path = %path.display(), "removed a stale control socket (nobody was listening)");
            Ok(true)
        }
        Err(source) => Err(ServerError::Io {
            action: "probing existing socket",
            path: path.into(),
            cause: source,
        }),
    }
}

fn remove_if_ours(path: &Path, identity: (u64, u64)) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if (meta.dev(), meta.ino()) == identity {
            let _ = std::fs::remove_file(path);
        }
    }
}
