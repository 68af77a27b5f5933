//! `dflashd doctor`: what this binary runs on.
use anyhow::Result;

pub fn run() -> Result<()> {
    println!("cuda available: {}", tch::Cuda::is_available());
    println!("cuda devices: {}", tch::Cuda::device_count());
    Ok(())
}
