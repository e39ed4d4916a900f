//! Real object stores for the tests, each started by the test on a free
//! loopback port: S3 as `moto_server` (PyPI `moto[server]`, in the test
//! venv), Azure Blob as Azurite (npm `azurite`, in `tests/node`), and a
//! [`Gate`] in front of one, so that a test can stop the store
//! (connections refused, those open cut) and start it again without losing
//! what it holds. Objects are read back with boto3 (`tests/py/s3_objects.py`)
//! and Azure's SDK (`tests/py/az_blobs.py`), not with courier's own code.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::python::{check_with, python};

/// The credentials moto accepts (any), as courier reads them: from the
/// environment only (docs/object-storage.md).
const KEY: &str = "courier-test";

pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts `moto_server` on a free loopback port, waits until it
    /// answers, and creates `bucket`.
    pub async fn start(bucket: &str) -> Moto {
        Moto::try_start(bucket)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start) for callers that go on without it (the
    /// bench): why it could not, instead of a panic. The test venv is
    /// installed first if need be (`python`).
    pub async fn try_start(bucket: &str) -> Result<Moto, String> {
        let py = std::panic::catch_unwind(python).map_err(|_| {
            "cannot install tests/py/requirements.txt into ./.venv (see above); COURIER_PYTHON may name a Python that has moto[server]".to_string()
        })?;
        let bin = py.with_file_name("moto_server");
        let port = free_port();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Bounded by the deadline.
        while TcpStream::connect(moto.addr()).await.is_err() {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!("{} exited with {status}", bin.display()));
            }
            if Instant::now() >= deadline {
                return Err(format!("{} did not listen on {port} in 30s", bin.display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let answer = raw::put(moto.addr(), &format!("/{bucket}")).await;
        if !answer.starts_with("HTTP/1.1 200") {
            return Err(format!("create bucket {bucket}: {answer}"));
        }
        Ok(moto)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Every object under `bucket/prefix`, by key, as boto3 reads them.
    pub fn objects(&self, bucket: &str, prefix: &str) -> Vec<(String, String)> {
        objects_at(&self.endpoint(), bucket, prefix)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every object under `bucket/prefix` of the S3 at `endpoint`, by key.
pub fn objects_at(endpoint: &str, bucket: &str, prefix: &str) -> Vec<(String, String)> {
    let out = check_with("s3_objects.py", &[endpoint, bucket, prefix], b"");
    by_name("s3_objects.py", &out)
}

/// A checker's `{name: text}` answer, sorted by name.
fn by_name(script: &str, out: &str) -> Vec<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_str(out).unwrap_or_else(|e| panic!("{script}: {e}: {out}"));
    let mut named: Vec<(String, String)> = v
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    named.sort();
    named
}

pub struct Azurite {
    child: Child,
    port: u16,
    _data: tempfile::TempDir,
}

impl Azurite {
    /// Starts Azurite's Blob service on a free loopback port, waits until
    /// it answers, and creates `container`.
    pub async fn start(container: &str) -> Azurite {
        let bin = super::node::bin("azurite-blob");
        let port = free_port();
        let data = tempfile::tempdir().expect("azurite data");
        let child = Command::new(&bin)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(data.path())
            .args(["--silent", "--skipApiVersionCheck"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let azurite = Azurite {
            child,
            port,
            _data: data,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Bounded by the deadline.
        while TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "Azurite did not listen in 30s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        check_with(
            "az_blobs.py",
            &["create", &azurite.endpoint(), container],
            b"",
        );
        azurite
    }

    /// The blob endpoint of Azurite's development account.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/devstoreaccount1", self.port)
    }

    /// The environment courier reads the emulator from (docs/object-storage.md).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
            (
                "AZURITE_BLOB_STORAGE_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
        ]
    }

    /// Every blob under `container/prefix`, by name, as Azure's SDK reads them.
    pub fn blobs(&self, container: &str, prefix: &str) -> Vec<(String, String)> {
        let out = check_with(
            "az_blobs.py",
            &["list", &self.endpoint(), container, prefix],
            b"",
        );
        by_name("az_blobs.py", &out)
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stores `bytes` at `bucket/key` of the S3 at `endpoint`, with boto3.
pub fn put_object(endpoint: &str, bucket: &str, key: &str, bytes: &[u8]) {
    check_with("s3_objects.py", &["--put", endpoint, bucket, key], bytes);
}

/// Stores each file at its key (`[(key, file)]`), in one boto3 session.
pub fn put_files(endpoint: &str, bucket: &str, files: &[(String, std::path::PathBuf)]) {
    let manifest = serde_json::to_vec(files).expect("a manifest");
    check_with(
        "s3_objects.py",
        &["--put-many", endpoint, bucket],
        &manifest,
    );
}

/// The keys under `bucket/prefix`, with their sizes, without reading them.
pub fn keys_at(endpoint: &str, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
    let out = check_with("s3_objects.py", &["--keys", endpoint, bucket, prefix], b"");
    by_name("s3_objects.py", &out)
        .into_iter()
        .map(|(k, size)| (k, size.parse().unwrap_or_default()))
        .collect()
}

/// The environment courier reads an S3 store from (docs/object-storage.md).
pub fn s3_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", KEY.to_string()),
        ("AWS_DEFAULT_REGION", "us-east-1".to_string()),
        ("AWS_ENDPOINT", endpoint.to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ]
}

/// A port free now (bound and let go): for servers that take a port
/// number, not a socket.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// One plain HTTP/1.1 request, without a client library: moto takes
/// unsigned bucket creation.
mod raw {
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    pub async fn put(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("send");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// A TCP gate in front of a store: open, it passes connections through;
/// closed, it refuses new ones and cuts those open, as a store that went
/// down does, while the store keeps what it holds.
pub struct Gate {
    port: u16,
    open: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    pub async fn start(upstream: SocketAddr) -> Gate {
        Gate::start_with(upstream, None).await
    }

    /// A gate that passes each connection's bytes at `bytes_per_s` each
    /// way: a slow store, so that a test can stop courier in the middle of
    /// what it does with it.
    pub async fn slow(upstream: SocketAddr, bytes_per_s: u64) -> Gate {
        Gate::start_with(upstream, Some(bytes_per_s)).await
    }

    async fn start_with(upstream: SocketAddr, rate: Option<u64>) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind gate");
        let port = listener.local_addr().expect("addr").port();
        let (open, rx) = watch::channel(true);
        let task = tokio::spawn(serve(listener, port, upstream, Arc::new(rx), rate));
        Gate { port, open, task }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn close(&self) {
        self.open.send_replace(false);
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut listener: TcpListener,
    port: u16,
    upstream: SocketAddr,
    open: Arc<watch::Receiver<bool>>,
    rate: Option<u64>,
) {
    let mut state = (*open).clone();
    // Ends when the gate is dropped (the task is aborted).
    loop {
        let closing = tokio::select! {
            accepted = listener.accept() => {
                if let Ok((down, _)) = accepted {
                    tokio::spawn(pass(down, upstream, (*open).clone(), rate));
                }
                false
            }
            _ = state.wait_for(|o| !*o) => true,
        };
        if !closing {
            continue;
        }
        drop(listener);
        if state.wait_for(|o| *o).await.is_err() {
            return;
        }
        // The same port again (std sets SO_REUSEADDR on listeners).
        let deadline = Instant::now() + Duration::from_secs(5);
        listener = loop {
            match TcpListener::bind(("127.0.0.1", port)).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "gate cannot listen again: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
    }
}

/// One connection through the gate, until either side ends or the gate
/// closes.
async fn pass(
    mut down: TcpStream,
    upstream: SocketAddr,
    mut open: watch::Receiver<bool>,
    rate: Option<u64>,
) {
    let Ok(mut up) = TcpStream::connect(upstream).await else {
        return;
    };
    let Some(rate) = rate else {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
            _ = open.wait_for(|o| !*o) => {}
        }
        return;
    };
    let (down_r, down_w) = down.split();
    let (up_r, up_w) = up.split();
    tokio::select! {
        _ = throttled(down_r, up_w, rate) => {}
        _ = throttled(up_r, down_w, rate) => {}
        _ = open.wait_for(|o| !*o) => {}
    }
}

/// Copies `from` to `to` at about `rate` bytes a second, until either ends.
async fn throttled(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    rate: u64,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 << 10];
    // Ends with the connection.
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
    }
}
