//! The peak each device of a run is judged against for MFU: on CPU the matmul rate this
//! process measures at the run's dtype and thread count (a CPU has no datasheet figure its
//! libtorch threads reach); on CUDA the datasheet figure for its NVML model name
//! (`dflash_shared::gpu_peaks`), and none, said so, for a model the table does not cite.
//! A CPU peak given at start (`dflashd start --cpu-peak-flops`, or `DFLASH_CPU_PEAK_FLOPS`)
//! replaces the measurement, and the journal says it was given, not measured: the test suite's
//! daemons start that way, so each start does not spend a second timing matmuls.
use dflash_engine::device;
use dflash_engine::train::peak::measure_matmul;
use dflash_engine::train::throughput::DevicePeaks;
use dflash_shared::gpu_peaks::datasheet_peak;
use tch::{Device, Kind};

use crate::telemetry::gpu::GpuSampler;

/// Size of the CPU measurement's matmul: large enough to reach the BLAS kernel's steady
/// rate, small enough (about 2 GFLOP) to cost a fraction of a second at start.
const CPU_MATMUL_N: i64 = 1024;
const CPU_MATMUL_REPS: usize = 9;

/// The peaks for `devices`, and one journal line per device saying where its figure came
/// from (or that it has none). `given_cpu`: the CPU's peak (FLOP/s) as the operator gave it,
/// used instead of measuring.
pub fn for_devices(
    devices: &[Device],
    kind_on: impl Fn(Device) -> Kind,
    given_cpu: Option<f64>,
) -> (DevicePeaks, Vec<String>) {
    let mut peaks = DevicePeaks::new();
    let mut notes = Vec::new();
    let mut gpus: Option<GpuSampler> = None;
    for &d in devices {
        let name = device::name(d);
        match d {
            Device::Cuda(index) => {
                let sampler = gpus.get_or_insert_with(GpuSampler::new);
                let model = sampler.model_name(index);
                match model.as_deref().and_then(datasheet_peak) {
                    Some(p) => {
                        peaks.insert(name.clone(), p.bf16_dense_flops_per_s);
                        notes.push(format!(
                            "MFU peak of {name} ({}): {:.1} TFLOP/s dense BF16, a datasheet figure ({})",
                            model.unwrap_or_default(),
                            p.bf16_dense_flops_per_s / 1e12,
                            p.source
                        ));
                    }
                    None => notes.push(format!(
                        "no MFU for {name} ({}): no datasheet peak is cited for it; tokens/s and draft positions/s are still reported",
                        model.unwrap_or_else(|| "model unknown to NVML".into())
                    )),
                }
            }
            _ if given_cpu.is_some() => {
                let flops = given_cpu.unwrap_or_default();
                peaks.insert(name.clone(), flops);
                notes.push(format!(
                    "MFU peak of {name}: {:.1} GFLOP/s, given, not measured (--cpu-peak-flops / DFLASH_CPU_PEAK_FLOPS)",
                    flops / 1e9
                ));
            }
            _ => {
                let kind = kind_on(d);
                match measure_matmul(d, kind, CPU_MATMUL_N, CPU_MATMUL_REPS) {
                    Some(p) => {
                        peaks.insert(name.clone(), p.flops_per_s);
                        notes.push(format!(
                            "MFU peak of {name}: {:.1} GFLOP/s, measured now ({}x{} {} matmul, fastest of {CPU_MATMUL_REPS}, {} threads)",
                            p.flops_per_s / 1e9,
                            p.n,
                            p.n,
                            device::kind_name(p.kind),
                            p.threads
                        ));
                    }
                    None => notes.push(format!(
                        "no MFU for {name}: its matmul peak could not be measured"
                    )),
                }
            }
        }
    }
    (peaks, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_gets_a_measured_peak_and_says_so() {
        let (peaks, notes) = for_devices(&[Device::Cpu], |_| Kind::Float, None);
        assert!(peaks.get("cpu").is_some_and(|p| p > 0.0));
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with("MFU peak of cpu: "), "{}", notes[0]);
        assert!(notes[0].contains("measured now"), "{}", notes[0]);
    }

    #[test]
    fn a_given_cpu_peak_is_used_and_journaled_as_given() {
        let (peaks, notes) = for_devices(&[Device::Cpu], |_| Kind::Float, Some(4.2e10));
        assert_eq!(peaks.get("cpu"), Some(4.2e10));
        assert_eq!(
            notes,
            ["MFU peak of cpu: 42.0 GFLOP/s, given, not measured (--cpu-peak-flops / DFLASH_CPU_PEAK_FLOPS)"]
        );
    }
}
