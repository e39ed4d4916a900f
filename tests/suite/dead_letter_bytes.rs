//! Dead-letter records keep header values byte for byte, including values
//! that are not UTF-8, so that a replay can rebuild the request.

use base64::Engine;
use std::time::Duration;
use support::{
    Courier, Receiver, Reply, behavior, check, check_eq, config, fail, wait_dead_letters,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_header_value_that_is_not_utf8_is_dead_lettered_byte_for_byte() {
    let rx = Receiver::start(behavior(|_, _| Reply::status(400))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Courier::start(dir.path(), &config("hooks", &rx.url(), "")).await;
    // A raw request: HTTP allows any octet above 0x7f in a value (obs-text),
    // which typed clients refuse to send.
    let value: &[u8] = b"a\xff\xfeb";
    let body = br#"{"n":1}"#;
    let mut request = format!(
        "POST /hooks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nX-Opaque: ",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(value);
    request.extend_from_slice(b"\r\nX-Text: caf\xc3\xa9\r\n\r\n");
    request.extend_from_slice(body);
    let mut stream = tokio::net::TcpStream::connect(c.ingress_addr())
        .await
        .expect("connect");
    stream.write_all(&request).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| fail!(c, "no answer within 10s"))
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    check!(c, answer.starts_with("HTTP/1.1 202"), "{answer}");

    let (_, records) = wait_dead_letters(&c, "hooks", 1, Duration::from_secs(10)).await;
    check_eq!(c, records.len(), 1);
    let headers = &records[0]["headers"];
    let encoded = headers["x-opaque"]["base64"]
        .as_str()
        .unwrap_or_else(|| fail!(c, "x-opaque is not {{\"base64\": ...}}: {headers}"));
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_else(|e| fail!(c, "not base64 ({e}): {encoded}"));
    check_eq!(c, decoded, value);
    check_eq!(c, headers["x-text"], "café", "a UTF-8 value stays a string");
    // The receiver got the same bytes the record keeps.
    let got = rx.received();
    let sent = got
        .first()
        .and_then(|r| r.headers.get("x-opaque"))
        .map(|v| v.as_bytes().to_vec());
    check_eq!(c, sent.as_deref(), Some(value));
}
