//! The CPU collective across processes: libtorch's own `c10d::ProcessGroupGloo`, compiled into
//! `libtorch_cpu.so`, through the C++ shim `csrc/c10d_gloo.cpp`.
//!
//! Why this and not Debian's libgloo used directly: `libtorch_cpu.so` exports its own, much
//! newer gloo (480 `gloo::` symbols, 266 of them also defined by Debian's `libgloo.so.0`, no
//! `-Bsymbolic`), so loading Debian's beside it would bind one copy's calls to the other's code
//! with a different layout (torch's `gloo::rendezvous::Store` has the v2 API in its vtable,
//! Debian's 2022 copy does not). libtorch's backend needs Debian's headers only to compile
//! `ProcessGroupGloo.hpp`, and the shim's inline code touches no gloo layout (the argument is in
//! the shim's header comment and docs/SCALING.md, "Backends"); the two-process tests
//! (`engine/tests/dist`) check the result.
//!
//! Built without gloo's headers, [`GlooGroup::join`] says what to install.
use std::sync::Arc;
use std::time::Duration;

use tch::Tensor;

use super::store::TcpStore;
use crate::collective::allreduce::{AbortGroup, AllReduceError};

/// What a build without the headers answers.
pub const GLOO_MISSING: &str = "this dflashd was built without gloo headers, so the CPU \
     process group (libtorch's ProcessGroupGloo) is compiled out: sudo apt-get install \
     libgloo-dev, then rebuild (`make test-deps` installs it when run as root)";

/// Whether this build has the Gloo backend; `Err` says why not and what to do.
pub fn gloo_status() -> Result<&'static str, &'static str> {
    if cfg!(dflash_c10d_gloo) {
        Ok("Gloo via libtorch's ProcessGroupGloo")
    } else {
        Err(GLOO_MISSING)
    }
}

/// Which address this rank's Gloo transport binds, the one its peers connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlooTransport {
    /// A hostname or IP address of this machine (`127.0.0.1` on one machine).
    Hostname(String),
    /// A network interface, as `GLOO_SOCKET_IFNAME` names one (`eth0`, `ib0`).
    Interface(String),
    /// libtorch's default: this machine's hostname, falling back to loopback.
    Default,
}

/// How one collective ended, before it is named in the caller's terms.
#[derive(Debug)]
pub(crate) enum Outcome {
    Failed(String),
    TimedOut(String),
    Aborted,
}

/// One rank's endpoint of a Gloo group.
pub struct GlooGroup {
    inner: Arc<imp::Handle>,
    rank: usize,
    world: usize,
}

/// Aborts a Gloo group from any thread.
pub struct GlooAbort(Arc<imp::Handle>);

impl AbortGroup for GlooAbort {
    fn abort(&self) {
        self.0.abort();
    }
}

