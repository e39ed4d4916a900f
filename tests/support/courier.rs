//! `Courier`: runs the real binary as a child process.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::time::Instant;

/// How long `start`/`restart` wait for the `courier listening` line.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `run_cli` lets a one-shot command run.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);

const POLL: Duration = Duration::from_millis(10);

/// The courier binary that cargo built beside the running test or bench:
/// those run from `target/<profile>/deps/`, the binary is
/// `target/<profile>/courier`. (`CARGO_BIN_EXE_courier` is only set when
/// compiling the package's own tests, not this crate.)
pub fn courier_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test runs from target/<profile>/deps");
        let bin = profile.join("courier");
        assert!(
            bin.exists(),
            "courier binary not found at {}; cargo builds it for the package's tests and benches",
            bin.display()
        );
        bin
    })
    .clone()
}

type Logs = Arc<Mutex<String>>;

/// A number from `/proc/<pid>/status`: `Threads`, or `VmHWM`, `VmRSS`,
/// `RssAnon` in KiB; `None` once the process is gone.
pub fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    value.split_whitespace().next()?.parse().ok()
}

/// Resets the process's peak RSS (`VmHWM`) to its current RSS, so that the
/// peak read later is that of what happened since (Linux 4.0 and later).
pub fn reset_peak_rss(pid: u32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

fn lock(logs: &Logs) -> MutexGuard<'_, String> {
    logs.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running (or exited) `courier run` child process.
pub struct Courier {
    bin: PathBuf,
    /// A command courier runs under (e.g. `strace -f -o FILE --`); empty:
    /// none. With one, `pid()` and the signals go to the wrapper.
    wrapper: Vec<String>,
    dir: PathBuf,
    config: PathBuf,
    env: Vec<(String, String)>,
    child: Child,
    exit: Option<ExitStatus>,
    logs: Logs,
    drains: Vec<JoinHandle<()>>,
    ingress: SocketAddr,
    admin: SocketAddr,
}

impl Courier {
    /// Writes `config_yaml` to `dir/courier.yaml` and runs the test build of
    /// courier on it (see [`courier_bin`]).
    pub async fn start(dir: &Path, config_yaml: &str) -> Courier {
        Courier::start_with(courier_bin(), dir, config_yaml).await
    }

    /// Like [`start`](Self::start) with an explicit binary.
    pub async fn start_with(bin: impl AsRef<Path>, dir: &Path, config_yaml: &str) -> Courier {
        Courier::start_with_env(bin, dir, config_yaml, &[]).await
    }

    /// Like [`start_with`](Self::start_with) with extra environment variables
    /// (e.g. secrets for `from_env` headers). Inherited `RUST_LOG` and
    /// `COURIER_*` variables are removed so the host environment cannot
    /// change the test.
    pub async fn start_with_env(
        bin: impl AsRef<Path>,
        dir: &Path,
        config_yaml: &str,
        env: &[(&str, &str)],
    ) -> Courier {
        Courier::start_wrapped(&[], bin, dir, config_yaml, env).await
    }

    /// Like [`start_with_env`](Self::start_with_env), running
    /// `WRAPPER... BIN run -c CONFIG` (e.g. `wrapper = ["strace", "-f",
    /// "-o", FILE, "--"]`). Signals and `kill()` go to the wrapper, which
    /// must pass them on (strace kills the command it started when it gets
    /// SIGTERM).
    pub async fn start_wrapped(
        wrapper: &[&str],
        bin: impl AsRef<Path>,
        dir: &Path,
        config_yaml: &str,
        env: &[(&str, &str)],
    ) -> Courier {
        let config = dir.join("courier.yaml");
        std::fs::write(&config, config_yaml)
            .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
        let logs: Logs = Arc::new(Mutex::new(String::new()));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let bin = bin.as_ref().to_path_buf();
        let wrapper: Vec<String> = wrapper.iter().map(|w| (*w).to_owned()).collect();
        let (child, drains) = spawn(&bin, &wrapper, dir, &config, &env, &logs);
        let mut courier = Courier {
            bin,
            wrapper,
            dir: dir.to_path_buf(),
            config,
            env,
            child,
            exit: None,
            logs,
            drains,
            ingress: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        courier.await_listening(0).await;
        courier
    }

    /// Starts the process again on the same dir and config file (after
    /// `kill()` or `terminate()` + `wait_exit()`; a still running process is
    /// SIGKILLed first) and waits for its new addresses. Logs keep
    /// accumulating, with a `=== courier restart ===` marker line.
    pub async fn restart(&mut self) {
        if self.exit.is_none() {
            self.kill();
        }
        let offset = {
            let mut logs = lock(&self.logs);
            logs.push_str("=== courier restart ===\n");
            logs.len()
        };
        let (child, drains) = spawn(
            &self.bin,
            &self.wrapper,
            &self.dir,
            &self.config,
            &self.env,
            &self.logs,
        );
        self.child = child;
        self.drains = drains;
        self.exit = None;
        self.await_listening(offset).await;
    }

    async fn await_listening(&mut self, offset: usize) {
        let deadline = Instant::now() + START_TIMEOUT;
        // Bounded by the deadline.
        loop {
            if let Some((ingress, admin)) = find_listening(&lock(&self.logs)[offset..]) {
                self.ingress = ingress;
                self.admin = admin;
                return;
            }
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.exit = Some(status);
                    self.join_drains().await;
                    panic!(
                        "courier ({}) exited with {status} before logging `courier listening`; output:\n{}",
                        self.bin.display(),
                        self.logs()
                    );
                }
                Ok(None) => {}
                Err(e) => panic!("courier: try_wait failed: {e}"),
            }
            if Instant::now() >= deadline {
                let pid = self.pid();
                self.kill();
                panic!(
                    "courier (pid {pid}) did not log `courier listening ingress=... admin=...` within {START_TIMEOUT:?}; output:\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// `http://127.0.0.1:PORT/{path}` on the ingress, e.g. `url("orders")`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.ingress, path.trim_start_matches('/'))
    }

    /// `http://127.0.0.1:PORT` of the admin surface.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    pub fn ingress_addr(&self) -> SocketAddr {
        self.ingress
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config_path(&self) -> &Path {
        &self.config
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything courier printed so far (stdout and stderr interleaved by
    /// line, ANSI colour codes removed).
    pub fn logs(&self) -> String {
        lock(&self.logs).clone()
    }

    /// Whether a log line matching `pred` shows up within `timeout`:
    /// courier's log writer lets each burst gather for 10 ms
    /// (docs/logs.md), so a line is not in `logs()` the moment after its cause.
    pub async fn logged(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if lock(&self.logs).lines().any(&pred) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The logs once every line logged before this call has reached them
    /// (the writer's 10 ms linger, with room for a busy machine): for
    /// checks that a line is absent, or counts.
    pub async fn settled_logs(&self) -> String {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.logs()
    }

    /// Waits until the logs contain `needle` (panics with the logs after
    /// `timeout`).
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if lock(&self.logs).contains(needle) {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
        if !lock(&self.logs).contains(needle) {
            panic!(
                "courier did not log {needle:?} within {timeout:?}; output:\n{}",
                self.logs()
            );
        }
    }

    /// The exit status if the process has exited (reaps it).
    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exit = Some(status);
        }
        self.exit
    }

    pub fn is_running(&mut self) -> bool {
        self.try_exit().is_none()
    }

    /// SIGKILL, then reap. No-op if already exited.
    pub fn kill(&mut self) {
        if self.try_exit().is_some() {
            return;
        }
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => self.exit = Some(status),
            Err(e) => panic!("courier: wait after SIGKILL failed: {e}"),
        }
    }

    /// Sends SIGTERM (graceful shutdown); use `wait_exit` to reap.
    pub fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `signal` (e.g. `libc::SIGINT`) unless the process has exited.
    pub fn signal(&mut self, signal: libc::c_int) {
        if self.try_exit().is_some() {
            return;
        }
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: plain kill(2) on our own, not yet reaped, child.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGTERM with `handoff` configured: courier must exit 0 within 30 s
    /// having handed off every pending event (its closing log line says so).
    pub async fn terminate_handing_off(&mut self) {
        self.terminate();
        let status = self.wait_exit(Duration::from_secs(30)).await;
        crate::check!(
            self,
            status.success(),
            "exit 0 after the hand-off: {status:?}"
        );
        crate::check!(
            self,
            self.logs().contains("handed off every pending event"),
            "it handed off every pending event"
        );
    }

    /// Waits for the process to exit and returns its status; panics with the
    /// logs after `timeout`. Once it returns, `logs()` holds all the output.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        // Bounded by the deadline.
        let status = loop {
            if let Some(status) = self.try_exit() {
                break status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "courier (pid {}) did not exit within {timeout:?}; output:\n{}",
                    self.pid(),
                    self.logs()
                );
            }
            tokio::time::sleep(POLL).await;
        };
        self.join_drains().await;
        status
    }

    /// Waits (at most 2 s) for the output threads to reach end of file.
    async fn join_drains(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && !self.drains.iter().all(|d| d.is_finished()) {
            tokio::time::sleep(POLL).await;
        }
        self.drains.retain(|d| !d.is_finished());
    }
}

impl Drop for Courier {
    fn drop(&mut self) {
        if self.exit.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn command(program: &Path, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k == "RUST_LOG" || k.starts_with("COURIER_") {
            cmd.env_remove(&key);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn spawn(
    bin: &Path,
    wrapper: &[String],
    dir: &Path,
    config: &Path,
    env: &[(String, String)],
    logs: &Logs,
) -> (Child, Vec<JoinHandle<()>>) {
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut cmd = command(Path::new(program), env);
            cmd.args(args).arg(bin);
            cmd
        }
        None => command(bin, env),
    };
    let mut child = cmd
        .arg("run")
        .arg("-c")
        .arg(config)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {} (wrapper {wrapper:?}): {e}", bin.display()));
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let drains = vec![drain(stdout, logs.clone()), drain(stderr, logs.clone())];
    (child, drains)
}

/// Copies a pipe into the shared log buffer line by line until end of file,
/// so the child never blocks on a full pipe.
fn drain(pipe: impl Read + Send + 'static, logs: Logs) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        // Ends at end of file (the child exited) or on a read error.
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let mut text = strip_ansi(&String::from_utf8_lossy(&line));
                    if !text.ends_with('\n') {
                        text.push('\n');
                    }
                    lock(&logs).push_str(&text);
                }
            }
        }
    })
}

