//! One module per subcommand; `main.rs` only parses and dispatches.
pub mod bench;
pub mod config;
pub mod doctor;
pub mod eval;
pub mod export;
pub mod features;
pub mod start;
