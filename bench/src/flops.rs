//! The analytic FLOP counts live in the engine's plan model (`dflash_engine::plan::flops`), so
//! the benchmark and `dflashd plan` count the same way.
pub use dflash_engine::plan::flops::{
    corrected_positions, drafter_step_flops as step_flops, head_positions, square_matmul_flops,
    teacher_positions, visible_pairs, StepFlops, StepWork,
};
