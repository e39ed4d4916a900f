//! What one listener tolerates from its clients: constants, not config, as
//! courier's clients are local apps and probes, so one set of values fits.

use std::time::Duration;

/// The limits of one listener (ingress or admin).
#[derive(Debug, Clone, Copy)]
pub struct Edge {
    /// Names the listener in metrics and logs.
    pub name: &'static str,
    /// Connections holding a slot at once. One more is still served, for a
    /// moment and one request, but only on these paths: every other
    /// request on it is answered 503 (see `server::beyond_cap`).
    pub max_connections: usize,
    /// The paths served beyond `max_connections`.
    pub served_beyond_cap: &'static [&'static str],
}

impl Edge {
    /// Ingress: the app's connections. 10,000 is far above any pool a
    /// sidecar's app keeps, and below the usual 65,536 file descriptors.
    pub const INGRESS: Edge = Edge {
        name: "ingress",
        max_connections: 10_000,
        served_beyond_cap: &[],
    };
    /// Admin: probes, scrapes and operators; a few dozen at most. The
    /// probes and the scrape answer beyond the cap: a liveness probe that
    /// got 503 because something else holds the connections would have
    /// kubelet restart a healthy courier.
    pub const ADMIN: Edge = Edge {
        name: "admin",
        max_connections: 256,
        served_beyond_cap: &["/healthz", "/readyz", "/metrics"],
    };
}

/// The time a connection may go without a request being handled, from the
/// moment it is open or its previous answer was made: then it is closed.
/// Whatever the client does meanwhile (nothing, a slow HTTP/1 head, the
/// first bytes of the h2c preface, HTTP/2 frames that open no stream), a
/// connection that asks nothing holds its slot this long at most. In
/// hyper's HTTP/1 this is also the header-read timeout; the accept loop's
/// idle watch (`server::idle`) enforces it for every protocol. 10 s is long
/// for a local client, and at least the 5 s idle timeout that Node and
/// Apache use, so pools with those defaults rarely race a close.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection closed for idleness gets to take its close: HTTP/2
/// sends GOAWAY and waits for the client's PING answer, which a client that
/// is gone never sends.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The whole life of a connection beyond `max_connections`: enough for a
/// probe or a scrape (kubelet's probe timeout is 1 s by default), too short
/// to hold anything.
pub const BEYOND_CAP_DEADLINE: Duration = Duration::from_secs(2);

/// The time ingress gives a whole request body, from when it starts reading
/// it. A whole deadline, not a per-read one: a body trickling a byte at a
/// time must not hold the connection. 10 s carries `ingress.max_body_bytes`
/// many times over on loopback.
pub const BODY_DEADLINE: Duration = Duration::from_secs(10);

/// Connections the kernel queues for a listener until courier accepts
/// them. The default of tokio (mio) and std, 128, was passed by a burst of
/// apps connecting at once, and the kernel reset connections beyond it;
/// the kernel caps it at `net.core.somaxconn` (4096 by default).
pub const BACKLOG: u32 = 1024;

/// `Retry-After` of the 503 given beyond `max_connections`.
pub const RETRY_AFTER_FULL: u32 = 1;
