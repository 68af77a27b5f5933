//! Projections and the dense SwiGLU MLP shared by Qwen3 and Qwen3.5 layers.
use tch::Tensor;

use super::params::{Init, ParamSpec, Params, INIT_STD};
use crate::model::error::ModelError;

/// `y = x Wᵀ (+ b)`; HF `nn.Linear` layout (`weight` is `[out, in]`).
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn specs(
        name: &str,
        out_features: i64,
        in_features: i64,
        bias: bool,
        specs: &mut Vec<ParamSpec>,
    ) {
        specs.push(ParamSpec::new(
            format!("{name}.weight"),
            &[out_features, in_features],
            Init::Normal(INIT_STD),
        ));
        if bias {
            specs.push(ParamSpec::new(
                format!("{name}.bias"),
                &[out_features],
                Init::Zeros,
            ));
        }
    }

    pub fn take(name: &str, bias: bool, params: &mut Params) -> Result<Self, ModelError> {
        Ok(Self {
            weight: params.take(&format!("{name}.weight"))?,
            bias: if bias {
                Some(params.take(&format!("{name}.bias"))?)
            } else {
                None
            },
        })
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

/// `down(silu(gate(x)) · up(x))`.
pub struct SwiGluMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl SwiGluMlp {
    pub fn specs(prefix: &str, hidden: i64, intermediate: i64, specs: &mut Vec<ParamSpec>) {
        Linear::specs(
            &format!("{prefix}.gate_proj"),
            intermediate,
            hidden,
            false,
            specs,
        );
        Linear::specs(
            &format!("{prefix}.up_proj"),
            intermediate,
            hidden,
            false,
            specs,
        );
        Linear::specs(
            &format!("{prefix}.down_proj"),
            hidden,
            intermediate,
            false,
            specs,
        );
    }

    pub fn take(prefix: &str, params: &mut Params) -> Result<Self, ModelError> {
        Ok(Self {
            gate_proj: Linear::take(&format!("{prefix}.gate_proj"), false, params)?,
            up_proj: Linear::take(&format!("{prefix}.up_proj"), false, params)?,
            down_proj: Linear::take(&format!("{prefix}.down_proj"), false, params)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.down_proj
            .forward(&(self.gate_proj.forward(x).silu() * self.up_proj.forward(x)))
    }
}
