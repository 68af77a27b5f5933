//! One frame is one line of JSON, at most `MAX_FRAME_BYTES` with its newline. Encoding and
//! decoding are the shared protocol's (`dflash_shared::protocol`); this adds the stream side.
use dflash_shared::protocol::{decode_response, encode_frame, FrameError, Response, MAX_FRAME_BYTES};
use serde::Serialize;
use tokio_util::codec::LinesCodec;

use super::ClientError;

/// A line codec that refuses lines over the protocol limit instead of buffering them.
pub fn line_codec() -> LinesCodec {
    // The limit counts the newline; LinesCodec's does not.
    LinesCodec::new_with_max_length(MAX_FRAME_BYTES - 1)
}

/// One frame, newline included, refusing oversize frames before they are sent.
pub fn encode<T: Serialize>(frame: &T) -> Result<Vec<u8>, ClientError> {
    encode_frame(frame).map_err(|e| frame_error(e, ""))
}

pub fn decode(line: &str) -> Result<Response, ClientError> {
    decode_response(line.as_bytes()).map_err(|e| frame_error(e, line))
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
    use dflash_shared::protocol::{Request, Topic};

    #[test]
    fn frames_are_single_lines_and_round_trip() {
        let reply = Response::Log {
            level: "info".into(),
            line: "a\nb".into(),
        };
        let bytes = encode(&reply).unwrap();
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        let line = std::str::from_utf8(&bytes).unwrap().trim_end();
        assert_eq!(decode(line).unwrap(), reply);
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
        assert!(matches!(encode(&huge), Err(ClientError::FrameTooLarge { .. })));
    }

    #[test]
    fn garbage_is_a_bad_frame_with_a_short_preview() {
        let garbage = "{not json".repeat(100);
        match decode(&garbage) {
            Err(ClientError::BadFrame { preview, .. }) => assert!(preview.chars().count() <= 121),
            other => panic!("expected BadFrame, got {other:?}"),
        }
    }
}
