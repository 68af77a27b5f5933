//! `dflashd doctor`: what this binary runs on, read from libtorch and NVML, never assumed.
//!
//! Exit status 0 means the binary can train on the CPU; CUDA and NVML absences are reported
//! with their reason but are not errors (a CPU machine is a supported place to run).
use anyhow::Result;

use crate::telemetry::{allocator, fingerprint, gpu::GpuSampler};
use dflash_engine::collective::nccl;

fn or_unknown(value: Option<String>, why: &str) -> String {
    value.unwrap_or_else(|| format!("unknown ({why})"))
}

pub fn run() -> Result<()> {
    let libtorch_dir = dflash_engine::device::loaded_libtorch_dir();
    println!(
        "libtorch:        {}",
        or_unknown(
            fingerprint::loaded_libtorch_version(),
            "no version file beside the loaded libtorch"
        )
    );
    println!(
        "libtorch dir:    {}",
        libtorch_dir.as_ref().map_or_else(
            || "not found in /proc/self/maps".to_string(),
            |d| d.display().to_string()
        )
    );
    println!("tch:             {}", env!("DFLASH_TCH_VERSION"));
    println!(
        "allocator shim:  {}",
        match allocator::torch_header_version() {
            Some(v) if allocator::cuda_query_compiled() =>
                format!("built against torch {v} headers, CUDA query compiled"),
            Some(v) =>
                format!("built against torch {v} headers, CPU-only (wheel has no libc10_cuda)"),
            None => "not built".to_string(),
        }
    );
    let cuda = tch::Cuda::is_available();
    println!("cuda available:  {cuda}");
    if cuda {
        println!("cuda devices:    {}", tch::Cuda::device_count());
        println!(
            "cuda runtime:    {}",
            or_unknown(
                fingerprint::cuda_runtime_version(),
                "libtorch did not report it"
            )
        );
        print_allocator_readings();
    } else {
        let linked = libtorch_dir
            .as_deref()
            .is_some_and(|d| d.join("libtorch_cuda.so").exists());
        println!(
            "cuda devices:    0 ({})",
            if linked {
                "libtorch_cuda is linked; no usable NVIDIA driver/GPU is visible to this process"
            } else {
                "this libtorch has no CUDA support"
            }
        );
    }
    // Only a multi-GPU drafter group needs NCCL; a CPU machine reports it and moves on. The
    // line names the file opened: the torch wheel's own copy, the one libtorch_cuda maps.
    match nccl::nccl_status() {
        Ok(loaded) => println!("nccl:            {loaded}"),
        Err(why) => println!("nccl:            not loadable: {why}"),
    }
    print_multi_node_backends();
    print_sdpa_backends(cuda);
    let nvml = GpuSampler::new();
    match nvml.unavailable_reason() {
        None => {
            println!("nvml:            available");
            println!(
                "driver:          {} (supports CUDA {})",
                or_unknown(nvml.driver_version(), "NVML did not report it"),
                or_unknown(nvml.cuda_driver_version(), "NVML did not report it")
            );
            for (i, model) in nvml.gpu_models().iter().enumerate() {
                println!("gpu {i}:           {model}");
            }
            // CUDA numbers devices its own way (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES).
            for line in nvml.cuda_devices() {
                println!("cuda device:     {line}");
            }
        }
        Some(reason) => println!("nvml:            {reason}"),
    }
    Ok(())
}

/// The allocator shim reading each device's own statistics: a 1 MiB tensor is placed first,
/// so a shim that reads nothing (or the wrong device) shows as 0 allocated.
fn print_allocator_readings() {
    for index in 0..tch::Cuda::device_count().max(0) as usize {
        let probe = tch::Tensor::zeros([256 * 1024], (tch::Kind::Float, tch::Device::Cuda(index)));
        match allocator::cuda_stats(index) {
            Ok(s) => println!(
                "allocator:       cuda:{index}: {} B allocated, {} B reserved, {} alloc retries (after a 1 MiB probe)",
                s.allocated_bytes, s.reserved_bytes, s.alloc_retries
            ),
            Err(e) => println!("allocator:       cuda:{index}: no reading ({e})"),
        }
        drop(probe);
    }
}

/// Which SDPA kernel each attention call site gets here, read from libtorch at the real
/// Qwen3.6-27B / drafter head shapes (a block-sparse chunk: 128 rows, 2048 + 128 keys).
fn print_sdpa_backends(cuda: bool) {
    use dflash_engine::model::sdpa::{backend_for, choose_backends, CallSite};
    let choice = choose_backends();
    let (device, kind) = if cuda {
        (tch::Device::Cuda(0), tch::Kind::BFloat16)
    } else {
        (tch::Device::Cpu, tch::Kind::Float)
    };
    println!("sdpa choice:     {choice}");
    let drafter = CallSite {
        name: "drafter block-sparse (bias)",
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        rows: 128,
        keys: 2176,
        bias: true,
        causal: false,
        gqa: false,
    };
    let target = CallSite {
        name: "target causal GQA",
        q_heads: 24,
        kv_heads: 4,
        head_dim: 256,
        rows: 256,
        keys: 256,
        bias: false,
        causal: true,
        gqa: true,
    };
    for site in [drafter, target] {
        println!(
            "sdpa:            {} on {}: {}",
            site.name,
            dflash_engine::device::name(device),
            backend_for(&site, device, kind).name()
        );
    }
}

/// What a multi-node job would use: the rendezvous store and the collective on each device
/// kind (`dflash_engine::dist`), or what is missing and what to do.
fn print_multi_node_backends() {
    println!(
        "rendezvous:      c10d TCPStore (libtorch {})",
        or_unknown(
            fingerprint::loaded_libtorch_version(),
            "no version file beside the loaded libtorch"
        )
    );
    let cpu = match dflash_engine::dist::gloo::gloo_status() {
        Ok(line) => format!("{line} (CPU)"),
        Err(why) => format!("no CPU collective: {why}"),
    };
    let cuda = match nccl::nccl_status() {
        Ok(loaded) => format!(
            "{} ncclCommInitRank (CUDA)",
            loaded.split(" from ").next().unwrap_or(&loaded)
        ),
        Err(_) => "no CUDA collective (NCCL not loadable, see the nccl line)".to_string(),
    };
    println!("collective:      {cpu}; {cuda}");
}
