//! One module per subcommand; `main.rs` only parses and dispatches.
pub mod doctor;
pub mod features;
