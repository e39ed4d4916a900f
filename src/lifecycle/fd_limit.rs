//! The open-file limit. Every pending connection (ingress, outbound pools,
//! admin) and every journal segment is a descriptor, and distributions
//! start processes with a soft limit of 1024 while the hard limit is far
//! higher; like nginx's `worker_rlimit_nofile` or Go's runtime, courier
//! raises the soft limit to the hard one at start.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. A failure only costs
/// headroom, so it is logged and courier goes on.
pub fn raise() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("cannot read the open-file limit: {e}");
        return;
    }
    let (soft, hard) = (limit.rlim_cur, limit.rlim_max);
    if soft >= hard {
        tracing::debug!(soft, hard, "open-file limit already at its hard limit");
        return;
    }
    limit.rlim_cur = hard;
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(soft, hard, "cannot raise the open-file limit: {e}");
        return;
    }
    tracing::info!(
        old = soft,
        new = hard,
        "raised the open-file soft limit to the hard limit"
    );
}
