//! The top floor: one module per subcommand; `main.rs` only parses and dispatches. Nothing
//! imports this module.
pub mod config;
mod config_setup;
pub mod doctor;
pub mod eval;
pub mod eval_args;
pub mod eval_online;
pub mod export;
mod export_speculators;
pub mod features;
pub mod memory_plan_args;
pub mod plan;
pub mod regenerate;
pub mod start;
pub mod start_launch;

/// `--device`: `cpu`, `cuda` or `cuda:N`, checked against the devices libtorch sees.
fn parse_device(name: &str) -> anyhow::Result<tch::Device> {
    dflash_engine::device::parse(name).map_err(|e| anyhow::anyhow!("--device: {e}"))
}
