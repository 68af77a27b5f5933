//! Model code: one module per model, weights loaded by name.
pub mod attention;
pub mod drafter;
pub mod layers;
pub mod error;
pub mod target;
pub mod weights;
