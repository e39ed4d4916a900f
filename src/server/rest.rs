//! An idle HTTP/1 keep-alive connection held without hyper's buffers.
//!
//! hyper keeps a connection's read buffer (8 KiB) and its write buffer for
//! heads (another 8 KiB) for as long as the connection is open, used or
//! not: an app's pool of keep-alive connections made courier's RSS grow by
//! those buffers, idle (benches/RESULTS.md, step i; issue #47). So a
//! connection that has answered everything and asked nothing for
//! [`REST_AFTER`] is taken back from hyper (`into_parts`: the socket and
//! any bytes read but not yet parsed) and held as a bare socket that waits
//! to be readable; its next bytes get a new hyper connection, with those
//! bytes in front. Kestrel does the same ("return pooled blocks when the
//! connection is idle").
//!
//! Taking it back is safe only between messages: no request is being
//! handled (the connection's `Activity`), and no answer's bytes wait in
//! hyper for a client that does not read (`Wire::unsent`). A partial head
//! the client sent is in `Parts::read_buf` and goes in front again. A
//! request body still being read after its answer (`linger`) keeps the
//! connection busy until its end; any other body the handler left unread
//! hyper drains at once or closes the connection for
//! (`poll_drain_or_close_read`), so a connection idle this long is not in
//! the middle of one.
//!
//! HTTP/2 (h2c) connections are left to hyper whole: the protocol is told
//! from the first bytes, as `hyper_util`'s `auto` does. `Wire` is written
//! here because `hyper_util`'s own rewinding reader is private, and the
//! note of a pending write is ours.

use bytes::{Buf, Bytes, BytesMut};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long a connection has answered everything and asked nothing before
/// its buffers are given back. Long enough that a connection in use (an
/// app's pool under load sends again within milliseconds) keeps its hyper
/// connection; short, as every connection of a burst holds its buffers
/// this long: 5,000 connections of one event each took courier's peak RSS
/// to 125 MiB at 1 s, 65 MiB at 100 ms (benches/RESULTS.md, step i).
pub const REST_AFTER: Duration = Duration::from_millis(100);

/// HTTP/2's connection preface, which an h2c client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Waits until the resting `stream` has bytes to read (`true`) or is
/// closed by the client (`false`). A peek, so that a readiness that finds
/// nothing (epoll may report one) waits again rather than building a hyper
/// connection for nothing.
pub async fn woken(stream: &TcpStream) -> bool {
    matches!(stream.peek(&mut [0u8; 1]).await, Ok(n) if n > 0)
}

/// What the first bytes of a connection say it speaks.
pub enum Protocol {
    Http1,
    H2,
}

/// Reads until the first bytes tell HTTP/1 from the h2c preface; `None`
/// when the client closes first. The bytes read are kept in `read`.
pub async fn sniff(
    stream: &mut TcpStream,
    read: &mut BytesMut,
) -> std::io::Result<Option<Protocol>> {
    // Bounded: each pass reads at least a byte, and it ends by 24.
    loop {
        let n = read.len().min(H2_PREFACE.len());
        if read[..n] != H2_PREFACE[..n] {
            return Ok(Some(Protocol::Http1));
        }
        if n == H2_PREFACE.len() {
            return Ok(Some(Protocol::H2));
        }
        let mut byte = [0u8; 24];
        let got = stream.read(&mut byte[..H2_PREFACE.len() - n]).await?;
        if got == 0 {
            return Ok(None);
        }
        read.extend_from_slice(&byte[..got]);
    }
}

/// The connection's socket as hyper sees it: bytes already read (the
/// sniffed ones, or those hyper had read but not parsed when it gave the
/// connection back) come first; and a note of whether a write waits.
pub struct Wire {
    stream: TcpStream,
    front: Bytes,
    unsent: Arc<AtomicBool>,
}

impl Wire {
    pub fn new(stream: TcpStream, front: Bytes) -> Wire {
        Wire {
            stream,
            front,
            unsent: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether hyper holds bytes of an answer that the socket did not take
    /// yet, readable while hyper owns the `Wire`.
    pub fn unsent(&self) -> Arc<AtomicBool> {
        self.unsent.clone()
    }

    /// The socket, and what hyper had read and not parsed (`read_buf`)
    /// followed by what it had not read yet of the front. Copied, never
    /// kept as it is: an empty `read_buf` still holds hyper's whole buffer.
    pub fn take_back(self, read_buf: Bytes) -> (TcpStream, Bytes) {
        let front = if read_buf.is_empty() {
            if self.front.is_empty() {
                Bytes::new()
            } else {
                self.front
            }
        } else {
            let mut both = BytesMut::with_capacity(read_buf.len() + self.front.len());
            both.extend_from_slice(&read_buf);
            both.extend_from_slice(&self.front);
            both.freeze()
        };
        (self.stream, front)
    }

    fn note<T>(&self, polled: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        self.unsent.store(polled.is_pending(), Ordering::Relaxed);
        polled
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.front.is_empty() {
            let n = this.front.len().min(buf.remaining());
            buf.put_slice(&this.front[..n]);
            this.front.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.note(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.note(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.note(polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
