//! What one listener tolerates from its clients: constants, not config, as
//! courier's clients are local apps and probes, so one set of values fits.

use std::time::Duration;

/// The limits of one listener (ingress or admin).
#[derive(Debug, Clone, Copy)]
pub struct Edge {
    /// Names the listener in metrics and logs.
    pub name: &'static str,
    /// Connections open at once; the next one is answered 503 and closed.
    pub max_connections: usize,
}

impl Edge {
    /// Ingress: the app's connections. 10,000 is far above any pool a
    /// sidecar's app keeps, and below the usual 65,536 file descriptors.
    pub const INGRESS: Edge = Edge {
        name: "ingress",
        max_connections: 10_000,
    };
    /// Admin: probes, scrapes and operators; a few dozen at most.
    pub const ADMIN: Edge = Edge {
        name: "admin",
        max_connections: 256,
    };
}

/// The time a client has to send a whole request head, from the moment the
/// connection is open or its previous answer was written. In hyper this one
/// timer is both the header-read timeout (a slowloris client is cut off) and
/// the keep-alive idle timeout (an idle connection is closed). 10 s is long
/// for a local client, and at least the 5 s idle timeout that Node and Apache
/// use, so pools with those defaults rarely race a close.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

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
