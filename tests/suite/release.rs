//! The release workflow (`.github/workflows/release.yml`, docs/kubernetes.md
//! "Image"), checked offline: actionlint, with ShellCheck on its `run:`
//! scripts (both installed into `./.venv` from `tests/py/requirements.txt`),
//! finds nothing, and the workflow makes what a release must carry. The
//! Dockerfile it builds is linted by hadolint in `.ci/deploy-check`.

use std::path::{Path, PathBuf};
use std::process::Command;

const WORKFLOW: &str = ".github/workflows/release.yml";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A tool of the test checkers' virtualenv, installing them if needed.
fn venv_tool(name: &str) -> PathBuf {
    let tool = support::python::python().with_file_name(name);
    assert!(
        tool.exists(),
        "{} is missing: tests/py/requirements.txt installs it into ./.venv",
        tool.display()
    );
    tool
}

#[test]
fn the_release_workflow_passes_actionlint_with_shellcheck() {
    let out = Command::new(venv_tool("actionlint"))
        .arg("-shellcheck")
        .arg(venv_tool("shellcheck"))
        .arg(WORKFLOW)
        .current_dir(root())
        .output()
        .expect("run actionlint");
    assert!(
        out.status.success(),
        "actionlint {WORKFLOW}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a cluster and a user need from a release, each present: built on
/// a tag, the binary from `cargo build --release --locked` (also inside
/// the image, by the Dockerfile), static and checksummed, an image for
/// both architectures, its SBOM, and cosign signatures.
#[test]
fn the_release_workflow_makes_a_signed_multi_arch_image_and_checksummed_static_binaries() {
    let text = std::fs::read_to_string(root().join(WORKFLOW)).expect("read the workflow");
    for (what, needle) in [
        ("built on a tag", "tags: [\"v*\"]"),
        (
            "the locked release build",
            "cargo build --release --locked --bin courier --target",
        ),
        ("a static binary", "x86_64-unknown-linux-musl"),
        ("for arm64 too", "aarch64-unknown-linux-musl"),
        ("checked static", "statically linked"),
        ("checksummed", "sha256sum"),
        ("an image for amd64", "platform: linux/amd64"),
        ("and arm64", "platform: linux/arm64"),
        ("joined under one tag", "imagetools create"),
        ("an SBOM", "format: spdx-json"),
        ("the image signed", "cosign sign --yes"),
        ("the SBOM attested", "cosign attest --yes --type spdxjson"),
        ("the checksums signed", "cosign sign-blob --yes"),
        ("keyless signing", "id-token: write"),
    ] {
        assert!(text.contains(needle), "{what}: no `{needle}` in {WORKFLOW}");
    }
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).expect("read Dockerfile");
    assert!(
        dockerfile.contains("cargo build --release --locked"),
        "the image's binary is not the locked release build"
    );
}
