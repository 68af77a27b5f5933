//! Framing, handshake and JSON round-trip tests for every message.
use super::samples::{all_requests, all_responses, step_metrics};
use super::*;

/// Encoded frames are one line of valid JSON, carry the tag the tables list, and decode back to
/// the same value. (nvtop once shipped a JSON mode whose output did not parse.)
#[test]
fn every_request_round_trips_as_one_line_of_valid_json() {
    for request in all_requests() {
        let frame = encode_frame(&request).unwrap();
        assert_eq!(frame.last(), Some(&b'\n'));
        assert_eq!(
            frame.iter().filter(|&&b| b == b'\n').count(),
            1,
            "{request:?}"
        );
        let value: serde_json::Value = serde_json::from_slice(&frame).expect("valid JSON");
        let tag = value["type"].as_str().expect("type tag");
        assert_eq!(tag, request_type(&request));
        assert!(REQUEST_TYPES.contains(&tag), "REQUEST_TYPES lacks '{tag}'");
        assert_eq!(decode_request(&frame).unwrap(), request);
    }
}

#[test]
fn every_response_round_trips_as_one_line_of_valid_json() {
    for response in all_responses() {
        let frame = encode_frame(&response).unwrap();
        assert_eq!(
            frame.iter().filter(|&&b| b == b'\n').count(),
            1,
            "{response:?}"
        );
        let value: serde_json::Value = serde_json::from_slice(&frame).expect("valid JSON");
        let tag = value["type"].as_str().expect("type tag");
        assert_eq!(tag, response_type(&response));
        assert!(
            RESPONSE_TYPES.contains(&tag),
            "RESPONSE_TYPES lacks '{tag}'"
        );
        assert_eq!(decode_response(&frame).unwrap(), response);
    }
}

#[test]
fn tag_tables_have_no_entries_without_a_variant() {
    let requests: Vec<_> = all_requests().iter().map(request_type).collect();
    for tag in REQUEST_TYPES {
        assert!(requests.contains(tag), "no request variant for '{tag}'");
    }
    let responses: Vec<_> = all_responses().iter().map(response_type).collect();
    for tag in RESPONSE_TYPES {
        assert!(responses.contains(tag), "no response variant for '{tag}'");
    }
}

#[test]
fn subscription_frames_are_pushed_and_everything_else_is_a_reply() {
    const PUSHED: [&str; 6] = ["metrics", "gpus", "queue", "event", "log", "dropped"];
    for response in all_responses() {
        let tag = response_type(&response);
        assert_eq!(response.is_pushed(), PUSHED.contains(&tag), "{tag}");
    }
}

#[test]
fn nan_loss_survives_the_wire() {
    let mut metrics = step_metrics();
    metrics.loss = f64::NAN;
    metrics.grad_norm = f64::INFINITY;
    let frame = encode_frame(&Response::Metrics(Box::new(metrics))).unwrap();
    serde_json::from_slice::<serde_json::Value>(&frame).expect("valid JSON");
    let Response::Metrics(back) = decode_response(&frame).unwrap() else {
        panic!("not metrics")
    };
    assert!(back.loss.is_nan());
    // JSON has no infinity; it travels as null like NaN and reads back as NaN, not as an error.
    assert!(back.grad_norm.is_nan());
}

#[test]
fn garbage_bytes_are_bad_frames_not_panics() {
    let cases: &[&[u8]] = &[
        b"\xff\xfe\x00garbage",
        b"hello there\n",
        b"{\"type\":",
        b"[1,2,3]",
        b"42",
        b"null",
        b"\n",
        b"   \r\n",
        b"{}",
        b"{\"type\":7}",
        b"{\"version\":1}",
        b"{\"type\":\"hello\"}",
        b"{\"type\":\"hello\",\"version\":\"one\",\"client\":\"x\"}",
        b"{\"type\":\"request_action\",\"action\":{\"action\":\"format_disk\"}}",
    ];
    for case in cases {
        let err = decode_request(case).unwrap_err();
        assert!(
            matches!(err, FrameError::BadJson(_)),
            "{:?} -> {err:?}",
            String::from_utf8_lossy(case)
        );
        let Response::Error { code, message } = err.to_reply() else {
            panic!()
        };
        assert_eq!(code, ErrorCode::BadFrame);
        assert!(!message.is_empty());
        // The reply itself must be a valid frame.
        encode_frame(&err.to_reply()).unwrap();
    }
}

