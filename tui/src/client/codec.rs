//! One frame is one line of JSON. Both directions are capped at `MAX_FRAME_BYTES`.
use dflash_shared::protocol::MAX_FRAME_BYTES;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::codec::LinesCodec;

use super::ClientError;

/// A line codec that refuses lines over the protocol limit instead of buffering them.
pub fn line_codec() -> LinesCodec {
    LinesCodec::new_with_max_length(MAX_FRAME_BYTES)
}

/// Serializes a frame to one line (without the newline), refusing oversize frames.
pub fn encode<T: Serialize>(frame: &T) -> Result<String, ClientError> {
    let line = serde_json::to_string(frame).map_err(|e| ClientError::BadFrame {
        preview: String::new(),
        reason: format!("cannot serialize: {e}"),
    })?;
    if line.len() > MAX_FRAME_BYTES {
        return Err(ClientError::FrameTooLarge {
            len: line.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(line)
}

pub fn decode<T: DeserializeOwned>(line: &str) -> Result<T, ClientError> {
    serde_json::from_str(line).map_err(|e| ClientError::BadFrame {
        preview: preview(line),
        reason: e.to_string(),
    })
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
    use dflash_shared::protocol::{Request, Response, Topic};

    #[test]
    fn frames_round_trip_as_single_lines() {
        let request = Request::Subscribe {
            topics: vec![Topic::Metrics, Topic::Events],
        };
        let line = encode(&request).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(decode::<Request>(&line).unwrap(), request);
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
        match decode::<Response>(&garbage) {
            Err(ClientError::BadFrame { preview, .. }) => assert!(preview.chars().count() <= 121),
            other => panic!("expected BadFrame, got {other:?}"),
        }
    }
}
