//! Byte sizes in a config: an integer of bytes or a string with a unit (`"16 GiB"`).
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::format::parse_bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn gib(n: u64) -> Self {
        ByteSize(n << 30)
    }

    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    /// Exact: `16 GiB` when a whole number of GiB/MiB/KiB, otherwise the byte count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (scale, unit) in UNITS {
            if self.0 >= scale && self.0 % scale == 0 {
                return write!(f, "{} {unit}", self.0 / scale);
            }
        }
        write!(f, "{} B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte size (an integer of bytes, or a string such as \"16 GiB\")")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v).map(ByteSize).map_err(|_| {
                    E::custom(format!("expected a byte size of at least 0, found {v}"))
                })
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_bytes(v).map(ByteSize).map_err(|why| {
                    let hint = if why.starts_with("unknown unit") {
                        format!("; {why}")
                    } else {
                        String::new()
                    };
                    E::custom(format!(
                        "expected a byte size such as \"16 GiB\", found \"{v}\"{hint}"
                    ))
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_exact_units() {
        assert_eq!(ByteSize::gib(16).to_string(), "16 GiB");
        assert_eq!(ByteSize(1536 << 20).to_string(), "1536 MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000 B");
    }
}
