//! Dead-letter records are safe at rest (issue #12, item 3, in part):
//! files are created `0600`, and the value of a header configured with
//! `secret: true` is in no record (configured headers are added to each
//! attempt, never stored with the event).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, dl_dir, files_under, post,
    wait_dead_letters,
};

const SECRET: &str = "sekrit-7c1f-at-rest";

#[tokio::test]
async fn dead_letter_files_are_0600_and_hold_no_secret_header_value() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = config(
        "orders",
        &rx.url(),
        &format!("headers: {{ X-Api-Key: {{ value: {SECRET}, secret: true }} }}"),
    );
    let c = Courier::start(dir.path(), &yaml).await;
    for i in 0..3 {
        let resp = post(&c.url("orders"), format!("{{\"n\":{i}}}"), &[]).await;
        check_eq!(c, resp.status, 202, "{}", resp.text());
    }
    let (_, records) = wait_dead_letters(&c, "orders", 3, Duration::from_secs(10)).await;
    check_eq!(c, records.len(), 3);
    // The receiver saw the secret: it was sent, and only there.
    let sent = rx.received();
    check!(
        c,
        sent.iter().all(|r| r.header("x-api-key") == Some(SECRET)),
        "the configured header was not sent"
    );
    let files = files_under(&dl_dir(&c, "orders"));
    check!(c, !files.is_empty(), "no dead-letter file");
    for file in files {
        let mode = std::fs::metadata(&file).expect("stat").permissions().mode() & 0o777;
        check_eq!(c, mode, 0o600, "mode of {}", file.display());
        let text = std::fs::read_to_string(&file).expect("read");
        check!(
            c,
            !text.contains(SECRET),
            "{} holds the secret header value",
            file.display()
        );
    }
}
