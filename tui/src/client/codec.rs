//! One frame is one line of JSON, at most `MAX_FRAME_BYTES` with its newline. Encoding,
//! decoding and line splitting are the shared protocol's (`dflash_shared::protocol`); this adds
//! the async read side.
use std::collections::VecDeque;

use dflash_shared::protocol::{decode_response, encode_frame, FrameError, FrameSplitter, Response};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::ClientError;

/// Reads frames from a stream. A garbled or oversize frame is an `Err` item and reading goes
/// on at the next line; only an I/O error or the end of the stream ends it.
pub struct FrameReader<R> {
    inner: R,
    splitter: FrameSplitter,
    ready: VecDeque<Result<Response, ClientError>>,
    buf: Vec<u8>,
    ended: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            splitter: FrameSplitter::new(),
            ready: VecDeque::new(),
            buf: vec![0; 64 * 1024],
            ended: false,
        }
    }

    /// The next frame, a recoverable frame error, an I/O error (after which the stream has
    /// ended), or `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Result<Response, ClientError>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if self.ended {
                return None;
            }
            match self.inner.read(&mut self.buf).await {
                Ok(0) => {
                    self.ended = true;
                    if let Some(e) = std::mem::take(&mut self.splitter).finish() {
                        self.ready.push_back(Err(frame_error(e, "")));
                    }
                }
                Ok(n) => {
                    for line in self.splitter.push(&self.buf[..n]) {
                        let frame = line.map_err(|e| frame_error(e, "")).and_then(|bytes| {
                            decode_response(&bytes)
                                .map_err(|e| frame_error(e, &String::from_utf8_lossy(&bytes)))
                        });
                        self.ready.push_back(frame);
                    }
                }
                Err(e) => {
                    self.ended = true;
                    return Some(Err(ClientError::Io(e)));
                }
            }
        }
    }
}

/// One frame, newline included, refusing oversize frames before they are sent.
pub fn encode<T: Serialize>(frame: &T) -> Result<Vec<u8>, ClientError> {
    encode_frame(frame).map_err(|e| frame_error(e, ""))
}

fn frame_error(error: FrameError, line: &str) -> ClientError {
    match error {
        FrameError::TooLarge { len, max } => ClientError::FrameTooLarge { len, max },
        other => ClientError::BadFrame {
            preview: preview(line),
            reason: other.to_string(),
        },
    }
}

/// The first characters of a line, for error messages that must not dump a megabyte.
pub fn preview(line: &str) -> String {
    const MAX: usize = 120;
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::protocol::{Request, Topic, MAX_FRAME_BYTES};

    #[test]
    fn frames_are_single_lines_and_round_trip() {
        let reply = Response::Log {
            level: "info".into(),
            line: "a\nb".into(),
        };
        let bytes = encode(&reply).unwrap();
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(decode_response(&bytes).unwrap(), reply);
        let request = Request::Subscribe {
            topics: vec![Topic::Metrics],
        };
        assert!(encode(&request).is_ok());
    }

    #[test]
    fn oversize_frames_are_refused_before_sending() {
        let huge = Response::Log {
            level: "info".into(),
            line: "x".repeat(MAX_FRAME_BYTES),
        };
        assert!(matches!(
            encode(&huge),
            Err(ClientError::FrameTooLarge { .. })
        ));
    }

    #[tokio::test]
    async fn the_reader_reports_bad_frames_and_goes_on() {
        let huge = format!("{}\n", "x".repeat(MAX_FRAME_BYTES + 5));
        let stream = format!("{{\"type\":\"ok\"}}\nnot json\n{huge}{{\"type\":\"ok\"}}\npartial");
        let mut reader = FrameReader::new(stream.as_bytes());
        assert_eq!(reader.next().await.unwrap().unwrap(), Response::Ok);
        assert!(matches!(
            reader.next().await,
            Some(Err(ClientError::BadFrame { .. }))
        ));
        assert!(matches!(
            reader.next().await,
            Some(Err(ClientError::FrameTooLarge { .. }))
        ));
        assert_eq!(reader.next().await.unwrap().unwrap(), Response::Ok);
        assert!(matches!(
            reader.next().await,
            Some(Err(ClientError::BadFrame { .. }))
        ));
        assert!(reader.next().await.is_none());
    }
}
