//! Async edges of the shared framing: newline-delimited JSON with a hard size limit.
//!
//! The cutting itself is `dflash_shared::protocol::FrameSplitter` (shared with the console);
//! this module feeds it from a socket and writes encoded responses.
use std::collections::VecDeque;

use dflash_shared::protocol::{encode_frame, ErrorCode, FrameError, FrameSplitter, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Reads frames from an async stream. `next` is cancel-safe: bytes read before a cancelled
/// call stay in the splitter, frames already cut stay queued.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    splitter: FrameSplitter,
    ready: VecDeque<Result<Vec<u8>, FrameError>>,
    chunk: Box<[u8]>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            splitter: FrameSplitter::new(),
            ready: VecDeque::new(),
            chunk: vec![0; 16 * 1024].into(),
        }
    }

    /// The next frame (or framing error, e.g. an oversize frame that was skipped), or `None`
    /// at end of stream. An unterminated last line is dropped at EOF: the peer never finished it.
    pub async fn next(&mut self) -> std::io::Result<Option<Result<Vec<u8>, FrameError>>> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Ok(Some(frame));
            }
            let n = self.inner.read(&mut self.chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.ready.extend(self.splitter.push(&self.chunk[..n]));
        }
    }
}

/// Encodes one response as a line and flushes it. A response too large for a frame (which
/// the client would refuse) is replaced by an error reply that says so.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    out: &mut W,
    frame: &Response,
) -> std::io::Result<()> {
    let bytes = match encode_frame(frame) {
        Ok(b) => b,
        Err(e) => encode_frame(&Response::Error {
            code: ErrorCode::Internal,
            message: format!("the reply could not be framed: {e}"),
        })
        .map_err(std::io::Error::other)?,
    };
    out.write_all(&bytes).await?;
    out.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::protocol::MAX_FRAME_BYTES;

    #[tokio::test]
    async fn frames_survive_split_reads_and_oversize_lines_are_skipped() {
        let (mut client, server) = tokio::io::duplex(4096);
        let writer = tokio::spawn(async move {
            client.write_all(b"{\"type\":\"sta").await.unwrap();
            client.write_all(b"tus\"}\n").await.unwrap();
            client
                .write_all(&vec![b'x'; MAX_FRAME_BYTES + 10])
                .await
                .unwrap();
            client
                .write_all(b"\n{\"type\":\"config\"}\n")
                .await
                .unwrap();
        });
        let mut r = FrameReader::new(server);
        assert_eq!(
            r.next().await.unwrap().unwrap().unwrap(),
            b"{\"type\":\"status\"}"
        );
        assert!(matches!(
            r.next().await.unwrap().unwrap(),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(
            r.next().await.unwrap().unwrap().unwrap(),
            b"{\"type\":\"config\"}"
        );
        writer.await.unwrap();
        assert!(r.next().await.unwrap().is_none());
    }
}