#[test]
fn bad_frame_messages_say_what_was_wrong() {
    let msg = |b: &[u8]| decode_request(b).unwrap_err().to_string();
    assert_eq!(
        msg(b"\xff\xfe"),
        "malformed frame: not UTF-8 (invalid byte at offset 0)"
    );
    assert_eq!(
        msg(b"[1]"),
        "malformed frame: expected a JSON object, found an array"
    );
    assert_eq!(msg(b"{}"), "malformed frame: missing field \"type\"");
    assert_eq!(
        msg(b"{\"type\":7}"),
        "malformed frame: field \"type\" must be a string, found a number"
    );
    assert_eq!(
        msg(b"{\"type\":\"hello\"}"),
        "malformed frame: 'hello': missing field `version`"
    );
}

#[test]
fn unknown_request_type_is_named_in_the_error() {
    let err = decode_request(b"{\"type\":\"rm_rf\",\"path\":\"/\"}\n").unwrap_err();
    assert_eq!(err, FrameError::UnknownType("rm_rf".into()));
    let Response::Error { code, message } = err.to_reply() else {
        panic!()
    };
    assert_eq!(code, ErrorCode::UnknownRequest);
    assert_eq!(message, "unknown message type 'rm_rf'");
    // A hostile, huge tag is not echoed in full.
    let long = format!("{{\"type\":\"{}\"}}", "x".repeat(10_000));
    let FrameError::UnknownType(tag) = decode_request(long.as_bytes()).unwrap_err() else {
        panic!()
    };
    assert!(tag.chars().count() <= 65);
}

#[test]
fn oversize_frames_are_refused_both_ways() {
    let big = format!(
        "{{\"type\":\"status\",\"pad\":\"{}\"}}",
        "a".repeat(MAX_FRAME_BYTES)
    );
    let err = decode_request(big.as_bytes()).unwrap_err();
    assert!(matches!(
        err,
        FrameError::TooLarge {
            max: MAX_FRAME_BYTES,
            ..
        }
    ));
    assert_eq!(err.code(), ErrorCode::FrameTooLarge);

    let huge = Response::Log {
        level: "INFO".into(),
        line: "y".repeat(MAX_FRAME_BYTES),
    };
    assert!(matches!(
        encode_frame(&huge),
        Err(FrameError::TooLarge { .. })
    ));

    // Exactly at the limit (newline included) is fine; one byte more is not.
    let overhead = encode_frame(&Response::Log {
        level: String::new(),
        line: String::new(),
    })
    .unwrap()
    .len();
    let fits = Response::Log {
        level: String::new(),
        line: "z".repeat(MAX_FRAME_BYTES - overhead),
    };
    let frame = encode_frame(&fits).unwrap();
    assert_eq!(frame.len(), MAX_FRAME_BYTES);
    assert_eq!(decode_response(&frame).unwrap(), fits);
    let over = Response::Log {
        level: String::new(),
        line: "z".repeat(MAX_FRAME_BYTES - overhead + 1),
    };
    assert!(encode_frame(&over).is_err());
}

#[test]
fn lenient_on_crlf_and_unknown_extra_fields() {
    let r = decode_request(b"{\"type\":\"status\",\"from_future\":true}\r\n").unwrap();
    assert_eq!(r, Request::Status);
}

#[test]
fn splitter_yields_lines_across_arbitrary_chunking() {
    let mut wire = Vec::new();
    for r in all_requests() {
        wire.extend(encode_frame(&r).unwrap());
    }
    for chunk in [1, 3, 17, 4096] {
        let mut splitter = FrameSplitter::new();
        let mut got = Vec::new();
        for piece in wire.chunks(chunk) {
            for line in splitter.push(piece) {
                got.push(decode_request(&line.unwrap()).unwrap());
            }
        }
        assert_eq!(got, all_requests(), "chunk size {chunk}");
        assert_eq!(splitter.finish(), None);
    }
}

