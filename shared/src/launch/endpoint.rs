//! The rendezvous address: `HOST:PORT`, `[IPv6]:PORT`, or a host and a port given apart
//! (`MASTER_ADDR`, `MASTER_PORT`).
use serde::{Deserialize, Serialize};

/// Where every node meets node 0's store. The host is kept as written (a name or an address):
/// resolving it is the connecting side's job, and each node may resolve it differently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendezvous {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What `--rendezvous` accepts, for error messages.
pub const RENDEZVOUS_EXPECTED: &str = "HOST:PORT (node 0's address and a free port, e.g. \
                                       node01:29500 or [fd00::1]:29500)";

/// Parses `HOST:PORT` or `[IPv6]:PORT`; the error says what was found.
pub fn parse_rendezvous(text: &str) -> Result<Rendezvous, String> {
    let text = text.trim();
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{text:?} opens '[' and never closes it"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("{text:?} has no :PORT after the bracketed address"))?;
        (host, port)
    } else {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("{text:?} has no :PORT"))?;
        if host.contains(':') {
            return Err(format!(
                "{text:?} looks like a bare IPv6 address: write it in brackets, [ADDR]:PORT"
            ));
        }
        (host, port)
    };
    Ok(Rendezvous {
        host: parse_host(host).map_err(|e| format!("{text:?}: {e}"))?,
        port: parse_port(port).map_err(|e| format!("{text:?}: {e}"))?,
    })
}

/// A host name or address: non-empty, no whitespace.
pub fn parse_host(host: &str) -> Result<String, String> {
    let host = host.trim();
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    if host.chars().any(char::is_whitespace) {
        return Err(format!("the host {host:?} contains whitespace"));
    }
    Ok(host.to_string())
}

/// A TCP port every node can connect to: 1..=65535 (0, "any free port", names no port the
/// other nodes could know).
pub fn parse_port(port: &str) -> Result<u16, String> {
    match port.trim().parse::<u32>() {
        Ok(0) => Err("port 0 is not a port the other nodes can reach: name one, e.g. 29500".into()),
        Ok(p) if p <= u32::from(u16::MAX) => Ok(p as u16),
        Ok(p) => Err(format!("port {p} is out of range (1-65535)")),
        Err(_) => Err(format!("the port {:?} is not a number", port.trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_addresses_and_bracketed_ipv6_parse_and_print_back() {
        for (text, host, port) in [
            ("node01:29500", "node01", 29500),
            ("10.0.0.7:1", "10.0.0.7", 1),
            ("[fd00::1]:65535", "fd00::1", 65535),
            (" n:29500 ", "n", 29500),
        ] {
            let r = parse_rendezvous(text).unwrap();
            assert_eq!((r.host.as_str(), r.port), (host, port), "{text}");
            assert_eq!(parse_rendezvous(&r.to_string()).unwrap(), r);
        }
    }

    #[test]
    fn malformed_addresses_say_what_is_wrong() {
        for (text, says) in [
            ("node01", "no :PORT"),
            (":29500", "host is empty"),
            ("node01:0", "port 0"),
            ("node01:70000", "out of range"),
            ("node01:http", "not a number"),
            ("fd00::1:29500", "brackets"),
            ("[fd00::1", "never closes"),
            ("[fd00::1]29500", "no :PORT"),
        ] {
            let err = parse_rendezvous(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
