//! The memory-plan flags `start` and `plan` share: which device the run is planned on and how
//! much memory each device has. One declaration, so that `plan` predicts the run `start`
//! checks with the same flags.
use anyhow::{bail, Result};
use clap::Args;
use dflash_shared::config::Device as ConfigDevice;

#[derive(Args, Debug)]
pub struct MemoryPlanArgs {
    /// `cpu` or `cuda:N`: the whole run on this one device, overriding the topology's.
    #[arg(long)]
    pub device: Option<String>,
    /// Memory of each device for the memory plan, GiB. Default: NVML's figure for the
    /// topology's GPUs, the host's memory on a CPU topology.
    #[arg(long, value_name = "GIB")]
    pub gpu_memory_gib: Option<f64>,
}

impl MemoryPlanArgs {
    /// Refuses a `--gpu-memory-gib` that is not a positive number, before anything is read.
    pub fn check_gpu_memory(&self) -> Result<()> {
        match self.gpu_memory_gib {
            Some(gib) if !(gib.is_finite() && gib > 0.0) => {
                bail!("--gpu-memory-gib: expected a positive number of GiB, found {gib}")
            }
            _ => Ok(()),
        }
    }

    /// `--device`, parsed; `None` keeps the topology's devices.
    pub fn device_override(&self) -> Result<Option<ConfigDevice>> {
        self.device
            .as_deref()
            .map(|d| {
                dflash_engine::device::parse_config_device(d)
                    .map_err(|e| anyhow::anyhow!("--device: {e}"))
            })
            .transpose()
    }
}
