//! Newline-delimited JSON framing as pure functions.
//!
//! A frame is one JSON object on one line, terminated by `\n`, at most [`MAX_FRAME_BYTES`] bytes
//! including the newline. Decoding never panics on any input: garbage, truncated JSON, invalid
//! UTF-8 and oversize lines all come back as a [`FrameError`] the daemon can answer with
//! [`FrameError::to_reply`] before reading the next line.
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{ErrorCode, Request, Response, MAX_FRAME_BYTES};

/// Why a line is not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The line (or the encoded message) is longer than the frame limit.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    /// Not UTF-8, not JSON, not an object, no `"type"`, or fields of the wrong shape.
    #[error("malformed frame: {0}")]
    BadJson(String),
    /// A well-formed object whose `"type"` names no message this protocol version knows.
    #[error("unknown message type '{0}'")]
    UnknownType(String),
}

impl FrameError {
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            FrameError::BadJson(_) => ErrorCode::BadFrame,
            FrameError::UnknownType(_) => ErrorCode::UnknownRequest,
        }
    }

    /// The error frame the daemon sends back; the connection stays usable.
    pub fn to_reply(&self) -> Response {
        Response::Error {
            code: self.code(),
            message: self.to_string(),
        }
    }
}

/// Every `"type"` tag a [`Request`] may carry. Kept in sync by a test that encodes every variant.
pub const REQUEST_TYPES: &[&str] = &[
    "hello",
    "subscribe",
    "status",
    "config",
    "fingerprint",
    "caches",
    "checkpoints",
    "events",
    "request_action",
    "confirm",
    "cancel",
];

/// Every `"type"` tag a [`Response`] may carry.
pub const RESPONSE_TYPES: &[&str] = &[
    "welcome", "ok", "status", "json", "events", "pending", "executed", "error", "metrics", "gpus",
    "queue", "event", "log", "dropped",
];

/// Serializes `message` as one frame: compact JSON (never containing a raw newline) plus `\n`.
pub fn encode_frame<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let mut bytes = serde_json::to_vec(message).map_err(|e| FrameError::BadJson(e.to_string()))?;
    bytes.push(b'\n');
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: bytes.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(bytes)
}

/// Decodes one line (with or without its trailing `\n` / `\r\n`) sent by a client.
pub fn decode_request(line: &[u8]) -> Result<Request, FrameError> {
    decode_tagged(line, REQUEST_TYPES)
}

/// Decodes one line sent by the daemon.
pub fn decode_response(line: &[u8]) -> Result<Response, FrameError> {
    decode_tagged(line, RESPONSE_TYPES)
}

fn decode_tagged<T: DeserializeOwned>(line: &[u8], known: &[&str]) -> Result<T, FrameError> {
    let line = strip_line_ending(line);
    // The limit counts the terminating newline, as `encode_frame` does.
    if line.len() + 1 > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: line.len() + 1,
            max: MAX_FRAME_BYTES,
        });
    }
    let text = std::str::from_utf8(line).map_err(|e| {
        FrameError::BadJson(format!(
            "not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(FrameError::BadJson(
            "empty line; expected a JSON object".into(),
        ));
    }
    // Parse untyped first so an unknown `"type"` is told apart from a malformed message.
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| FrameError::BadJson(e.to_string()))?;
    let tag = match &value {
        serde_json::Value::Object(map) => match map.get("type") {
            Some(serde_json::Value::String(tag)) => tag.clone(),
            Some(other) => {
                return Err(FrameError::BadJson(format!(
                    "field \"type\" must be a string, found {}",
                    json_kind(other)
                )))
            }
            None => return Err(FrameError::BadJson("missing field \"type\"".into())),
        },
        other => {
            return Err(FrameError::BadJson(format!(
                "expected a JSON object, found {}",
                json_kind(other)
            )))
        }
    };
    if !known.contains(&tag.as_str()) {
        return Err(FrameError::UnknownType(truncate_for_message(&tag)));
    }
    serde_json::from_value(value).map_err(|e| FrameError::BadJson(format!("'{tag}': {e}")))
}

fn strip_line_ending(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Client-supplied text echoed in an error is capped so a hostile tag cannot bloat the reply.
fn truncate_for_message(text: &str) -> String {
    const MAX_CHARS: usize = 64;
    if text.chars().count() <= MAX_CHARS {
        text.to_string()
    } else {
        let head: String = text.chars().take(MAX_CHARS).collect();
        format!("{head}…")
    }
}

/// Splits a byte stream into lines without ever buffering more than one frame.
///
/// Bytes of an oversize line are discarded as they arrive (not accumulated) and the line is
/// reported once as [`FrameError::TooLarge`], after which the splitter resynchronises at the
/// next newline. This is what keeps a client that sends 1 GB without a newline from costing
/// the daemon 1 GB.
#[derive(Debug, Default)]
pub struct FrameSplitter {
    buf: Vec<u8>,
    /// Length of the oversize line being skipped, if any.
    discarding: Option<usize>,
}

impl FrameSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes`; returns every line completed by them (without the `\n`), in order.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Result<Vec<u8>, FrameError>> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let (chunk, rest, complete) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            bytes = rest;
            if let Some(skipped) = self.discarding.as_mut() {
                *skipped += chunk.len() + usize::from(complete);
                if complete {
                    out.push(Err(FrameError::TooLarge {
                        len: *skipped,
                        max: MAX_FRAME_BYTES,
                    }));
                    self.discarding = None;
                }
                continue;
            }
            // +1 counts the newline that ends (or will end) the line.
            if self.buf.len() + chunk.len() + 1 > MAX_FRAME_BYTES {
                let skipped = self.buf.len() + chunk.len() + usize::from(complete);
                self.buf = Vec::new();
                if complete {
                    out.push(Err(FrameError::TooLarge {
                        len: skipped,
                        max: MAX_FRAME_BYTES,
                    }));
                } else {
                    self.discarding = Some(skipped);
                }
                continue;
            }
            self.buf.extend_from_slice(chunk);
            if complete {
                out.push(Ok(std::mem::take(&mut self.buf)));
            }
        }
        out
    }

    /// Bytes of an unfinished line held right now (at most one frame).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// At end of stream: an unterminated final line is an error, not a frame.
    pub fn finish(self) -> Option<FrameError> {
        if let Some(len) = self.discarding {
            Some(FrameError::TooLarge {
                len,
                max: MAX_FRAME_BYTES,
            })
        } else if self.buf.is_empty() {
            None
        } else {
            Some(FrameError::BadJson(format!(
                "connection closed inside a frame ({} bytes without a newline)",
                self.buf.len()
            )))
        }
    }
}
