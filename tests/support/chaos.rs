//! `ChaosReceiver`: a raw-TCP HTTP/1.1 endpoint on 127.0.0.1 that answers
//! each request with a seeded random misbehaviour (5xx, 429/503 with
//! `Retry-After`, resets before or after the body, hangs, a late 200, a
//! trickled 200) and records what it did to which event.
//!
//! The action for a request is a pure function of the seed, the event id
//! (`webhook-id`) and the attempt number (`courier-delivery-attempt`), so a
//! run's seed reproduces every event's fate whatever order the requests
//! arrive in. [`seed`] reads `COURIER_CHAOS_SEED` or picks one at random;
//! print it so that a failure can be replayed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The seed for a chaos run: `COURIER_CHAOS_SEED` (decimal) if set, else a
/// fresh random one.
pub fn seed() -> u64 {
    seed_from_env("COURIER_CHAOS_SEED")
}

/// The seed in the environment variable `var` (decimal), else a random one.
pub fn seed_from_env(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={v:?} is not a u64: {e}")),
        Err(_) => rand::rng().random(),
    }
}

/// What the receiver did to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `200 OK` at once.
    Ok,
    /// `200 OK`, the status line and headers written a few bytes at a time,
    /// finished well within courier's timeout.
    Trickle,
    /// No answer until after courier's timeout, then `200 OK` (within the
    /// late-answer window).
    Late,
    /// This status (500 or 502), no body.
    Fail(u16),
    /// This status (429 or 503) with `Retry-After`.
    Busy(u16),
    /// The connection reset (RST) after the head, before the body was read.
    ResetBeforeBody,
    /// The whole request read, then the connection reset: no answer.
    ResetAfterBody,
    /// No answer at all: the connection is held until courier closes it.
    Hang,
}

impl Action {
    /// A 2xx answer (whether courier reads it in time or late).
    pub fn is_success(self) -> bool {
        matches!(self, Action::Ok | Action::Trickle | Action::Late)
    }

    /// `lastDeliveryOutcome` courier must record when this was an event's
    /// last attempt (docs/delivery.md), and `lastHttpStatusCode`.
    pub fn expected_outcome(self) -> (&'static str, Option<u16>) {
        match self {
            Action::Ok | Action::Trickle | Action::Late => ("Delivered", Some(200)),
            Action::Fail(s) => ("Failed", Some(s)),
            Action::Busy(s) => ("Busy", Some(s)),
            Action::ResetBeforeBody | Action::ResetAfterBody => ("SocketError", None),
            Action::Hang => ("TimedOut", None),
        }
    }
}

/// Relative weights of the actions (need not sum to anything in
/// particular); `Fail` and `Busy` pick one of their two statuses evenly.
#[derive(Clone, Debug)]
pub struct Mix {
    pub ok: u32,
    pub trickle: u32,
    pub late: u32,
    pub fail: u32,
    pub busy: u32,
    pub reset_before_body: u32,
    pub reset_after_body: u32,
    pub hang: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            ok: 50,
            trickle: 5,
            late: 3,
            fail: 12,
            busy: 10,
            reset_before_body: 8,
            reset_after_body: 8,
            hang: 3,
        }
    }
}

/// The receiver's timings, chosen against courier's `timeout` and
/// `late_answer_window`.
#[derive(Clone, Debug)]
pub struct Timing {
    /// `Late` answers this long after the request head was read: past
    /// courier's timeout, well inside its late-answer window.
    pub late_after: Duration,
    /// `Trickle` writes its answer in pieces this far apart (8 pieces).
    pub trickle_step: Duration,
    /// `Hang` gives up waiting for courier to close after this long.
    pub hang_cap: Duration,
}

/// One request the chaos receiver got and what it did.
#[derive(Clone, Debug)]
pub struct ChaosRecord {
    /// `webhook-id`.
    pub id: String,
    /// `courier-delivery-attempt`.
    pub attempt: Option<u32>,
    pub action: Action,
    /// When the request head had been read.
    pub at: Instant,
    /// For answers: the whole answer was written (write and flush returned
    /// Ok). Always false for resets and hangs.
    pub answered: bool,
}

struct State {
    seed: u64,
    mix: Mix,
    timing: Timing,
    records: Mutex<Vec<ChaosRecord>>,
    in_flight: AtomicUsize,
    /// Requests whose head could not be parsed, or without `webhook-id`.
    malformed: Mutex<Vec<String>>,
}

