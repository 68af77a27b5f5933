//! TFRecord framing, the container of TensorBoard event files. Each record is
//! `u64 LE length | masked CRC32C of those 8 bytes | data | masked CRC32C of the data`
//! (tensorflow/core/lib/io/record_writer.cc, `RecordWriter::WriteRecord`). The mask,
//! `rotate_right(crc, 15) + 0xa282ead8`, is `crc32c::Mask` in tensorflow/core/lib/hash/crc32c.h:
//! it keeps a CRC of data that itself holds CRCs from being trivially related to them.
use crc::{Crc, CRC_32_ISCSI};

/// CRC-32C (Castagnoli), the checksum TFRecord uses.
const CRC32C: Crc<u32> = Crc::<u32>::new(&CRC_32_ISCSI);
const MASK_DELTA: u32 = 0xa282_ead8;

/// The masked CRC32C of `bytes`.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    CRC32C
        .checksum(bytes)
        .rotate_right(15)
        .wrapping_add(MASK_DELTA)
}

/// One record holding `data`, ready to append to an event file.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_is_crc32c() {
        // The check value of CRC-32/ISCSI in the CRC catalogue: the CRC of "123456789".
        assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn masking_matches_tensorboards_own_reader() {
        // Computed with the PyPI tensorboard package's reader side,
        // `tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c`, which the
        // round-trip test in daemon/tests/daemon/tensorboard_events.rs reads our files with.
        for (bytes, masked) in [
            (&b"123456789"[..], TB_MASKED_123456789),
            (&b""[..], TB_MASKED_EMPTY),
            (&24u64.to_le_bytes()[..], TB_MASKED_LEN_24),
        ] {
            assert_eq!(masked_crc32c(bytes), masked, "{bytes:?}");
        }
    }

    const TB_MASKED_123456789: u32 = 0xc78a_b0e5;
    const TB_MASKED_EMPTY: u32 = 0xa282_ead8;
    const TB_MASKED_LEN_24: u32 = 0x224b_7fa3;

    #[test]
    fn a_record_is_length_crc_data_crc() {
        let data = b"brain";
        let r = frame(data);
        assert_eq!(r.len(), 8 + 4 + data.len() + 4);
        assert_eq!(r[..8], 5u64.to_le_bytes());
        assert_eq!(r[8..12], masked_crc32c(&r[..8]).to_le_bytes());
        assert_eq!(&r[12..17], data);
        assert_eq!(r[17..], masked_crc32c(data).to_le_bytes());
    }
}
