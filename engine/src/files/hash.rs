//! The one file hasher: SHA-256 of a file's bytes, read in 1 MiB pieces so memory stays flat
//! however large the file (weight shards, data files of many GiB). Checkpoint manifests, the
//! environment fingerprint's config and data digests and `regenerate`'s settings record all
//! hash files with it.
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// How much of a file is held in memory at once while hashing it.
const READ_PIECE_BYTES: usize = 1 << 20;

/// A file's length and the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub bytes: u64,
    /// Lower-case hex, 64 characters.
    pub sha256: String,
}

/// Hashes the file at `path`, streaming it. The error is the OS error of opening or reading
/// it; the caller names the file in its own error.
pub fn sha256_file(path: &Path) -> std::io::Result<FileDigest> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut piece = vec![0u8; READ_PIECE_BYTES];
    let mut bytes = 0u64;
    loop {
        let n = match file.read(&mut piece) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&piece[..n]);
        bytes += n as u64;
    }
    Ok(FileDigest {
        bytes,
        sha256: hex::encode(hasher.finalize()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_file_hashes_as_its_whole_bytes_do() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("abc");
        std::fs::write(&small, b"abc").unwrap();
        assert_eq!(
            sha256_file(&small).unwrap(),
            FileDigest {
                bytes: 3,
                // FIPS 180-2's example digest of "abc".
                sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into(),
            }
        );
        // Across several read pieces, and ending inside one.
        let large = dir.path().join("large");
        let content: Vec<u8> = (0..READ_PIECE_BYTES * 2 + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&large, &content).unwrap();
        assert_eq!(
            sha256_file(&large).unwrap(),
            FileDigest {
                bytes: content.len() as u64,
                sha256: hex::encode(Sha256::digest(&content)),
            }
        );
        let missing = sha256_file(&dir.path().join("missing")).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }
}
