//! A connection to an endpoint as courier's clients hold it: hyper-util's
//! TCP stream, without the addresses (`HttpInfo`) that its `Connected`
//! carries. hyper-util's client copies that extra into every answer's
//! extensions, three allocations an attempt (a map, its table, the value)
//! that nothing in courier reads (uprobes on the allocator,
//! benches/RESULTS.md).

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::net::TcpStream;

pub struct Stream(pub TokioIo<TcpStream>);

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use crate::deliver::client::{HttpsClient, build_connector};
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::connect::HttpInfo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A fixed destination's answers carry no `HttpInfo`: its connections
    /// are `Stream`s, which tell hyper-util nothing to copy.
    #[tokio::test]
    async fn an_answer_carries_no_connection_info() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.expect("read");
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await
                .expect("write");
        });
        let client = build_connector()
            .expect("connector")
            .client(1, None, None, None)
            .expect("client");
        assert!(matches!(client, HttpsClient::Fixed(_)));
        let req = http::Request::post(format!("http://{addr}/hook"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        let resp = client.request(req).await.expect("answer");
        assert_eq!(resp.status(), 200);
        assert!(resp.extensions().get::<HttpInfo>().is_none());
        server.await.expect("server");
    }
}
