//! A real Prometheus server and `promtool` (Debian's `prometheus` package) for the `/metrics`
//! tests, and a small HTTP client (hyper) to scrape and to query Prometheus's API. Loopback
//! only; every wait is bounded.
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// How long one HTTP exchange may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Tools {
    pub prometheus: PathBuf,
    pub promtool: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// `prometheus` and `promtool`, or `None` with a loud note when they are not installed and
/// nothing requires them. Under `make test` (`DFLASH_REQUIRE_PROMETHEUS=1`) and in CI
/// (`CI=true`) their absence fails the test instead.
pub fn tools() -> Option<Tools> {
    if let (Some(prometheus), Some(promtool)) = (on_path("prometheus"), on_path("promtool")) {
        return Some(Tools {
            prometheus,
            promtool,
        });
    }
    let text = "Debian's `prometheus` package (prometheus and promtool) is not installed: \
                `apt-get install --no-install-recommends prometheus`; `make test` installs it";
    let required = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("DFLASH_REQUIRE_PROMETHEUS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{text}. CI=true / DFLASH_REQUIRE_PROMETHEUS=1 require this test to run"
    );
    eprintln!("SKIPPED, NOT RUN: {text}");
    None
}

pub struct HttpReply {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// One HTTP/1.1 request to `addr` (loopback), its whole reply.
pub fn http(addr: SocketAddr, method: &str, target: &str) -> Result<HttpReply, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = hyper::Request::builder()
            .method(method)
            .uri(target)
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let reply = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = reply.status().as_u16();
        let content_type = reply
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = reply
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(HttpReply {
            status,
            content_type,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    rt.block_on(async {
        tokio::time::timeout(HTTP_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no reply from {addr} within {HTTP_TIMEOUT:?}"))?
    })
}

pub fn get(addr: SocketAddr, target: &str) -> Result<HttpReply, String> {
    http(addr, "GET", target)
}

/// `addr` of an `http://ADDR/metrics` URL.
pub fn url_addr(url: &str) -> SocketAddr {
    url.strip_prefix("http://")
        .and_then(|u| u.strip_suffix("/metrics"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not an http://ADDR/metrics URL: {url}"))
}

/// `promtool check metrics` on `text`: `Ok` when it is clean, else what promtool said.
pub fn promtool_check(promtool: &Path, text: &str, dir: &Path) -> Result<(), String> {
    let file = dir.join("scrape.txt");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .expect("run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("promtool check metrics ({}): {said}", out.status))
    }
}

/// A port nobody listens on right now (Prometheus cannot report a port 0 it bound).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a query-string value (RFC 3986 unreserved characters stay).
pub fn encode_query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server in `dir`, scraping `target` every second.
pub struct PrometheusServer {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
}

impl PrometheusServer {
    pub fn start(binary: &Path, dir: &Path, target: SocketAddr) -> PrometheusServer {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: dflashd\n    scrape_interval: 1s\n    \
                 scrape_timeout: 1s\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A port taken between the probe and Prometheus's bind makes it exit: try another.
        let mut last_log = String::new();
        for attempt in 0..3 {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let log = dir.join(format!("prometheus-{attempt}.log"));
            let mut child = Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join(format!("tsdb-{attempt}")).display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("spawn prometheus");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if get(addr, "/-/ready").is_ok_and(|r| r.status == 200) {
                    return PrometheusServer { child, addr, log };
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = child.kill();
            let _ = child.wait();
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
        }
        panic!("prometheus did not become ready on loopback:\n{last_log}");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/api/v1/<path>`, parsed; panics with Prometheus's own words when it is not JSON.
    pub fn api(&self, path_and_query: &str) -> serde_json::Value {
        let reply = get(self.addr, &format!("/api/v1/{path_and_query}"))
            .unwrap_or_else(|e| panic!("prometheus API: {e}\n{}", self.log()));
        serde_json::from_str(&reply.body).unwrap_or_else(|e| {
            panic!(
                "prometheus API {path_and_query}: {e}: {} {}",
                reply.status, reply.body
            )
        })
    }

    /// An instant query.
    pub fn query(&self, expr: &str) -> serde_json::Value {
        self.api(&format!("query?query={}", encode_query(expr)))
    }

    /// The scrape target's health and last error, as Prometheus reports them.
    pub fn target_health(&self) -> String {
        let targets = self.api("targets");
        targets["data"]["activeTargets"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| format!("{} {} {}", t["scrapeUrl"], t["health"], t["lastError"]))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|| targets.to_string())
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
