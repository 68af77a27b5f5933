//! The HTTP side of `/metrics`: hyper on the daemon's tokio runtime, one task per connection.
//!
//! Each scrape reads the run's [`RunHandle`], the same state the control socket's `status`
//! serves, and renders it ([`super::exposition`]); nothing here keeps figures of its own.
//! Connections are capped and a request's headers must arrive within a few seconds, so a
//! stuck or flooding client costs a bounded number of idle tasks. Shutdown: the accept loop
//! ends on [`RunHandle::request_shutdown`] and aborts the open connections.
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dflash_shared::clock::now_ms;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::exposition::{self, Scrape};
use crate::run::handle::RunHandle;

/// Open connections at once; Prometheus keeps one per target, so this leaves room for a
/// few scrapers and curls, and a client past it is closed at once.
pub const MAX_CONNECTIONS: usize = 16;
/// A request whose headers take longer than this is dropped.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum ExporterError {
    #[error(
        "cannot serve Prometheus metrics on {addr}: {cause}. Choose another address or port \
         (metrics.listen in the config, or --metrics-listen; port 0 takes any free port), or \
         leave both out to serve no /metrics endpoint"
    )]
    Bind { addr: SocketAddr, cause: io::Error },
}

/// A bound `/metrics` listener, not yet accepting.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    handle: RunHandle,
}

impl MetricsServer {
    /// Binds `addr` (port 0: any free port; [`MetricsServer::local_addr`] says which). Must be
    /// called inside a tokio runtime.
    pub fn bind(addr: SocketAddr, handle: RunHandle) -> Result<Self, ExporterError> {
        let bind_error = |source| ExporterError::Bind {
            addr,
            cause: source,
        };
        let std_listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
        std_listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = std_listener.local_addr().map_err(bind_error)?;
        let listener = TcpListener::from_std(std_listener).map_err(bind_error)?;
        Ok(MetricsServer {
            listener,
            local_addr,
            handle,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The scrape address, as a Prometheus `static_configs` target or a browser wants it.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.local_addr)
    }

    /// Serves until the run's shutdown.
    pub async fn run(self) {
        let MetricsServer {
            listener, handle, ..
        } = self;
        let mut shutdown = handle.shutdown_listener();
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                _ = shutdown.recv() => break,
                accepted = listener.accept() => accepted,
            };
            // Reap finished connections so the set does not grow with every scrape.
            while connections.try_join_next().is_some() {}
            let (stream, _) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                continue; // dropping the stream closes it
            };
            let handle = handle.clone();
            connections.spawn(async move {
                let service = service_fn(move |req| {
                    let response = respond(&handle, &req);
                    async move { Ok::<_, Infallible>(response) }
                });
                let served = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    tracing::debug!(error = %e, "metrics endpoint: connection ended");
                }
                drop(permit);
            });
        }
        connections.shutdown().await;
    }
}

/// The text of one scrape of `handle`.
pub fn scrape(handle: &RunHandle) -> String {
    let (status, last) = handle.status_and_last_metrics();
    let environment = handle.fingerprint();
    exposition::render(&Scrape {
        status: &status,
        last: last.as_ref(),
        environment: environment.as_ref(),
        now_ms: now_ms(),
    })
}

fn respond(handle: &RunHandle, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let readable = matches!(*req.method(), Method::GET | Method::HEAD);
    match req.uri().path() {
        "/metrics" if readable => reply(StatusCode::OK, exposition::CONTENT_TYPE, scrape(handle)),
        "/" if readable => reply(
            StatusCode::OK,
            PLAIN,
            "dflashd: Prometheus metrics are served at /metrics\n".into(),
        ),
        "/metrics" | "/" => {
            let mut r = reply(
                StatusCode::METHOD_NOT_ALLOWED,
                PLAIN,
                "only GET and HEAD are served here\n".into(),
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: dflashd serves Prometheus metrics at /metrics\n".into(),
        ),
    }
}

const PLAIN: &str = "text/plain; charset=utf-8";

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
