//! Step i (issue #47): what idle keep-alive connections cost courier.
//!
//! i. courier idle (`IDLE` after 20 events, so that the code an event runs
//!    is paged in, as in a pod that has served), then 5,000 connections, each
//!    sending one 1 KiB event and kept open (HTTP/1.1 keep-alive, as an
//!    app's connection pool leaves them), RSS 2 s after the last answer;
//!    then every connection closed by the client, RSS 30 s later. All
//!    within courier's idle timeout (`server::edge::HEADER_TIMEOUT`, 10 s),
//!    so that courier holds every connection when it is measured.
//!
//! Budgets (issue #47): held ≤ 32 MiB above idle; 30 s after they close,
//! within 4 MiB of idle (memory given back after a burst).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Budget, Check, IDLE, MIB, Row, budget, proc_status, start};

const CONNECTIONS: usize = 5_000;
/// Events sent, one connection each, before idle is measured.
const WARM_UP: usize = 20;
/// Opened at once: below the listener's backlog, so none waits on it.
const OPENING: usize = 200;
const HELD_MIB: f64 = 32.0;
const AFTER_MIB: f64 = 4.0;
/// How long after the clients close RSS is read again.
const AFTER: Duration = Duration::from_secs(30);

pub fn budget_names() -> [String; 2] {
    [
        format!("{CONNECTIONS} idle connections, RSS above idle"),
        format!(
            "RSS {}s after {CONNECTIONS} connections close, above idle",
            AFTER.as_secs()
        ),
    ]
}

/// Step i.
pub async fn idle_connections(
    label: &str,
    bin: &Path,
    rx: &str,
) -> Result<(Row, Vec<Budget>), String> {
    let run = start(bin, rx, "").await?;
    let pid = run.courier.pid();
    let addr = run.courier.ingress_addr().to_string();
    let path = format!("/{}", super::DESTINATION);
    let body = support::json_body(super::BODY_BYTES, 0);
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let request: Arc<[u8]> = request.into();
    // Idle is a courier that has served: its code for an event is paged
    // in (file-backed RSS), as in a pod that has run a while.
    for _ in 0..WARM_UP {
        drop(one_event(&addr, &request).await?);
    }
    tokio::time::sleep(IDLE).await;
    let rss = || {
        let kib = |key| proc_status(pid, key).map_or(f64::NAN, |b| b as f64 / MIB);
        (kib("VmRSS"), kib("RssAnon"))
    };
    let (idle, idle_anon) = rss();
    let gate = Arc::new(tokio::sync::Semaphore::new(OPENING));
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let (gate, addr, request) = (gate.clone(), addr.clone(), request.clone());
        opening.spawn(async move {
            let _turn = gate.acquire_owned().await.map_err(|e| e.to_string())?;
            one_event(&addr, &request).await
        });
    }
    let mut held = Vec::with_capacity(CONNECTIONS);
    while let Some(joined) = opening.join_next().await {
        held.push(joined.map_err(|e| e.to_string())??);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (with, with_anon) = rss();
    drop(held);
    tokio::time::sleep(AFTER).await;
    let (after, after_anon) = rss();
    let names = budget_names();
    let budgets = vec![
        budget(
            format!("{label} {}", names[0]),
            vec![Check::at_most(with - idle, HELD_MIB, " MiB")],
            format!(
                "{:.1} MiB (≤ {HELD_MIB}); {:.1} KiB a connection",
                with - idle,
                (with - idle) * 1024.0 / CONNECTIONS as f64
            ),
        ),
        budget(
            format!("{label} {}", names[1]),
            vec![Check::at_most(after - idle, AFTER_MIB, " MiB")],
            format!("{:.1} MiB (≤ {AFTER_MIB})", after - idle),
        ),
    ];
    let row = Row {
        target: format!("{label} i. {CONNECTIONS} idle connections"),
        rss: proc_status(pid, "VmHWM"),
        note: format!(
            "VmRSS (RssAnon) idle, after {WARM_UP} events: {idle:.1} ({idle_anon:.1}) MiB; {CONNECTIONS} connections held, each after one 202: {with:.1} ({with_anon:.1}) MiB; {}s after the clients closed them: {after:.1} ({after_anon:.1}) MiB",
            AFTER.as_secs()
        ),
        ..Row::default()
    };
    Ok((row, budgets))
}

/// A connection that has had one event answered 202, left open.
async fn one_event(addr: &str, request: &[u8]) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.write_all(request).await.map_err(|e| e.to_string())?;
    // The answer: a head and a short JSON body, read to its end so that
    // courier's side is idle.
    let mut got = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    for _ in 0..64 {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("courier closed a connection before answering".into());
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        let Some((head, rest)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        if !head.starts_with("HTTP/1.1 202") {
            return Err(format!(
                "expected 202, got {}",
                head.lines().next().unwrap_or("")
            ));
        }
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>())
            })
            .and_then(Result::ok)
            .unwrap_or(0);
        if rest.len() >= length {
            return Ok(s);
        }
    }
    Err("no whole answer in 64 reads".into())
}
