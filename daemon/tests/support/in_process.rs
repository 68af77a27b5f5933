//! A real control plane on a real Unix socket in a temp dir, and a blocking line client.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use dflash_shared::protocol::{Request, Response, PROTOCOL_VERSION};
use dflashd::control::server::{ControlServer, ServerConfig};
use dflashd::run::bus::FrameBus;
use dflashd::run::handle::{RunHandle, RunHandleParts};
use dflashd::run::journal::Journal;
use dflashd::run::pending::ActionPolicy;

pub const RUN_NAME: &str = "qwen27b-run1";

pub struct TestDaemon {
    pub handle: RunHandle,
    pub socket: PathBuf,
    pub run_dir: PathBuf,
    thread: Option<JoinHandle<()>>,
    pub dir: tempfile::TempDir,
}

pub struct Options {
    pub bus_capacity: usize,
    pub tweak: Box<dyn FnOnce(&mut ServerConfig) + Send>,
    pub policy: ActionPolicy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bus_capacity: 1024,
            tweak: Box::new(|_| {}),
            policy: ActionPolicy::new(RUN_NAME),
        }
    }
}

impl TestDaemon {
    pub fn start() -> Self {
        Self::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        std::fs::create_dir_all(&run_dir).unwrap();
        let (journal, _) = Journal::open(&run_dir).unwrap();
        let handle = RunHandle::new(RunHandleParts {
            policy: opts.policy,
            run_dir: run_dir.clone(),
            journal,
            bus: FrameBus::new(opts.bus_capacity),
            recorder: None,
            config_path: None,
        });
        let socket = dir.path().join("sock").join("dflashd.sock");
        let mut cfg = ServerConfig::new(&socket);
        (opts.tweak)(&mut cfg);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let h = handle.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = ControlServer::bind(cfg, h).unwrap();
                ready_tx.send(()).unwrap();
                server.run().await;
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("server bound");
        TestDaemon {
            handle,
            socket,
            run_dir,
            thread: Some(thread),
            dir,
        }
    }

    pub fn connect(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// Connects and completes the hello.
    pub fn client(&self) -> Client {
        let mut c = self.connect();
        match c.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client: "test".into(),
            access: Default::default(),
        }) {
            Response::Welcome { .. } => c,
            other => panic!("expected welcome, got {other:?}"),
        }
    }

    /// Waits for the server loop to return (after a shutdown request).
    pub fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.handle.request_shutdown("test over");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What [`Client::next_frame`] found.
#[derive(Debug)]
pub enum Next {
    Frame(Response),
    Closed,
    Quiet,
}

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Self {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Client {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
        self.writer.flush().unwrap();
    }

    /// Sends `n` requests whose replies are large (status, config, the whole journal tail)
    /// in one go and never reads them: a client that stopped reading. Gives up quietly once
    /// the daemon stops taking them (its replies filled the socket, so it reads no more).
    pub fn send_unread_requests(&mut self, n: usize) {
        let mut bytes = Vec::new();
        for i in 0..n {
            let req = match i % 3 {
                0 => Request::Status,
                1 => Request::Config,
                _ => Request::Events {
                    after_seq: None,
                    last: Some(4096),
                },
            };
            bytes.extend(serde_json::to_vec(&req).unwrap());
            bytes.push(b'\n');
        }
        self.writer
            .set_write_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let _ = self.writer.write_all(&bytes);
    }

    pub fn send(&mut self, req: &Request) {
        let mut line = serde_json::to_vec(req).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// The next frame; `None` at EOF.
    pub fn recv(&mut self) -> Option<Response> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad frame {line:?}: {e}")),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading a frame: {e}"),
        }
    }

    /// The next frame, or whether the connection was closed or stayed quiet for the read
    /// timeout.
    pub fn next_frame(&mut self) -> Next {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Next::Closed,
            Ok(_) => Next::Frame(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad frame {line:?}: {e}")),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Next::Closed,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Next::Quiet
            }
            Err(e) => panic!("reading a frame: {e}"),
        }
    }

    /// The reading side, with whatever it has buffered, for a reader thread.
    pub fn into_reader(self) -> BufReader<UnixStream> {
        self.reader
    }

    pub fn request(&mut self, req: &Request) -> Response {
        self.send(req);
        self.recv().expect("a reply")
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.writer.set_read_timeout(Some(t)).unwrap();
    }
}

pub fn error_code(r: &Response) -> dflash_shared::protocol::ErrorCode {
    match r {
        Response::Error { code, .. } => *code,
        other => panic!("expected an error reply, got {other:?}"),
    }
}
