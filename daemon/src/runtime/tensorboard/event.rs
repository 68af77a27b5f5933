//! The protobuf messages of a scalar event file, declared by hand and encoded by prost's derive
//! (no protoc). The field numbers are TensorFlow's, as TensorBoard's bundled copies of the
//! protos have them:
//! - tensorflow/core/util/event.proto: `Event { double wall_time = 1; int64 step = 2;
//!   oneof what { string file_version = 3; ...; Summary summary = 5; ... } }`;
//! - tensorflow/core/framework/summary.proto: `Summary { repeated Value value = 1; }`,
//!   `Summary.Value { string tag = 1; oneof value { float simple_value = 2; ... } }`.
//!
//! Fields and oneof members we never write are left out; a protobuf reader needs none of them.
use prost::Message;

use super::scalars::ScalarLine;

/// The first record of every event file; TensorBoard reads the files by this version's rules
/// (e.g. a step that goes back discards the points after it, as a resume after a kill needs).
pub const FILE_VERSION: &str = "brain.Event:2";

#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    pub what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A member of `oneof value`, so it is on the wire even when 0.0: as a plain proto3 float
    /// a zero would be left out and TensorBoard would find no value at all.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// The encoded `file_version` event.
pub fn file_version_event(wall_time: f64) -> Vec<u8> {
    Event {
        wall_time,
        step: 0,
        what: Some(What::FileVersion(FILE_VERSION.into())),
    }
    .encode_to_vec()
}

/// The encoded event with every scalar of one metrics line.
pub fn scalars_event(line: &ScalarLine) -> Vec<u8> {
    Event {
        wall_time: line.wall_time,
        step: line.step,
        what: Some(What::Summary(Summary {
            value: line
                .scalars
                .iter()
                .map(|s| SummaryValue {
                    tag: s.tag.clone(),
                    simple_value: Some(s.value),
                })
                .collect(),
        })),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tensorboard::scalars::Scalar;

    // The expected bytes are written from the protobuf wire format: a key byte is
    // `field_number << 3 | wire_type` (1: 64-bit, 2: length-delimited, 5: 32-bit).

    #[test]
    fn the_file_version_event_on_the_wire() {
        let mut want = vec![0x09]; // wall_time, 64-bit
        want.extend_from_slice(&1.5f64.to_le_bytes());
        // step 0 is proto3's default and is not written.
        want.extend_from_slice(&[0x1a, 13]); // file_version, length 13
        want.extend_from_slice(b"brain.Event:2");
        assert_eq!(file_version_event(1.5), want);
    }

    #[test]
    fn a_scalar_event_on_the_wire_keeps_a_zero_value() {
        let line = ScalarLine {
            step: 7,
            wall_time: 2.0,
            scalars: vec![Scalar {
                tag: "loss".into(),
                value: 0.0,
            }],
        };
        let value = [
            0x0a, 4, b'l', b'o', b's', b's', // tag
            0x15, 0, 0, 0, 0, // simple_value 0.0, 32-bit
        ];
        let mut summary = vec![0x0a, value.len() as u8]; // Summary.value
        summary.extend_from_slice(&value);
        let mut want = vec![0x09];
        want.extend_from_slice(&2.0f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 7]); // step, varint
        want.extend_from_slice(&[0x2a, summary.len() as u8]); // summary
        want.extend_from_slice(&summary);
        assert_eq!(scalars_event(&line), want);
    }
}
