//! Which `scaled_dot_product_attention` kernel each of the engine's attention call sites gets
//! on a device, and the one deliberate choice made about it.
//!
//! The choice: on CUDA, cuDNN attention is turned off (`at::globalContext().setSDPUseCuDNN
//! (false)`, through `csrc/cuda_stream.cpp`). Why: libtorch 2.11 puts cuDNN attention first on
//! sm90/sm100 (H200, B200). The drafter's block-sparse attention calls SDPA with a bias whose
//! (rows, keys) shape is new for almost every chunk of every step (the anchors are random), and
//! cuDNN builds a new execution plan for each new shape with a bias, into a per-thread,
//! unbounded cache: minutes of plan building in the first steps, a slow host-memory creep, and
//! reported NaN/"no plan" failures with a bias at arbitrary lengths. With cuDNN off, biased
//! calls go to the memory-efficient (CUTLASS) kernel, which needs no plan per shape. The
//! target's causal attention without a bias is unaffected: at head_dim 256 the wheel's cuDNN
//! (9.19) is refused anyway and it runs flash.
//!
//! What each call site really gets is read from libtorch (`_fused_sdp_choice`) at the call
//! site's shapes, not assumed: `dflashd doctor` and the benchmark print it.
//!
//! NOT TESTED ON A GPU: the choice is only made and probed on the CPU here (where SDPA has its
//! math and flash CPU kernels and cuDNN does not exist).
use dflash_shared::metrics::DeviceRole;
use tch::{Device, Kind, Tensor};

use crate::model::attention::GroupedHeads;
use crate::model::drafter::DrafterConfig;
use crate::model::target::TargetConfig;

/// libtorch's `at::SDPBackend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdpaBackend {
    Math,
    Flash,
    Efficient,
    Cudnn,
    Overrideable,
    /// libtorch found no kernel for the inputs.
    None,
}

impl SdpaBackend {
    pub fn from_code(code: i64) -> Self {
        match code {
            0 => SdpaBackend::Math,
            1 => SdpaBackend::Flash,
            2 => SdpaBackend::Efficient,
            3 => SdpaBackend::Cudnn,
            4 => SdpaBackend::Overrideable,
            _ => SdpaBackend::None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SdpaBackend::Math => "math",
            SdpaBackend::Flash => "flash",
            SdpaBackend::Efficient => "memory-efficient",
            SdpaBackend::Cudnn => "cudnn",
            SdpaBackend::Overrideable => "overrideable",
            SdpaBackend::None => "none",
        }
    }
}

/// One attention call site, at the shapes it runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct CallSite {
    pub name: &'static str,
    pub q_heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    /// Query rows and keys of one call.
    pub rows: i64,
    pub keys: i64,
    /// An additive float bias `[1, 1, rows, keys]` (the drafter's block-sparse mask).
    pub bias: bool,
    pub causal: bool,
    /// `enable_gqa` (kv heads not repeated).
    pub gqa: bool,
}

/// The backend libtorch picks for `site` on `device` in `kind` (small tensors of the site's
/// head counts, head dim, rows and keys are allocated for the probe).
pub fn backend_for(site: &CallSite, device: Device, kind: Kind) -> SdpaBackend {
    let opts = (kind, device);
    let kv = if site.gqa {
        site.kv_heads
    } else {
        site.q_heads
    };
    let q = Tensor::zeros([1, site.q_heads, site.rows, site.head_dim], opts);
    let k = Tensor::zeros([1, kv, site.keys, site.head_dim], opts);
    let v = Tensor::zeros([1, kv, site.keys, site.head_dim], opts);
    let bias = site
        .bias
        .then(|| Tensor::zeros([1, 1, site.rows, site.keys], opts));
    let code = Tensor::f_internal_fused_sdp_choice(
        &q,
        &k,
        &v,
        bias.as_ref(),
        0.0,
        site.causal,
        None::<f64>,
        site.gqa,
    )
    .unwrap_or(-1);
    SdpaBackend::from_code(code)
}

/// The drafter's block-sparse call at `cfg`'s heads on `device`: one block of queries against
/// a full window of context keys plus the block (the widest chunk a sliding layer runs; the
/// kernel choice depends on dtype, head dim, bias and alignment, not on the exact count). On
/// the CPU the kernel gets the grouped heads (`enable_gqa`); elsewhere the group's query heads
/// are folded into rows of one head per kv head (`attention::GroupedHeads`), as that call is.
pub fn drafter_site(cfg: &DrafterConfig, device: Device) -> CallSite {
    let kv_heads = cfg.num_key_value_heads;
    let group = cfg.num_attention_heads / kv_heads.max(1);
    let folded = GroupedHeads::for_device(device) == GroupedHeads::Folded && group > 1;
    CallSite {
        name: "drafter block-sparse (bias)",
        q_heads: if folded {
            kv_heads
        } else {
            cfg.num_attention_heads
        },
        kv_heads,
        head_dim: cfg.head_dim,
        rows: cfg.block_size * if folded { group } else { 1 },
        keys: cfg.sliding_window.unwrap_or(2048) + cfg.block_size,
        bias: true,
        causal: false,
        gqa: !folded && group > 1,
    }
}