impl GlooGroup {
    /// Joins the group of `world` ranks through `store` (keys under `prefix`), within `timeout`.
    pub fn join(
        store: &TcpStore,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
        transport: &GlooTransport,
    ) -> Result<Self, AllReduceError> {
        if rank >= world {
            return Err(AllReduceError::Join(format!(
                "rank {rank} is outside a world of {world} ranks"
            )));
        }
        let handle = imp::Handle::join(store, prefix, rank, world, timeout, transport)
            .map_err(AllReduceError::Join)?;
        Ok(GlooGroup {
            inner: Arc::new(handle),
            rank,
            world,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    pub fn abort_handle(&self) -> GlooAbort {
        GlooAbort(Arc::clone(&self.inner))
    }

    /// In-place sum over the group of `tensor` (dense, contiguous, on the CPU), within
    /// `timeout` (plus a second's grace for gloo's own timeout error to arrive first).
    pub fn sum_in_place(
        &self,
        tensor: &mut Tensor,
        timeout: Duration,
    ) -> Result<(), AllReduceError> {
        if tensor.device() != tch::Device::Cpu || !tensor.is_contiguous() {
            return Err(AllReduceError::BadBuffer(format!(
                "Gloo sums contiguous CPU tensors, found one on {:?} (contiguous: {})",
                tensor.device(),
                tensor.is_contiguous()
            )));
        }
        self.inner
            .all_reduce_sum(tensor, timeout)
            .map_err(|outcome| self.name_outcome(outcome, timeout))
    }

    fn name_outcome(&self, outcome: Outcome, timeout: Duration) -> AllReduceError {
        let (rank, world) = (self.rank, self.world);
        match outcome {
            Outcome::Aborted => AllReduceError::Aborted,
            Outcome::TimedOut(detail) => AllReduceError::Timeout {
                rank,
                world,
                after: timeout,
                detail,
            },
            Outcome::Failed(detail) => classify_failure(rank, world, timeout, detail),
        }
    }
}

/// Gloo's messages, read as what happened: a closed or reset connection is a lost peer (named
/// by rank when the group has only one other rank, else by the address gloo gives, which a
/// node's [`super::NodeEndpoint`] then names by its heartbeat), gloo's own timeout is a
/// timeout, anything else stays gloo's text. Pure.
pub(crate) fn classify_failure(
    rank: usize,
    world: usize,
    timeout: Duration,
    detail: String,
) -> AllReduceError {
    const LOST: [&str; 5] = [
        "closed by peer",
        "reset by peer",
        "Broken pipe",
        "Connection refused",
        "Socket closed",
    ];
    if LOST.iter().any(|s| detail.contains(s)) {
        let peer = if world == 2 {
            format!("rank {}", 1 - rank)
        } else {
            peer_address(&detail).map_or_else(
                || "a peer".to_string(),
                |addr| format!("the peer at {addr}"),
            )
        };
        return AllReduceError::PeerLost {
            rank,
            world,
            peer,
            detail,
        };
    }
    if detail.contains("Timed out") || detail.contains("timed out") {
        return AllReduceError::Timeout {
            rank,
            world,
            after: timeout,
            detail,
        };
    }
    AllReduceError::Gloo(format!("rank {rank} of {world}: {detail}"))
}

/// The `[host]:port` gloo names after "peer" in a connection error, e.g.
/// `Connection closed by peer [10.0.0.2]:41234`.
fn peer_address(detail: &str) -> Option<&str> {
    let at = detail.find("peer [")? + "peer ".len();
    let rest = &detail[at..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == ',')
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

#[cfg(dflash_c10d_gloo)]
#[path = "gloo_ffi.rs"]
mod imp;

/// A build without gloo's headers: no group can exist.
#[cfg(not(dflash_c10d_gloo))]
mod imp {
    use super::{GlooTransport, Outcome, TcpStore, GLOO_MISSING};
    use std::time::Duration;

    pub enum Handle {}

    impl Handle {
        pub fn join(
            _store: &TcpStore,
            _prefix: &str,
            _rank: usize,
            _world: usize,
            _timeout: Duration,
            _transport: &GlooTransport,
        ) -> Result<Self, String> {
            Err(GLOO_MISSING.to_string())
        }

        pub fn all_reduce_sum(
            &self,
            _tensor: &mut tch::Tensor,
            _timeout: Duration,
        ) -> Result<(), Outcome> {
            match *self {}
        }

        pub fn abort(&self) {
            match *self {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_names_the_lost_peer_by_rank_or_address() {
        let gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection \
                    closed by peer [127.0.0.1]:3465";
        let t = Duration::from_secs(3);
        let two = classify_failure(0, 2, t, gloo.to_string());
        assert!(
            matches!(&two, AllReduceError::PeerLost { peer, .. } if peer == "rank 1"),
            "{two:?}"
        );
        assert!(two
            .to_string()
            .starts_with("rank 0 of 2: lost rank 1 during an all-reduce"));
        let four = classify_failure(2, 4, t, gloo.to_string());
        assert!(
            matches!(&four, AllReduceError::PeerLost { peer, .. } if peer == "the peer at [127.0.0.1]:3465"),
            "{four:?}"
        );
        let timed = classify_failure(1, 2, t, "Timed out waiting 3000ms for recv".into());
        assert!(
            timed
                .to_string()
                .contains("no all-reduce result within 3000 ms"),
            "{timed}"
        );
        let other = classify_failure(1, 2, t, "Invalid tensor".into());
        assert_eq!(other.to_string(), "Gloo: rank 1 of 2: Invalid tensor");
    }

    #[test]
    fn the_build_says_whether_it_has_gloo_and_what_to_install_if_not() {
        match gloo_status() {
            Ok(line) => assert!(line.contains("ProcessGroupGloo"), "{line}"),
            Err(why) => assert!(why.contains("sudo apt-get install libgloo-dev"), "{why}"),
        }
    }
}
