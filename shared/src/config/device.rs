//! Devices as the config names them: `"cpu"` or `"cuda:N"`.
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    Cpu,
    Cuda(u32),
}

impl Device {
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    pub fn cuda_index(&self) -> Option<u32> {
        match self {
            Device::Cuda(i) => Some(*i),
            Device::Cpu => None,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The message says what was expected and what was found, so a config error can quote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected \"cpu\" or \"cuda:N\" (N = GPU index), found \"{0}\"")]
pub struct DeviceParseError(pub String);

impl FromStr for Device {
    type Err = DeviceParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("cpu") {
            return Ok(Device::Cpu);
        }
        let index = t
            .strip_prefix("cuda:")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok());
        index
            .map(Device::Cuda)
            .ok_or_else(|| DeviceParseError(s.to_string()))
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda:7".parse::<Device>().unwrap(), Device::Cuda(7));
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        for bad in ["gpu0", "cuda", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", ""] {
            let err = bad.parse::<Device>().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("expected \"cpu\" or \"cuda:N\" (N = GPU index), found \"{bad}\"")
            );
        }
    }
}
