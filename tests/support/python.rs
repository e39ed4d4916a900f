//! A Python with the independent checkers of `tests/py/requirements.txt`
//! (the CloudEvents SDK, `standardwebhooks`, `azure-eventgrid`), so that
//! courier's deliveries are judged by code nobody on this project wrote.
//!
//! The virtualenv lives in `./.venv` and is created on first use (pip from
//! PyPI), under a file lock because test binaries run in parallel; `.ci/run`
//! creates it up front. `COURIER_PYTHON` points at another interpreter that
//! already has the packages.

use super::receiver::Received;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The courier package's root: this crate lives in its `tests/support`.
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The interpreter, installing the checkers first if needed. Panics with
/// pip's output when the install fails: a test without its checker must fail,
/// never pass quietly.
pub fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("COURIER_PYTHON") {
            return PathBuf::from(p);
        }
        let venv = root().join(".venv");
        let py = venv.join("bin/python");
        let reqs = root().join("tests/py/requirements.txt");
        let stamp = venv.join(".installed");
        let wanted = std::fs::read(&reqs).expect("read tests/py/requirements.txt");
        super::install::once(&root().join(".venv.lock"), &stamp, &wanted, || {
            if !py.exists() {
                run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
            }
            run(Command::new(&py)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-r",
                ])
                .arg(&reqs));
        });
        py
    })
    .clone()
}

fn run(cmd: &mut Command) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `tests/py/<script>` with `args`, feeding `stdin`; returns stdout.
/// Panics with the script's output when it exits non-zero, so a failed
/// independent check fails the test with the checker's own words.
pub fn check_with(script: &str, args: &[&str], stdin: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new(python())
        .arg(root().join("tests/py").join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start python for {script}: {e}"));
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).expect("write to the checker");
    }
    let out = child.wait_with_output().expect("wait for the checker");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "independent check {script} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A delivered request as the checkers in `tests/py` read it:
/// `{"headers": {name: value}, "body": "..."}`, repeated headers joined
/// with ", ".
pub fn request_json(r: &Received) -> serde_json::Value {
    let mut headers = serde_json::Map::new();
    for name in r.headers.keys() {
        let values: Vec<&str> = r
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        headers.insert(name.to_string(), serde_json::json!(values.join(", ")));
    }
    serde_json::json!({ "headers": headers, "body": r.text() })
}