impl State {
    fn records(&self) -> MutexGuard<'_, Vec<ChaosRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A loopback HTTP/1.1 endpoint that misbehaves at random (seeded).
pub struct ChaosReceiver {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
}

impl ChaosReceiver {
    pub async fn start(seed: u64, mix: Mix, timing: Timing) -> ChaosReceiver {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("chaos receiver: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            seed,
            mix,
            timing,
            records: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            malformed: Mutex::new(Vec::new()),
        });
        let (shutdown, rx) = watch::channel(false);
        tokio::spawn(serve(listener, state.clone(), rx));
        ChaosReceiver {
            addr,
            state,
            shutdown,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seed(&self) -> u64 {
        self.state.seed
    }

    /// Every request so far, in the order the heads were read.
    pub fn records(&self) -> Vec<ChaosRecord> {
        self.state.records().clone()
    }

    /// Every request so far, grouped by event id, in arrival order.
    pub fn by_event(&self) -> HashMap<String, Vec<ChaosRecord>> {
        let mut out: HashMap<String, Vec<ChaosRecord>> = HashMap::new();
        for r in self.state.records().iter() {
            out.entry(r.id.clone()).or_default().push(r.clone());
        }
        out
    }

    /// Requests being handled right now (answers not yet written, hangs).
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// Requests that were not valid HTTP/1.1 or had no `webhook-id`.
    pub fn malformed(&self) -> Vec<String> {
        self.state
            .malformed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for ChaosReceiver {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// splitmix64: a fixed, portable mixer (std's hashers may change).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn pick(seed: u64, mix: &Mix, id: &str, attempt: u32) -> Action {
    let mut h = mix64(seed ^ u64::from(attempt).rotate_left(32));
    for b in id.bytes() {
        h = mix64(h ^ u64::from(b));
    }
    let mut rng = StdRng::seed_from_u64(h);
    let table = [
        mix.ok,
        mix.trickle,
        mix.late,
        mix.fail,
        mix.busy,
        mix.reset_before_body,
        mix.reset_after_body,
        mix.hang,
    ];
    let total: u32 = table.iter().sum();
    assert!(total > 0, "chaos Mix: every weight is 0");
    let mut roll = rng.random_range(0..total);
    let mut which = 0;
    for (i, w) in table.iter().enumerate() {
        if roll < *w {
            which = i;
            break;
        }
        roll -= w;
    }
    let mut either = |a: u16, b: u16| if rng.random_bool(0.5) { a } else { b };
    match which {
        0 => Action::Ok,
        1 => Action::Trickle,
        2 => Action::Late,
        3 => Action::Fail(either(500, 502)),
        4 => Action::Busy(either(429, 503)),
        5 => Action::ResetBeforeBody,
        6 => Action::ResetAfterBody,
        _ => Action::Hang,
    }
}

async fn serve(listener: TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    // Runs until shutdown (or the receiver is dropped).
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                conns.spawn(connection(stream, state.clone()));
            }
        }
    }
    conns.shutdown().await;
}

/// A parsed request head.
struct Head {
    id: Option<String>,
    attempt: Option<u32>,
    content_length: Option<usize>,
    chunked: bool,
}

/// Serves one keep-alive connection until courier closes it or an action
/// ends it.
async fn connection(mut stream: TcpStream, state: Arc<State>) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    // One turn per request on the connection; ends at end of stream, on an
    // error, or when an action closes the connection.
    loop {
        let head_end = match read_until_head(&mut stream, &mut buf).await {
            Some(end) => end,
            None => return,
        };
        let head = match parse_head(&buf[..head_end]) {
            Ok(h) => h,
            Err(e) => {
                record_malformed(&state, e);
                return;
            }
        };
        let Some(id) = head.id.clone() else {
            record_malformed(&state, "no webhook-id header".to_owned());
            return;
        };
        let at = Instant::now();
        let action = pick(state.seed, &state.mix, &id, head.attempt.unwrap_or(0));
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        let index = {
            let mut records = state.records();
            records.push(ChaosRecord {
                id,
                attempt: head.attempt,
                action,
                at,
                answered: false,
            });
            records.len() - 1
        };
        buf.drain(..head_end);
        let keep = act(&mut stream, &mut buf, &head, action, &state, index).await;
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !keep {
            return;
        }
    }
}

