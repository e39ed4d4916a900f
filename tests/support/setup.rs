//! Small pieces the end-to-end tests set up with: a one-destination config,
//! a port that refuses connections, the wall clock in milliseconds.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// A config with one destination `name` at `url`; `extra` is the rest of the
/// destination's keys, one per line, without indentation.
pub fn config(name: &str, url: &str, extra: &str) -> String {
    let mut yaml = format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         log: {{ level: debug }}\n\
         journal: {{ dir: ./journal }}\n\
         dead_letter: {{ dir: ./dl }}\n\
         destinations:\n  \
           {name}:\n    \
             url: {url}\n"
    );
    for line in extra.lines().map(str::trim).filter(|l| !l.is_empty()) {
        yaml.push_str("    ");
        yaml.push_str(line);
        yaml.push('\n');
    }
    yaml
}

/// A loopback port that refuses connections: bound but never listening, so
/// that while the returned socket lives, no other test (a `Receiver` on port
/// 0, in parallel) can be given the same port, as it could after a plain
/// bind-and-drop.
pub fn refusing_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("create socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind a free port");
    let port = socket.local_addr().expect("local addr").port();
    (socket, port)
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}
