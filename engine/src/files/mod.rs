//! The workspace's file primitives, each written once: the atomic write ([`atomic_write`])
//! and the streaming SHA-256 ([`hash`]).
pub mod atomic_write;
pub mod hash;
