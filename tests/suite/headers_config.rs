//! Config errors and masking for custom headers and signing, through the
//! real binary (docs/cli.md `check`, docs/configuration.md `headers` and `signing`): limits with
//! `file:line:column`, secrets from the environment (missing: an error for
//! `run`, a warning for `check`; malformed: an error naming the variable,
//! never its value), and an effective config without any secret in it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{CliOutput, courier_bin, run_cli};

/// A signing secret (the Standard Webhooks documentation's example key).
const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("c.yaml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

fn s(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

fn yaml(dest_lines: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\njournal: {{ dir: ./journal }}\ndestinations:\n  orders:\n    url: http://127.0.0.1:9/hooks\n{dest_lines}"
    )
}

/// `courier <cmd> -c FILE` with exactly `env` (plus the process's own
/// environment minus the variables these tests use), in the file's folder,
/// bounded in time.
async fn courier(cmd: &str, path: &Path, env: &[(&str, &str)]) -> CliOutput {
    let mut c = tokio::process::Command::new(courier_bin());
    c.args([cmd, "-c", s(path)])
        .current_dir(path.parent().expect("a folder"))
        .kill_on_drop(true);
    for var in [
        "ORDERS_WHSEC",
        "NEXT_WHSEC",
        "ORDERS_API_KEY",
        "RUST_LOG",
        "COURIER_CONFIG",
    ] {
        c.env_remove(var);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(20), c.output())
        .await
        .expect("courier exits within 20 s")
        .expect("run courier");
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The one error line, which must start with `FILE:line:col: `.
fn error_at(out: &CliOutput, path: &Path, line: usize, col: usize) -> String {
    assert_eq!(out.code, 1, "{}", out.show());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.show());
    let prefix = format!("{}:{line}:{col}: ", path.display());
    let rest = lines[0]
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("expected {prefix:?} at the start:\n{}", out.show()));
    rest.to_string()
}

#[tokio::test]
async fn eleven_headers_are_refused_with_the_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let headers: String = (1..=11)
        .map(|i| format!("      X-H{i}: {{ value: v }}\n"))
        .collect();
    let path = write(dir.path(), &yaml(&format!("    headers:\n{headers}")));
    let out = courier("check", &path, &[]).await;
    let e = error_at(&out, &path, 8, 7);
    assert_eq!(
        e,
        "destinations.orders.headers: 11 headers: at most 10 are allowed"
    );
}

#[tokio::test]
async fn a_4097_byte_value_is_refused_and_4096_is_fine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        &yaml(&format!(
            "    headers:\n      X-Big: {{ value: {} }}\n",
            "a".repeat(4097)
        )),
    );
    let out = courier("check", &path, &[]).await;
    let e = error_at(&out, &path, 8, 14);
    assert_eq!(
        e,
        "destinations.orders.headers.X-Big: value is 4097 bytes: at most 4096 are allowed"
    );

    let path = write(
        dir.path(),
        &yaml(&format!(
            "    headers:\n      X-Big: {{ value: {} }}\n",
            "a".repeat(4096)
        )),
    );
    let out = courier("check", &path, &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());

    // From the environment: checked when `run` reads it; the value is not shown.
    let path = write(
        dir.path(),
        &yaml("    headers:\n      X-Api-Key: { from_env: ORDERS_API_KEY, secret: true }\n"),
    );
    let big = "k".repeat(4097);
    let out = courier("run", &path, &[("ORDERS_API_KEY", &big)]).await;
    let e = error_at(&out, &path, 8, 30);
    assert_eq!(
        e,
        "destinations.orders.headers.X-Api-Key.from_env: value of environment variable ORDERS_API_KEY is 4097 bytes: at most 4096 are allowed"
    );
    assert!(!out.stderr.contains(&big[..64]), "{}", out.show());
}

#[tokio::test]
async fn a_bad_from_event_path_is_a_config_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        &yaml("    headers:\n      X-Tenant: { from_event: data..tenant }\n"),
    );
    let out = courier("check", &path, &[]).await;
    let e = error_at(&out, &path, 8, 31);
    assert!(
        e.starts_with(
            "destinations.orders.headers.X-Tenant.from_event: `data..tenant` has an empty segment"
        ),
        "{}",
        out.show()
    );
}