/// The target's causal GQA prefill (`model/target/attention.rs`) at `cfg`'s heads, `rows`
/// tokens.
pub fn target_site(cfg: &TargetConfig, rows: i64) -> CallSite {
    let (q_heads, kv_heads, head_dim) = match cfg {
        TargetConfig::Qwen3_5(c) => (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        TargetConfig::Qwen3(c) => (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
    };
    CallSite {
        name: "target causal GQA",
        q_heads,
        kv_heads,
        head_dim,
        rows,
        keys: rows,
        bias: false,
        causal: true,
        gqa: true,
    }
}

/// What one worker's attention call site gets on its device, for the run's journal.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSdpa {
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub role: DeviceRole,
    pub call_site: &'static str,
    pub backend: SdpaBackend,
}

/// Rows of the target probe: the real training length (4096 tokens); the kernel choice for
/// the causal call does not depend on it, but the probe should not be a toy shape.
pub const TARGET_PROBE_ROWS: i64 = 4096;

/// Probes, on each worker's device in its compute dtype, the call sites its role runs (a
/// target worker the target's causal call, a drafter worker the block-sparse call, an inline
/// worker both).
pub fn worker_backends(
    workers: &[(Device, DeviceRole)],
    drafter: &DrafterConfig,
    target: &TargetConfig,
) -> Vec<WorkerSdpa> {
    let mut out = Vec::new();
    for &(device, role) in workers {
        let kind = crate::device::compute_kind(device);
        let mut sites = Vec::new();
        if matches!(role, DeviceRole::Target | DeviceRole::Both) {
            sites.push(target_site(target, TARGET_PROBE_ROWS));
        }
        if matches!(role, DeviceRole::Drafter | DeviceRole::Both) {
            sites.push(drafter_site(drafter, device));
        }
        for site in sites {
            out.push(WorkerSdpa {
                device: crate::device::name(device),
                role,
                call_site: site.name,
                backend: backend_for(&site, device, kind),
            });
        }
    }
    out
}

/// Makes the choice above for this process (idempotent). Returns what was done, for the
/// record; on a build without the CUDA shim there is nothing to choose.
pub fn choose_backends() -> &'static str {
    choose_impl()
}

#[cfg(dflash_cuda_stream_shim)]
fn choose_impl() -> &'static str {
    unsafe extern "C" {
        fn dflash_disable_cudnn_sdpa();
    }
    // SAFETY: sets one flag of libtorch's global context; no C++ exception can leave it.
    unsafe { dflash_disable_cudnn_sdpa() };
    "cuDNN attention disabled (biased attention with per-chunk shapes would build a cuDNN plan per shape)"
}

#[cfg(not(dflash_cuda_stream_shim))]
fn choose_impl() -> &'static str {
    "libtorch's default order (this build has no CUDA shim; there is no cuDNN attention to avoid)"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter_site() -> CallSite {
        CallSite {
            name: "drafter block-sparse",
            q_heads: 4,
            kv_heads: 2,
            head_dim: 8,
            rows: 8,
            keys: 24,
            bias: true,
            causal: false,
            gqa: false,
        }
    }

    #[test]
    fn each_role_is_probed_at_its_own_call_sites_on_its_device() {
        let target = TargetConfig::tiny_default();
        let drafter = crate::embedded::tiny_drafter_config(&target);
        let got = worker_backends(
            &[
                (Device::Cpu, DeviceRole::Both),
                (Device::Cpu, DeviceRole::Drafter),
            ],
            &drafter,
            &target,
        );
        let sites: Vec<_> = got.iter().map(|w| (w.role, w.call_site)).collect();
        assert_eq!(
            sites,
            [
                (DeviceRole::Both, "target causal GQA"),
                (DeviceRole::Both, "drafter block-sparse (bias)"),
                (DeviceRole::Drafter, "drafter block-sparse (bias)"),
            ]
        );
        for w in &got {
            assert_eq!(w.device, "cpu");
            assert!(
                matches!(w.backend, SdpaBackend::Math | SdpaBackend::Flash),
                "{w:?}"
            );
        }
    }

    #[test]
    fn grouped_heads_with_a_bias_get_the_fused_cpu_kernel() {
        // Why the block-sparse attention passes grouped heads natively on the CPU
        // (`GroupedHeads::Native`): the fused flash kernel takes them with a bias, so no
        // repeat and no fold is needed there. Were it math, the call would hold its whole
        // score grid.
        for kind in [Kind::Float, Kind::BFloat16] {
            let site = CallSite {
                gqa: true,
                ..drafter_site()
            };
            assert_eq!(backend_for(&site, Device::Cpu, kind), SdpaBackend::Flash);
        }
    }

    #[test]
    fn codes_name_libtorch_s_backends() {
        assert_eq!(SdpaBackend::from_code(3), SdpaBackend::Cudnn);
        assert_eq!(SdpaBackend::from_code(2).name(), "memory-efficient");
        assert_eq!(SdpaBackend::from_code(-1), SdpaBackend::None);
    }

    #[test]
    fn the_cpu_probe_answers_a_cpu_kernel_and_never_cudnn() {
        choose_backends();
        for site in [
            drafter_site(),
            CallSite {
                name: "target causal",
                bias: false,
                causal: true,
                gqa: true,
                keys: 8,
                ..drafter_site()
            },
        ] {
            let got = backend_for(&site, Device::Cpu, Kind::Float);
            assert!(
                matches!(got, SdpaBackend::Math | SdpaBackend::Flash),
                "{}: {got:?}",
                site.name
            );
        }
    }
}
