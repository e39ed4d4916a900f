//! The pool against servers on loopback that count their connections.

use super::*;
use crate::deliver::guard::Guarded;
use crate::deliver::resolver::Resolver;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(5);

/// A server's connections: opened, and closed by the peer or by it.
#[derive(Default)]
struct Counts {
    opened: AtomicUsize,
    closed: AtomicUsize,
}

impl Counts {
    fn opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits (bounded) for `n` connections closed.
    async fn wait_closed(&self, n: usize) -> usize {
        let end = Instant::now() + WAIT;
        while self.closed() < n && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.closed()
    }
}

/// An HTTP/1.1 server answering 200 after `delay`; its URL and counts.
async fn server(delay: Duration) -> (String, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            c.opened.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            tokio::spawn(async move {
                let answer = service_fn(move |_req| async move {
                    tokio::time::sleep(delay).await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), answer)
                    .await;
                c.closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (url, counts)
}

/// A server that answers each connection's first request and then closes
/// it, saying nothing of it: what a server whose keep-alive ran out does.
async fn closing_server() -> (String, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            c.opened.fetch_add(1, Ordering::SeqCst);
            let mut buf = vec![0; 4096];
            let mut read = 0;
            while !buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                match tcp.read(&mut buf[read..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
            let _ = tcp
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
            drop(tcp);
            c.closed.fetch_add(1, Ordering::SeqCst);
        }
    });
    (url, counts)
}

fn pool(per_origin: usize, max_idle: usize, idle_timeout: Duration) -> Pool {
    let mut http = HttpConnector::new_with_resolver(Resolver::new(None));
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(
            rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(Guarded::new(http, None));
    Pool::new(connector, per_origin, max_idle, idle_timeout)
}

/// Sends a POST to `url` and reads the answer whole.
async fn send(pool: &Pool, url: &str) -> u16 {
    let req = Request::post(url)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let answer = pool.request(req).await.expect("answered");
    let status = answer.status().as_u16();
    http_body_util::BodyExt::collect(answer.into_body())
        .await
        .expect("body");
    status
}

/// Waits (bounded) until the pool keeps `n` connections, all ready for a
/// request (an answer's body read, the connection idle again).
async fn wait_idle(pool: &Pool, n: usize) -> usize {
    let end = Instant::now() + WAIT;
    while pool.kept() != (n, n) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.kept().1
}

#[tokio::test]
async fn an_endpoints_connection_is_used_again() {
    let (url, counts) = server(Duration::ZERO).await;
    let pool = pool(4, 100, Duration::from_secs(4));
    for _ in 0..3 {
        assert_eq!(send(&pool, &url).await, 200);
        assert_eq!(wait_idle(&pool, 1).await, 1);
    }
    assert_eq!(counts.opened(), 1, "each request opened a connection");
}

/// Three servers, and a pool of at most 2 idle connections.
async fn three_servers_and_a_bound_of_two() -> ([(String, Arc<Counts>); 3], Pool) {
    let servers = [
        server(Duration::ZERO).await,
        server(Duration::ZERO).await,
        server(Duration::ZERO).await,
    ];
    (servers, pool(4, 2, Duration::from_secs(60)))
}

/// With the first two servers' connections kept, the first idle longest:
/// an attempt to the third closes the first's at once (its server sees it
/// go without any timeout), and the second's is kept and used.
async fn the_third_closes_the_first(servers: &[(String, Arc<Counts>); 3], pool: &Pool) {
    assert_eq!(send(pool, &servers[2].0).await, 200);
    assert_eq!(wait_idle(pool, 2).await, 2, "the bound holds");
    assert_eq!(servers[0].1.wait_closed(1).await, 1);
    assert_eq!((servers[1].1.closed(), servers[2].1.closed()), (0, 0));
    assert_eq!(send(pool, &servers[1].0).await, 200);
    assert_eq!(servers[1].1.opened(), 1, "the second's is kept and used");
}

#[tokio::test]
async fn past_the_bound_the_connection_idle_longest_is_closed_at_once() {
    let (servers, pool) = three_servers_and_a_bound_of_two().await;
    for (url, _) in &servers[..2] {
        assert_eq!(send(&pool, url).await, 200);
    }
    assert_eq!(wait_idle(&pool, 2).await, 2);
    the_third_closes_the_first(&servers, &pool).await;
}

/// Taken turns stay in the eviction queue until met: after many reuses
/// the queue is still bounded, and its oldest kept turn still decides.
#[tokio::test]
async fn after_many_reuses_the_one_idle_longest_is_still_the_one_closed() {
    let (servers, pool) = three_servers_and_a_bound_of_two().await;
    // 300 turns between the two: each leaves a taken turn in the queue.
    for _ in 0..150 {
        for (url, _) in &servers[..2] {
            assert_eq!(send(&pool, url).await, 200);
            wait_idle(&pool, pool.kept().0).await;
        }
    }
    assert_eq!(wait_idle(&pool, 2).await, 2);
    let queued = pool.inner.lock().order.len();
    assert!(queued <= 2 + 64 + 1, "taken turns dropped: {queued} queued");
    assert_eq!((servers[0].1.opened(), servers[1].1.opened()), (1, 1));
    the_third_closes_the_first(&servers, &pool).await;
}

#[tokio::test]
async fn an_endpoint_keeps_at_most_its_concurrency_idle() {
    let (url, counts) = server(Duration::from_millis(100)).await;
    let pool = pool(1, 100, Duration::from_secs(60));
    let sends = (0..3).map(|_| send(&pool, &url));
    let statuses = futures::future::join_all(sends).await;
    assert_eq!(statuses, vec![200; 3]);
    assert_eq!(counts.opened(), 3, "three at once need three connections");
    assert_eq!(wait_idle(&pool, 1).await, 1);
    assert_eq!(counts.wait_closed(2).await, 2, "two beyond the one kept");
}

#[tokio::test]
async fn idle_connections_are_closed_after_their_time() {
    let (url, counts) = server(Duration::ZERO).await;
    let pool = pool(4, 100, Duration::from_millis(100));
    assert_eq!(send(&pool, &url).await, 200);
    // The sweep runs every second.
    assert_eq!(counts.wait_closed(1).await, 1, "still open after its time");
    assert_eq!(pool.kept(), (0, 0));
}

#[tokio::test]
async fn a_connection_the_server_closed_is_not_used_again_and_leaves_the_pool() {
    let (url, counts) = closing_server().await;
    let pool = pool(4, 100, Duration::from_secs(60));
    for _ in 0..3 {
        assert_eq!(send(&pool, &url).await, 200);
    }
    assert_eq!(counts.opened(), 3);
    // The sweep, each second, drops what the server closed: it would hold
    // places of the bounds until its 60 s were up.
    let end = Instant::now() + WAIT;
    while pool.kept().0 > 0 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(pool.kept(), (0, 0), "closed connections still kept");
}

#[tokio::test]
async fn a_bound_of_zero_keeps_none() {
    let (url, counts) = server(Duration::ZERO).await;
    let pool = pool(4, 0, Duration::from_secs(60));
    for _ in 0..2 {
        assert_eq!(send(&pool, &url).await, 200);
    }
    assert_eq!(counts.opened(), 2);
    assert_eq!(counts.wait_closed(2).await, 2);
    assert_eq!(pool.kept(), (0, 0));
}

#[tokio::test]
async fn http1_sends_the_path_and_the_host() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let head = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accept");
        let mut buf = vec![0; 4096];
        let mut read = 0;
        while !buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
            read += tcp.read(&mut buf[read..]).await.expect("read");
        }
        let _ = tcp
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await;
        String::from_utf8_lossy(&buf[..read]).to_string()
    });
    let pool = pool(4, 100, Duration::from_secs(60));
    let url = format!("http://localhost:{port}/hooks/x?a=1");
    assert_eq!(send(&pool, &url).await, 200);
    let head = head.await.expect("head").to_ascii_lowercase();
    assert!(head.starts_with("post /hooks/x?a=1 http/1.1\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nhost: localhost:{port}\r\n")),
        "{head}"
    );
}

#[test]
fn an_origins_key_is_its_scheme_host_and_port_in_any_case() {
    let key = |u: &str| origin_of(&u.parse::<Uri>().expect("a uri")).map(|k| k.to_string());
    assert_eq!(
        key("HTTP://Hooks.Example:8080/a?b").as_deref(),
        Some("http://hooks.example:8080")
    );
    // One endpoint (its share, its health) is one set of connections.
    assert_eq!(
        key("https://hooks.example/a").as_deref(),
        Some("https://hooks.example:443")
    );
    assert_eq!(
        key("https://hooks.example:443/b"),
        key("https://Hooks.Example/")
    );
    assert_eq!(key("http://[::1]/"), key("http://[::1]:80/x"));
    assert_eq!(
        key("http://hooks.example:8080/z"),
        key("HTTP://HOOKS.example:8080")
    );
    assert_ne!(
        key("http://hooks.example:8080/"),
        key("http://hooks.example:8081/")
    );
    assert_ne!(key("http://hooks.example/"), key("https://hooks.example/"));
    assert_eq!(key("/only/a/path"), None);
}
