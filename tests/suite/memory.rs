//! Memory held for bodies is bounded (README "Memory"). Delivery: a
//! backlog of large events is read ahead by bytes, not four events per slot
//! whatever their size.

use std::time::Duration;
use support::{Courier, Receiver, Reply, behavior, check, check_eq, fail, json_body, proc_status};

/// The delivery ends within this.
const WAIT: Duration = Duration::from_secs(20);

/// Waiting events in the backlog test, their size, and the destination's
/// `concurrency`: more than four events per slot wait, so that a read-ahead
/// counted in events alone would hold 128 MiB of them.
const WAITING: usize = 400;
const WAITING_BODY: usize = 512 << 10;
const SLOTS: u64 = 64;
/// The delivery's own peak (from just before the resume): what the
/// process kept from the posts (~30 MiB), 64 attempts of 512 KiB, the
/// ready queue and the read-ahead (4 MiB each), hyper's buffers, with room
/// for a loaded machine (90–96 MiB seen). Reading ahead four events per
/// slot held up to 128 MiB more (176–191 MiB seen).
const DELIVERY_RSS_KIB: u64 = 140 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_large_events_is_read_ahead_by_bytes() {
    let rx = Receiver::start(behavior(|_, _| {
        Reply::status(200).delay(Duration::from_millis(300))
    }))
    .await;
    rx.set_recording(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = format!("concurrency: {SLOTS}");
    let yaml = support::config("orders", &format!("{}/hooks", rx.url()), &dest)
        .replace("level: debug", "level: info");
    let c = Courier::start(dir.path(), &yaml).await;
    // Paused, so that the events wait in the index; resumed, the
    // dispatcher reads them ahead while the slow endpoint takes 64 at a time.
    let admin = |verb: &str| format!("{}/v1/destinations/orders/{verb}", c.admin_url());
    let r = support::admin_post(&admin("pause"), "", &[]).await;
    check!(c, r.status < 300, "pause: {} {}", r.status, r.text());
    let body = json_body(WAITING_BODY, 0);
    for i in 0..WAITING {
        let id = format!("wait-{i}");
        let r = support::post(&c.url("orders"), body.clone(), &[("idempotency-key", &id)]).await;
        check_eq!(c, r.status, 202, "{id}: {}", r.text());
    }
    support::wait_metric(
        &c,
        "courier_events_pending{destination=\"orders\"}",
        WAITING as f64,
        WAIT,
    )
    .await;
    // The peak of the delivery alone, not of the posts before it.
    support::reset_peak_rss(c.pid()).expect("reset VmHWM");
    let r = support::admin_post(&admin("resume"), "", &[]).await;
    check!(c, r.status < 300, "resume: {} {}", r.status, r.text());
    if rx.try_wait_for(WAITING, WAIT).await.is_none() {
        fail!(c, "{} of {WAITING} events delivered", rx.count());
    }
    let peak = proc_status(c.pid(), "VmHWM").expect("VmHWM of a running courier");
    println!("{WAITING} waiting events of {WAITING_BODY} bytes delivered: peak RSS {peak} KiB");
    check!(
        c,
        peak < DELIVERY_RSS_KIB,
        "peak RSS {peak} KiB: more than a few MiB of waiting events were held in memory"
    );
}
