//! A memory and cost model of a run, from its shapes alone: no libtorch, no device.
//!
//! It predicts, per device and role, what today's code holds (parameters, fp32 masters, Adam
//! moments, gradients, the all-reduce buffer, the frozen tables, activations saved for
//! backward, the attention and loss transients, queued hidden-state items) and the step's
//! peak; and per sequence the FLOPs of each side, tokens/s at a given MFU, which side bounds
//! the run and the best integer target/drafter split. `dflashd plan` prints it, `dflashd
//! start` refuses a topology it predicts not to fit, and `dflash-bench --cases plan` checks it
//! against the memory pass on CPU.
//!
//! Every term names the code it models (file:line as of the commit that wrote it). The model
//! follows the code, not what the code should do: when the engine changes what it allocates,
//! this module must change with it, and the bench case says by how much they disagree.
//!
//! - [`shape`]: the inputs (precision, sequence length, anchors) and the representative anchor
//!   layout the attention chunk plan is computed on;
//! - [`drafter`]: one drafter rank's memory;
//! - [`target`]: one target replica's memory;
//! - [`flops`]: FLOPs per sequence for both sides;
//! - [`run`]: the whole topology: devices, fit, bound, throughput, split;
//! - [`scaling`]: the cross-node gradient all-reduce of data-parallel nodes (a prediction:
//!   the hierarchical reduce it models is not built; nodes sum in one flat group);
//! - [`reference`]: the product's reference shape (Qwen3.6-27B and its drafter), written once.
pub mod drafter;
pub mod flops;
pub mod reference;
pub mod run;
pub mod scaling;
pub mod shape;
pub mod target;

pub use drafter::{drafter_memory, DrafterMemory};
pub use flops::{drafter_step_flops, target_forward_flops, StepFlops};
pub use run::{plan_run, DevicePlan, Role, RunPlan, RunSpec, Split};
pub use shape::{ActivationPrecision, StepShape};

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// One named share of a device's memory, in bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Consumer {
    pub name: String,
    pub bytes: f64,
}

impl Consumer {
    pub fn new(name: impl Into<String>, bytes: f64) -> Self {
        Self {
            name: name.into(),
            bytes,
        }
    }

    pub fn gib(&self) -> f64 {
        self.bytes / GIB
    }
}

/// The `n` largest consumers, largest first.
pub fn top_consumers(consumers: &[Consumer], n: usize) -> Vec<Consumer> {
    let mut sorted = consumers.to_vec();
    sorted.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
    sorted.truncate(n);
    sorted
}
