//! NCCL's unique id through the rendezvous store: rank 0 makes it (`ncclGetUniqueId`, no GPU
//! needed) and publishes its 128 bytes under one key; every other rank reads them, bounded by
//! the group's timeout, before `ncclCommInitRank`.
use std::time::Duration;

use super::store::TcpStore;
use crate::collective::allreduce::AllReduceError;
use crate::collective::nccl_lib::{self, NcclUniqueId};

/// Rank 0: a fresh id, published under `key`. Others: the id read from `key`.
pub fn exchange_unique_id(
    store: &TcpStore,
    key: &str,
    rank: usize,
    timeout: Duration,
) -> Result<NcclUniqueId, AllReduceError> {
    if rank == 0 {
        let id = nccl_lib::nccl()
            .and_then(|lib| lib.unique_id())
            .map_err(AllReduceError::Join)?;
        publish_unique_id(store, key, &id)?;
        return Ok(id);
    }
    fetch_unique_id(store, key, rank, timeout)
}

pub fn publish_unique_id(
    store: &TcpStore,
    key: &str,
    id: &NcclUniqueId,
) -> Result<(), AllReduceError> {
    store
        .set(key, &id.internal)
        .map_err(|e| AllReduceError::Join(format!("publishing NCCL's unique id: {e}")))
}

pub fn fetch_unique_id(
    store: &TcpStore,
    key: &str,
    rank: usize,
    timeout: Duration,
) -> Result<NcclUniqueId, AllReduceError> {
    let bytes = store.get(key, timeout).map_err(|e| {
        AllReduceError::Join(format!(
            "rank {rank} waiting for rank 0's NCCL unique id: {e}"
        ))
    })?;
    NcclUniqueId::from_bytes(&bytes)
        .map_err(|e| AllReduceError::Join(format!("rank {rank} read rank 0's NCCL id: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (TcpStore, TcpStore) {
        let server = TcpStore::serve("127.0.0.1", 0, 2, Duration::from_secs(5)).unwrap();
        let client =
            TcpStore::connect("127.0.0.1", server.port(), 2, Duration::from_secs(5)).unwrap();
        (server, client)
    }

    #[test]
    fn rank_0_s_real_unique_id_reaches_rank_1_byte_for_byte() {
        let (server, client) = pair();
        let Ok(lib) = nccl_lib::nccl() else {
            eprintln!("no NCCL to make an id with: skipped");
            return;
        };
        let made = lib.unique_id().unwrap();
        assert_ne!(made.internal, [0; 128], "ncclGetUniqueId wrote an id");
        publish_unique_id(&server, "g/nccl_unique_id", &made).unwrap();
        let read = fetch_unique_id(&client, "g/nccl_unique_id", 1, Duration::from_secs(1)).unwrap();
        assert_eq!(read, made);
        // exchange_unique_id on rank 0 publishes a fresh one under its key.
        let fresh = exchange_unique_id(&server, "h/id", 0, Duration::from_secs(1)).unwrap();
        assert_eq!(
            exchange_unique_id(&client, "h/id", 1, Duration::from_secs(1)).unwrap(),
            fresh
        );
    }

    #[test]
    fn a_short_id_or_a_missing_one_is_an_error_saying_which_rank_and_why() {
        let (server, client) = pair();
        server.set("g/id", &[7u8; 100]).unwrap();
        let err = fetch_unique_id(&client, "g/id", 1, Duration::from_secs(1)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("rank 1 read rank 0's NCCL id")
                && text.contains("128 bytes, this one is 100"),
            "{text}"
        );
        let err = fetch_unique_id(&client, "never", 1, Duration::from_millis(200)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("rank 1 waiting for rank 0's NCCL unique id")
                && text.contains("timed out after 200 ms"),
            "{text}"
        );
    }
}
