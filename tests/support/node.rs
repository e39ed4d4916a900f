//! Node with the independent checkers of `tests/node/package.json` (Azure's
//! `@azure/eventgrid`), so that courier is also judged by the Node SDK that
//! Event Grid publishers and receivers in Node run.
//!
//! `npm ci` installs the committed `package-lock.json` into
//! `tests/node/node_modules` on first use (from the npm registry), under a
//! file lock because test binaries run in parallel, and again only when the
//! lock file changes; `.ci/run` installs it up front.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// `tests/node` of the courier package: this crate lives in its `tests/support`.
fn dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../node"))
}

/// The folder of the scripts, installing their packages first if needed.
/// Panics with npm's output when the install fails: a test without its
/// checker must fail, never pass quietly.
fn scripts() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let lockfile = std::fs::read(dir().join("package-lock.json"))
                .expect("read tests/node/package-lock.json");
            let stamp = dir().join("node_modules/.courier-installed");
            let lock = dir().join("../../.node.lock");
            super::install::once(&lock, &stamp, &lockfile, || {
                let out = Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund"])
                    .current_dir(dir())
                    .stdin(Stdio::null())
                    .output()
                    .unwrap_or_else(|e| panic!("cannot run npm: {e}"));
                assert!(
                    out.status.success(),
                    "npm ci in tests/node failed:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            });
            dir().to_path_buf()
        })
        .clone()
}

/// A program of the installed packages (`node_modules/.bin/<name>`).
pub fn bin(name: &str) -> PathBuf {
    scripts().join("node_modules/.bin").join(name)
}

/// Runs `node tests/node/<script> args...`, feeding `stdin`.
pub fn run(script: &str, args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new("node")
        .arg(scripts().join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start node for {script}: {e}"));
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).expect("write to the script");
    }
    child.wait_with_output().expect("wait for node")
}

/// `run`, which must succeed; returns stdout. Panics with the script's
/// output otherwise, so a failed check fails the test in its own words.
pub fn check_with(script: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = run(script, args, stdin);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "independent check {script} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