#[test]
fn splitter_drops_an_oversize_line_without_buffering_it_and_resyncs() {
    let mut splitter = FrameSplitter::new();
    let mut results = Vec::new();
    let junk = vec![b'q'; 64 * 1024];
    for _ in 0..(3 * MAX_FRAME_BYTES / junk.len()) {
        results.extend(splitter.push(&junk));
        assert!(splitter.buffered() < MAX_FRAME_BYTES);
    }
    results.extend(splitter.push(b"tail\n{\"type\":\"status\"}\n"));
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        matches!(results[0], Err(FrameError::TooLarge { len, .. }) if len == 3 * MAX_FRAME_BYTES + 5)
    );
    assert_eq!(
        decode_request(results[1].as_ref().unwrap()).unwrap(),
        Request::Status
    );
}

#[test]
fn splitter_reports_a_truncated_last_frame() {
    let mut splitter = FrameSplitter::new();
    assert!(splitter.push(b"{\"type\":\"sta").is_empty());
    assert!(matches!(splitter.finish(), Some(FrameError::BadJson(m)) if m.contains("12 bytes")));
}

fn identity() -> ServerIdentity {
    ServerIdentity {
        run_name: "qwen36-27b".into(),
        daemon_pid: 4242,
    }
}

#[test]
fn negotiate_accepts_the_current_version() {
    let welcome = negotiate(&hello("dflash-tui"), &identity()).unwrap();
    assert_eq!(welcome.version, PROTOCOL_VERSION);
    assert_eq!(welcome.run_name, "qwen36-27b");
    let reply: Response = welcome.clone().into();
    assert_eq!(accept_welcome(&reply).unwrap(), welcome);
}

#[test]
fn negotiate_refuses_a_wrong_version_and_says_both() {
    let newer = Request::Hello {
        version: PROTOCOL_VERSION + 1,
        client: "dflash-tui 9".into(),
        access: Default::default(),
    };
    let err = negotiate(&newer, &identity()).unwrap_err();
    assert_eq!(err.code, ErrorCode::VersionMismatch);
    assert_eq!(
        err.message,
        format!(
            "client 'dflash-tui 9' speaks protocol v{}, this dflashd speaks v{PROTOCOL_VERSION}: \
             this dflashd is older than the client; upgrade dflashd or use a matching dflash-tui",
            PROTOCOL_VERSION + 1
        )
    );
    let older = Request::Hello {
        version: 0,
        client: "x".into(),
        access: Default::default(),
    };
    assert!(negotiate(&older, &identity())
        .unwrap_err()
        .message
        .contains("upgrade the client"));
    // The client turns the daemon's refusal into the same error.
    let refused: Response = err.clone().into();
    assert_eq!(accept_welcome(&refused).unwrap_err(), err);
}

#[test]
fn negotiate_requires_hello_first() {
    let err = negotiate(&Request::Status, &identity()).unwrap_err();
    assert_eq!(err.code, ErrorCode::HelloRequired);
    assert!(err.message.ends_with("got 'status'"), "{}", err.message);
}

#[test]
fn client_rejects_a_welcome_it_cannot_speak_or_a_non_welcome() {
    let future = Response::Welcome {
        version: PROTOCOL_VERSION + 5,
        run_name: "r".into(),
        daemon_pid: 1,
    };
    assert_eq!(
        accept_welcome(&future).unwrap_err().code,
        ErrorCode::VersionMismatch
    );
    assert_eq!(
        accept_welcome(&Response::Ok).unwrap_err().code,
        ErrorCode::BadFrame
    );
}

#[test]
fn a_read_only_hello_says_so_on_the_wire_and_a_full_one_reads_as_before() {
    let full = String::from_utf8(encode_frame(&hello("t")).unwrap()).unwrap();
    assert_eq!(
        full,
        "{\"type\":\"hello\",\"version\":1,\"client\":\"t\"}\n"
    );
    let ro = encode_frame(&hello_with("t", Access::ReadOnly)).unwrap();
    assert!(String::from_utf8_lossy(&ro).contains("\"access\":\"read_only\""));
    assert_eq!(
        decode_request(&ro).unwrap(),
        hello_with("t", Access::ReadOnly)
    );
    // An old client's hello (no `access`) is a full one.
    assert_eq!(decode_request(full.trim().as_bytes()).unwrap(), hello("t"));
}
