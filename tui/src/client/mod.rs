//! The control-plane client: a Unix-socket connection to `dflashd` speaking the versioned hello
//! and NDJSON frames of `dflash_shared::protocol`.
//!
//! - [`codec`]: one frame ⇄ one line, with the protocol's size cap.
//! - [`session`]: a connected session; replies are matched to requests in order, pushed
//!   frames (metrics, events, logs) go to a channel.
//! - [`backoff`] and [`supervisor`]: the console's connection that reconnects by itself.
pub mod backoff;
pub mod codec;
mod error;
pub mod session;
pub mod supervisor;

pub use error::ClientError;
pub use session::{Session, Welcome};

/// Name sent in the hello, so the daemon's journal says which client asked.
pub fn client_name() -> String {
    format!("dflash-tui/{}", env!("CARGO_PKG_VERSION"))
}