fn record_malformed(state: &State, what: String) {
    state
        .malformed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(what);
}

/// Carries out `action`; returns whether the connection can serve another
/// request.
async fn act(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &Head,
    action: Action,
    state: &State,
    index: usize,
) -> bool {
    if action == Action::ResetBeforeBody {
        reset(stream);
        return false;
    }
    if read_body(stream, buf, head).await.is_none() {
        return false;
    }
    let answer: Vec<u8> = match action {
        Action::ResetAfterBody => {
            reset(stream);
            return false;
        }
        Action::Hang => {
            // Wait for courier to give up and close (end of stream); never
            // answer.
            let mut scratch = [0u8; 1024];
            let _ = tokio::time::timeout(state.timing.hang_cap, async {
                // Ends at end of stream or on an error; bounded by hang_cap.
                loop {
                    match stream.read(&mut scratch).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            return false;
        }
        Action::Ok | Action::Trickle | Action::Late => {
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec()
        }
        Action::Fail(status) => {
            format!("HTTP/1.1 {status} Oops\r\ncontent-length: 0\r\n\r\n").into_bytes()
        }
        Action::Busy(status) => {
            format!("HTTP/1.1 {status} Busy\r\nretry-after: 0\r\ncontent-length: 0\r\n\r\n")
                .into_bytes()
        }
        Action::ResetBeforeBody => unreachable!("handled above"),
    };
    let written = match action {
        Action::Late => {
            tokio::time::sleep(state.timing.late_after).await;
            write_all(stream, &answer).await
        }
        Action::Trickle => {
            let piece = answer.len().div_ceil(8);
            let mut ok = true;
            for chunk in answer.chunks(piece) {
                tokio::time::sleep(state.timing.trickle_step).await;
                if !write_all(stream, chunk).await {
                    ok = false;
                    break;
                }
            }
            ok
        }
        _ => write_all(stream, &answer).await,
    };
    if written {
        state.records()[index].answered = true;
    }
    written
}

async fn write_all(stream: &mut TcpStream, bytes: &[u8]) -> bool {
    stream.write_all(bytes).await.is_ok() && stream.flush().await.is_ok()
}

/// Closes with RST instead of FIN (SO_LINGER 0).
fn reset(stream: &mut TcpStream) {
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    // The RST goes out when the caller drops the stream (it returns `false`).
}

/// Reads into `buf` until it holds a whole head; returns the offset just
/// past `\r\n\r\n`, or `None` at end of stream or on an error.
async fn read_until_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    // Each turn reads more bytes or ends; heads are bounded at 64 KiB.
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            return Some(i + 4);
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads the body that follows the head (already drained from `buf`) and
/// removes it from `buf`; `None` at end of stream or on an error.
async fn read_body(stream: &mut TcpStream, buf: &mut Vec<u8>, head: &Head) -> Option<()> {
    if head.chunked {
        // Each turn consumes one chunk (or reads more bytes).
        loop {
            let Some(line_end) = find(buf, b"\r\n") else {
                fill(stream, buf).await?;
                continue;
            };
            let size_text = std::str::from_utf8(&buf[..line_end]).ok()?;
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                // Last chunk; no trailers expected: the final CRLF.
                while buf.len() < line_end + 4 {
                    fill(stream, buf).await?;
                }
                buf.drain(..line_end + 4);
                return Some(());
            }
            while buf.len() < line_end + 2 + size + 2 {
                fill(stream, buf).await?;
            }
            buf.drain(..line_end + 2 + size + 2);
        }
    }
    let len = head.content_length.unwrap_or(0);
    while buf.len() < len {
        fill(stream, buf).await?;
    }
    buf.drain(..len);
    Some(())
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_head(bytes: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("head is not UTF-8: {e}"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    if !request_line.ends_with(" HTTP/1.1") {
        return Err(format!("not an HTTP/1.1 request line: {request_line:?}"));
    }
    let mut head = Head {
        id: None,
        attempt: None,
        content_length: None,
        chunked: false,
    };
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("bad header line {line:?}"));
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "webhook-id" => head.id = Some(value.to_owned()),
            "courier-delivery-attempt" => head.attempt = value.parse().ok(),
            "content-length" => {
                head.content_length = Some(
                    value
                        .parse()
                        .map_err(|e| format!("bad content-length {value:?}: {e}"))?,
                )
            }
            "transfer-encoding" => head.chunked = value.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    Ok(head)
}
