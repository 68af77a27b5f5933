//! Model code: one module per model, weights loaded by name.
pub mod attention;
pub mod drafter;
pub mod error;
pub mod layers;
pub mod sdpa;
pub mod target;
pub mod weights;
