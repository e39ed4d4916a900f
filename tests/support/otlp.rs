//! A real OTLP/HTTP trace receiver (`tests/py/otlp_receiver.py`, decoding
//! with the OpenTelemetry project's `opentelemetry-proto` package), started
//! by the test on a free loopback port. It appends every span it gets to a
//! JSON Lines file, read back here as [`Span`]s.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::python::python;

pub struct OtlpReceiver {
    child: Child,
    port: u16,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

/// One span as the receiver decoded it.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind`: 2 server, 3 client.
    pub kind: i64,
    pub attributes: serde_json::Map<String, Value>,
    /// (trace id, span id, attributes) of each link.
    pub links: Vec<(String, String, serde_json::Map<String, Value>)>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i64,
}

impl Span {
    pub const SERVER: i64 = 2;
    pub const CLIENT: i64 = 3;

    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }

    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(Value::as_str)
    }

    /// An integer attribute (OTLP's int_value).
    pub fn attr_int(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(Value::as_i64)
    }

    fn parse(line: &str) -> Span {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        let map = |v: &Value| v.as_object().cloned().unwrap_or_default();
        Span {
            trace_id: s("trace_id"),
            span_id: s("span_id"),
            parent_span_id: s("parent_span_id"),
            name: s("name"),
            kind: v["kind"].as_i64().unwrap_or_default(),
            attributes: map(&v["attributes"]),
            links: v["links"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| {
                    let ls = |k: &str| l[k].as_str().unwrap_or_default().to_string();
                    (ls("trace_id"), ls("span_id"), map(&l["attributes"]))
                })
                .collect(),
            status: v["status"]["code"].as_i64().unwrap_or_default(),
        }
    }
}

impl OtlpReceiver {
    /// Starts the receiver and waits for its port.
    pub async fn start() -> OtlpReceiver {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("spans.jsonl");
        let script = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../py/otlp_receiver.py"
        ));
        let mut child = Command::new(python())
            .arg(script)
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start otlp_receiver.py: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        let line = tokio::time::timeout(Duration::from_secs(30), line)
            .await
            .expect("otlp_receiver.py printed no port in 30s")
            .expect("join")
            .expect("read the port");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("otlp_receiver.py printed {line:?}, not a port"));
        OtlpReceiver {
            child,
            port,
            file,
            _dir: dir,
        }
    }

    /// Its base URL, for `tracing.otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        match std::fs::read_to_string(&self.file) {
            Ok(text) => text.lines().map(Span::parse).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("read {}: {e}", self.file.display()),
        }
    }

    /// The spans once `done` holds for them, or `None` after `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[Span]) -> bool,
    ) -> Option<Vec<Span>> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return Some(spans);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
