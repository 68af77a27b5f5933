//! dflash-tui: the operator console for `dflashd`.
//!
//! Layers, bottom up: [`client`] speaks the control plane; [`app`] holds the console state fed
//! by one event channel; [`ui`] draws it (pure); [`actions`] is the one flow for destructive
//! actions; [`console`] is the loop tying them together; [`cmd`] has one file per subcommand;
//! [`report`] builds the status checkpoint; [`paths`] knows where the daemon lives.
//!
//! Errors are `thiserror` enums whose messages carry their causes' text; a cause printed in a
//! message is never also the error's `source()`, so `anyhow`'s `{:#}` prints each cause once.
pub mod actions;
pub mod app;
pub mod client;
pub mod cmd;
pub mod console;
pub mod feed;
pub mod fmt;
pub mod paths;
pub mod replay;
pub mod report;
pub mod terminal;
pub mod ui;
