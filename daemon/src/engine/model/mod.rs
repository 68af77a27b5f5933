//! Model code: one module per model, weights loaded by name.
pub mod layers;
