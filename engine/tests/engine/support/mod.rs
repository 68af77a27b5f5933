//! Fixtures shared by the engine's integration tests.
#![allow(dead_code)] // Each test uses a different subset.
pub mod decode;
pub mod drafter;
pub mod topology;
