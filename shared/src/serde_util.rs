//! Serde helpers for wire-format quirks.
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// serde_json writes a non-finite `f64` (a NaN loss, an infinite gradient norm) as `null`, and
/// would then refuse to read that `null` back as a number. A diverged run is exactly when an
/// operator needs the metrics stream, so `null` reads back as NaN instead of killing the frame.
pub(crate) fn f64_or_nan<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// An optional field that a newer peer may write in a shape this build does not know (the
/// detector thresholds deny unknown fields, as a config must, so one added threshold would make
/// them unreadable) reads as `None` instead of making the whole frame unreadable.
pub(crate) fn none_if_unreadable<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}