#[tokio::test]
async fn a_missing_signing_secret_stops_run_but_only_warns_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        &yaml("    signing:\n      secrets_from_env: [ORDERS_WHSEC]\n"),
    );
    let out = courier("run", &path, &[]).await;
    let e = error_at(&out, &path, 8, 26);
    assert_eq!(
        e,
        "destinations.orders.signing.secrets_from_env[0]: environment variable ORDERS_WHSEC is not set"
    );
    assert!(
        !dir.path().join("journal").exists(),
        "run must stop before opening the journal"
    );

    let out = courier("check", &path, &[]).await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert!(
        out.stderr
            .starts_with(&format!("warning: {}:8:26: ", path.display()))
            && out.stderr.contains("ORDERS_WHSEC is not set"),
        "{}",
        out.show()
    );
}

#[tokio::test]
async fn a_signing_secret_that_is_not_base64_is_named_but_not_shown() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        &yaml("    signing:\n      secrets_from_env: [ORDERS_WHSEC, NEXT_WHSEC]\n"),
    );
    let bad = "whsec_s3cr3t!not-base64";
    for cmd in ["check", "run"] {
        let out = courier(cmd, &path, &[("ORDERS_WHSEC", WHSEC), ("NEXT_WHSEC", bad)]).await;
        let e = error_at(&out, &path, 8, 40);
        assert_eq!(
            e,
            "destinations.orders.signing.secrets_from_env[1]: environment variable NEXT_WHSEC is not valid base64 after the optional whsec_ prefix",
            "{cmd}"
        );
        assert!(
            !out.stderr.contains("s3cr3t") && !out.stdout.contains("s3cr3t"),
            "{}",
            out.show()
        );
    }
}

#[tokio::test]
async fn too_many_signing_secrets_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        &yaml("    signing: { secrets_from_env: [A, B, C, D] }\n"),
    );
    let out = courier("check", &path, &[]).await;
    assert_eq!(out.code, 1, "{}", out.show());
    assert!(
        out.stderr.contains(
            "destinations.orders.signing.secrets_from_env: 4 secrets is out of range: allowed 1..=3"
        ),
        "{}",
        out.show()
    );
}

#[tokio::test]
async fn check_shows_variable_names_and_masks_every_secret() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        &yaml(
            "    headers:\n      X-Api-Key: { from_env: ORDERS_API_KEY, secret: true }\n      X-Literal: { value: hunter2-literal, secret: true }\n      X-Subject: { from_event: subject }\n    signing:\n      secrets_from_env: [ORDERS_WHSEC]\n",
        ),
    );
    let out = courier(
        "check",
        &path,
        &[("ORDERS_WHSEC", WHSEC), ("ORDERS_API_KEY", "api-key-4711")],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert_eq!(out.stderr, "", "no warning with every variable set");
    let effective: serde_norway::Value =
        serde_norway::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}\n{}", out.show()));
    let d = &effective["destinations"]["orders"];
    assert_eq!(
        d["signing"]["secrets_from_env"][0].as_str(),
        Some("ORDERS_WHSEC"),
        "{}",
        out.show()
    );
    assert_eq!(
        d["headers"]["X-Api-Key"]["from_env"].as_str(),
        Some("ORDERS_API_KEY")
    );
    assert_eq!(
        d["headers"]["X-Literal"]["value"].as_str(),
        Some("********")
    );
    assert_eq!(
        d["headers"]["X-Subject"]["from_event"].as_str(),
        Some("subject")
    );
    for secret in [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "api-key-4711",
        "hunter2-literal",
    ] {
        assert!(
            !out.stdout.contains(secret) && !out.stderr.contains(secret),
            "{secret} printed:\n{}",
            out.show()
        );
    }
}

#[tokio::test]
async fn the_example_config_checks_with_its_documented_environment() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.yaml");
    let out = run_cli(
        None,
        &["check", "-c", s(&path)],
        &[("ORDERS_API_KEY", "dev")],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.show());
    assert_eq!(
        out.stderr,
        "",
        "the README's environment is enough:\n{}",
        out.show()
    );
}
