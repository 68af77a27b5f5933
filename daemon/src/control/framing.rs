//! Newline-delimited frames with a hard size limit.
//!
//! [`LineFramer`] is the pure state machine: bytes in, frames out. An oversize line is
//! reported once as [`Inbound::TooLarge`] and its remaining bytes are skipped up to the next
//! newline, so one bad frame costs one error reply and the connection goes on. Memory per
//! connection is bounded by the limit plus one read chunk.
use dflash_shared::protocol::Response;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// One complete line, without its newline.
    Line(Vec<u8>),
    /// A line longer than the limit; `seen` is how many of its bytes arrived before it was cut.
    TooLarge { seen: usize },
}

#[derive(Debug)]
pub struct LineFramer {
    buf: Vec<u8>,
    max: usize,
    /// Inside an oversize line: drop bytes until its newline.
    discarding: bool,
}

impl LineFramer {
    pub fn new(max_frame_bytes: usize) -> Self {
        LineFramer { buf: Vec::new(), max: max_frame_bytes, discarding: false }
    }

    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered that do not form a complete frame yet.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn next_frame(&mut self) -> Option<Inbound> {
        loop {
            let newline = self.buf.iter().position(|&b| b == b'\n');
            if self.discarding {
                match newline {
                    Some(p) => {
                        self.buf.drain(..=p);
                        self.discarding = false;
                        continue;
                    }
                    None => {
                        self.buf.clear();
                        return None;
                    }
                }
            }
            return match newline {
                Some(p) if p > self.max => {
                    self.buf.drain(..=p);
                    Some(Inbound::TooLarge { seen: p })
                }
                Some(p) => {
                    let mut line: Vec<u8> = self.buf.drain(..=p).collect();
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    Some(Inbound::Line(line))
                }
                None if self.buf.len() > self.max => {
                    let seen = self.buf.len();
                    self.buf.clear();
                    self.discarding = true;
                    Some(Inbound::TooLarge { seen })
                }
                None => None,
            };
        }
    }
}

/// Reads frames from an async stream. `next` is cancel-safe: bytes read before a cancelled
/// call stay in the framer.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    framer: LineFramer,
    chunk: Box<[u8]>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame_bytes: usize) -> Self {
        FrameReader { inner, framer: LineFramer::new(max_frame_bytes), chunk: vec![0; 16 * 1024].into() }
    }

    /// The next frame, or `None` at end of stream. Bytes of an unterminated last line are
    /// dropped at EOF (the peer never finished that frame).
    pub async fn next(&mut self) -> std::io::Result<Option<Inbound>> {
        loop {
            if let Some(frame) = self.framer.next_frame() {
                return Ok(Some(frame));
            }
            let n = self.inner.read(&mut self.chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.framer.feed(&self.chunk[..n]);
        }
    }
}

/// Serializes one response as a line and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin>(out: &mut W, frame: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(frame).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await?;
    out.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(f: &mut LineFramer) -> Vec<Inbound> {
        std::iter::from_fn(|| f.next_frame()).collect()
    }

    #[test]
    fn splits_lines_across_arbitrary_chunks() {
        let mut f = LineFramer::new(64);
        f.feed(b"{\"a\":1}\n{\"b\"");
        assert_eq!(frames(&mut f), vec![Inbound::Line(b"{\"a\":1}".to_vec())]);
        f.feed(b":2}\r\n");
        assert_eq!(frames(&mut f), vec![Inbound::Line(b"{\"b\":2}".to_vec())]);
        assert_eq!(f.pending_bytes(), 0);
    }

    #[test]
    fn oversize_line_is_reported_once_and_skipped_up_to_its_newline() {
        let mut f = LineFramer::new(8);
        f.feed(&[b'x'; 20]);
        assert_eq!(frames(&mut f), vec![Inbound::TooLarge { seen: 20 }]);
        f.feed(&[b'y'; 100]);
        assert_eq!(frames(&mut f), vec![], "the rest of the same line is silently skipped");
        assert_eq!(f.pending_bytes(), 0, "memory stays bounded while discarding");
        f.feed(b"yyy\nok\n");
        assert_eq!(frames(&mut f), vec![Inbound::Line(b"ok".to_vec())]);
    }

    #[test]
    fn oversize_line_arriving_whole_is_cut_too() {
        let mut f = LineFramer::new(4);
        f.feed(b"123456\nabc\n");
        assert_eq!(frames(&mut f), vec![Inbound::TooLarge { seen: 6 }, Inbound::Line(b"abc".to_vec())]);
    }

    #[test]
    fn a_line_of_exactly_the_limit_passes() {
        let mut f = LineFramer::new(4);
        f.feed(b"1234\n");
        assert_eq!(frames(&mut f), vec![Inbound::Line(b"1234".to_vec())]);
    }
}
