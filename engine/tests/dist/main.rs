//! The cross-process group (`dflash_engine::dist`) between real OS processes on loopback:
//! libtorch's TCPStore for the rendezvous, libtorch's ProcessGroupGloo for the sums.
//!
//! Each test starts this same test binary again as the ranks ([`rank_process`] is their body,
//! chosen by the `DFLASH_DIST_*` environment), so the processes share nothing but the sockets.
//! Rank 0 serves the store on a free port and prints it; the parent then starts rank 1 on it.
mod node_liveness;
mod rank;
mod two_node_training;
mod two_process;
mod two_workers_per_node;

/// Not a test of its own: the body of a rank process the tests in `two_process` start (it
/// does nothing when the `DFLASH_DIST_RANK` environment variable is absent, i.e. when the
/// harness runs it directly).
#[test]
fn rank_process() {
    if let Ok(rank) = std::env::var(rank::RANK_VAR) {
        let rank: usize = rank.parse().expect("DFLASH_DIST_RANK is a number");
        if let Err(e) = rank::run(rank) {
            println!("DIST FAILED {e:#}");
            std::process::exit(3);
        }
    }
}
