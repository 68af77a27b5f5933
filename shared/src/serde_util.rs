//! Serde helpers for wire-format quirks.
use serde::{Deserialize, Deserializer};

/// serde_json writes a non-finite `f64` (a NaN loss, an infinite gradient norm) as `null`, and
/// would then refuse to read that `null` back as a number. A diverged run is exactly when an
/// operator needs the metrics stream, so `null` reads back as NaN instead of killing the frame.
pub(crate) fn f64_or_nan<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}
