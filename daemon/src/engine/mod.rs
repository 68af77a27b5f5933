//! Training engine: models and the training step, free of any daemon concerns.
pub mod model;
pub mod train;
