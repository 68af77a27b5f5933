//! The one device vocabulary: parsing a device name, checking it against what libtorch sees,
//! naming it, the compute dtype it trains in, and which libtorch this process loaded.
pub mod global_rng;
pub mod torch_panic;

use std::path::{Path, PathBuf};

use dflash_shared::config::Device as ConfigDevice;
use tch::{Device, Kind, Tensor};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    #[error("expected `cpu`, `cuda` (= `cuda:0`) or `cuda:N`, found `{0}`")]
    Unrecognised(String),
    #[error(
        "{device}: this machine has {visible} CUDA device(s) visible to libtorch (see `dflashd doctor`)"
    )]
    NotPresent { device: String, visible: usize },
}

/// A config device as a libtorch device, unchecked (see [`check`]).
pub fn from_config(d: ConfigDevice) -> Device {
    match d {
        ConfigDevice::Cpu => Device::Cpu,
        ConfigDevice::Cuda(i) => Device::Cuda(i as usize),
    }
}

/// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`, as the config spells it.
pub fn parse_config_device(name: &str) -> Result<ConfigDevice, DeviceError> {
    let name = if name == "cuda" { "cuda:0" } else { name };
    name.parse()
        .map_err(|_| DeviceError::Unrecognised(name.to_string()))
}

/// `cpu`, `cuda` or `cuda:N`, checked against the devices libtorch sees.
pub fn parse(name: &str) -> Result<Device, DeviceError> {
    let device = from_config(parse_config_device(name)?);
    check(device)?;
    Ok(device)
}

/// The number of CUDA devices libtorch sees (0 without CUDA).
pub fn visible_cuda_devices() -> usize {
    tch::Cuda::device_count().max(0) as usize
}

/// Whether `device` exists on this machine.
pub fn check(device: Device) -> Result<(), DeviceError> {
    if let Device::Cuda(i) = device {
        let visible = visible_cuda_devices();
        if i >= visible {
            return Err(DeviceError::NotPresent {
                device: name(device),
                visible,
            });
        }
    }
    Ok(())
}

/// "cpu", "cuda:3".
pub fn name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Mps => "mps".into(),
        Device::Vulkan => "vulkan".into(),
        Device::Cpu => "cpu".into(),
    }
}

/// Compute dtype: BF16 on GPU, fp32 on CPU (spec §2.8).
/// The short name of a compute dtype, as logs and reports print it: "bf16", "f16", "f32".
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bf16",
        Kind::Half => "f16",
        _ => "f32",
    }
}

pub fn compute_kind(device: Device) -> Kind {
    if device.is_cuda() {
        Kind::BFloat16
    } else {
        Kind::Float
    }
}

thread_local! {
    static PLACEMENTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `t` on `device` in `kind`: a copy when it is elsewhere or in another dtype, `t` itself
/// otherwise. Each call is counted per thread ([`placements_on_this_thread`]), so a test can
/// show that a large tensor (the evaluation's LM head, 2.4 GiB at the real size) is placed once
/// per evaluation rather than once per anchor chunk, also on the CPU where no byte moves.
pub fn place(t: &Tensor, device: Device, kind: Kind) -> Tensor {
    PLACEMENTS.with(|n| n.set(n.get() + 1));
    t.to_device(device).to_kind(kind)
}

/// How many [`place`] calls this thread has made.
pub fn placements_on_this_thread() -> u64 {
    PLACEMENTS.with(|n| n.get())
}

/// The directory of the `libtorch_cpu.so` this process has mapped (the libtorch it really
/// runs on, whatever RUNPATH or `LD_LIBRARY_PATH` said).
pub fn loaded_libtorch_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_names_say_what_is_expected() {
        assert_eq!(parse("cpu"), Ok(Device::Cpu));
        assert_eq!(parse_config_device("cuda"), Ok(ConfigDevice::Cuda(0)));
        assert_eq!(parse_config_device("cuda:3"), Ok(ConfigDevice::Cuda(3)));
        assert_eq!(name(from_config(ConfigDevice::Cuda(3))), "cuda:3");
        let err = parse("gpu0").unwrap_err();
        assert_eq!(err, DeviceError::Unrecognised("gpu0".into()));
        assert!(err.to_string().contains("`cuda:N`"), "{err}");
    }

    #[test]
    fn a_gpu_that_is_not_there_is_refused_with_the_count() {
        let missing = visible_cuda_devices() + 1;
        let err = parse(&format!("cuda:{missing}")).unwrap_err();
        assert!(
            matches!(&err, DeviceError::NotPresent { visible, .. } if *visible == missing - 1),
            "{err}"
        );
        assert!(err.to_string().contains("dflashd doctor"), "{err}");
    }

    #[test]
    fn cpu_computes_in_fp32_and_gpus_in_bf16() {
        assert_eq!(compute_kind(Device::Cpu), Kind::Float);
        assert_eq!(compute_kind(Device::Cuda(0)), Kind::BFloat16);
    }
}
