//! The DFlash training step and everything around it: anchors, labels, loss, optimizer,
//! schedule, data, checkpoints, evaluation and the trainer loop.
pub mod anchors;
pub mod checkpoint;
pub mod data;
pub mod labels;
pub mod loader;
pub mod loss;
pub mod optim;
pub mod rng;
pub mod schedule;