/// Removes ANSI escape sequences (colours, styles).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // CSI (`ESC [` parameters, then a final byte `@..=~`); any other
        // escape is two characters and the second one is dropped.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// Finds the `courier listening` line and its `ingress` and `admin` fields
/// (text `key=value` or JSON `"key":"value"` format).
pub fn find_listening(logs: &str) -> Option<(SocketAddr, SocketAddr)> {
    logs.lines()
        .filter(|line| line.contains("courier listening"))
        .find_map(|line| Some((field_addr(line, "ingress")?, field_addr(line, "admin")?)))
}

fn field_addr(line: &str, key: &str) -> Option<SocketAddr> {
    line.match_indices(key).find_map(|(i, _)| {
        let boundary = line[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if !boundary {
            return None;
        }
        let rest = line[i + key.len()..].trim_start_matches('"');
        let rest = rest.strip_prefix('=').or_else(|| rest.strip_prefix(':'))?;
        let rest = rest.trim_start_matches([' ', '"']);
        let end = rest
            .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    })
}

/// Result of a one-shot command.
#[derive(Clone, Debug)]
pub struct CliOutput {
    /// Exit code; 128 + signal number if killed by a signal.
    pub code: i32,
    /// ANSI colour codes removed.
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// Exit code, stdout and stderr, for assertion messages.
    pub fn show(&self) -> String {
        format!(
            "exit code {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// stdout parsed as JSON (panics with the output otherwise).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}); code {}\nstdout:\n{}\nstderr:\n{}",
                self.code, self.stdout, self.stderr
            )
        })
    }
}

/// Runs a one-shot command such as `courier check -c FILE` with the given
/// binary (`None`: [`courier_bin`]) and extra environment, in the current
/// directory; panics if it runs longer than [`CLI_TIMEOUT`].
pub async fn run_cli(bin: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    run_cli_in(bin, None, args, env).await
}

/// Like [`run_cli`] with a working directory.
pub async fn run_cli_in(
    bin: Option<&Path>,
    cwd: Option<&Path>,
    args: &[&str],
    env: &[(&str, &str)],
) -> CliOutput {
    let bin = bin.map(Path::to_path_buf).unwrap_or_else(courier_bin);
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut cmd = tokio::process::Command::from(command(&bin, &env));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let output = match tokio::time::timeout(CLI_TIMEOUT, cmd.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("cannot run {} {args:?}: {e}", bin.display()),
        Err(_) => panic!(
            "{} {args:?} did not finish within {CLI_TIMEOUT:?}",
            bin.display()
        ),
    };
    let code = output
        .status
        .code()
        .or_else(|| output.status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    CliOutput {
        code,
        stdout: strip_ansi(&String::from_utf8_lossy(&output.stdout)),
        stderr: strip_ansi(&String::from_utf8_lossy(&output.stderr)),
    }
}
