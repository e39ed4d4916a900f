//! A bucket is not a friend (issue #43; docs/object-storage.md): what an
//! adopter reads from a hand-off store is checked as ingress checks a
//! request, on a real S3 (`moto_server`) with real couriers. A full journal
//! never makes an adopter append an object twice; odd keys, junk and
//! oversized objects neither stop nor delay a real hand-off; sealed objects
//! are unreadable and unforgeable without the key.

use super::handoff::{
    BUCKET, KEY, KEY_ENV, PROMPT, all_delivered, config, endpoint, post_many, sealed, start,
    start_env, twice,
};
use courier::event::NewEvent;
use courier::fuzzing::{HandoffBuilder, handoff_sealed};
use courier::journal::Carried;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::stores::{Moto, keys_at, put_files, put_object};
use support::{Receiver, Reply, behavior, check, check_eq, proc_status};

/// A name as a courier gives an object, sorting before any courier's.
fn early_name(i: usize, events: usize) -> String {
    format!("{i:032x}-{events}.cho")
}

fn event(id: &str, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> NewEvent {
    NewEvent {
        id: id.into(),
        destination: "orders".into(),
        method: method.into(),
        path: path.into(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect(),
        body: body.into(),
        accepted_ms: courier::clock::now_ms(),
    }
}

fn fresh() -> Carried {
    Carried {
        attempts: 0,
        next_due_ms: courier::clock::now_ms(),
        last_outcome: None,
        last_status: None,
        last_attempt_ms: None,
        batch: None,
        fate: None,
    }
}

/// A correctly framed hand-off object of `events`.
fn object(events: &[NewEvent]) -> Vec<u8> {
    let mut b = HandoffBuilder::default();
    for e in events {
        b.push(e, &fresh());
    }
    b.finish()
}

/// A courier's config for adopting only: its destination at `url`.
fn adopter(url: &str, extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\n\
         admin_listen: 127.0.0.1:0\n\
         log: {{ level: debug }}\n\
         journal: {{ dir: ./journal }}\n\
         {extra}\
         handoff: {{ url: s3://{BUCKET}/handoff, poll: 200ms, claim_timeout: 5s }}\n\
         destinations:\n  \
           orders: {{ url: {url}, retry: {{ schedule: [1s] }} }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopter_with_a_full_journal_delivers_every_event_exactly_once_and_takes_over_nothing() {
    let _alone = support::alone().await;
    const EVENTS: usize = 15_000;
    let moto = Moto::start(BUCKET).await;
    let (rx, accept, seen) = endpoint().await;
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    // A's endpoint refuses: every event is pending at SIGTERM, in several
    // objects of about 2,700 events.
    let yaml_a = config(&rx, "5s", "5s").replace("poll: 200ms", "poll: 500ms");
    let mut a = start(dir_a.path(), &yaml_a, &moto.endpoint()).await;
    post_many(&a, EVENTS, 150).await;
    a.terminate_handing_off().await;
    let objects = keys_at(&moto.endpoint(), BUCKET, "handoff/pending/");
    check!(a, objects.len() >= 4, "several objects: {}", objects.len());
    // B's journal holds about a third of them: it fills, drains and goes on.
    accept.store(true, Ordering::SeqCst);
    let yaml_b = yaml_a.replace(
        "journal: { dir: ./journal }",
        "journal: { dir: ./journal, max_bytes: 1MiB }",
    );
    let b = start(dir_b.path(), &yaml_b, &moto.endpoint()).await;
    all_delivered(&[&b], &seen, EVENTS).await;
    // Whatever was to come twice has come by now: B's looks go on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    check_eq!(b, twice(&seen), 0, "events delivered twice");
    let logs = b.logs();
    check!(
        b,
        !logs.contains("taking it over"),
        "B took over a claim while it lived"
    );
    check!(
        b,
        logs.contains("the journal cannot take a hand-off's events now"),
        "the test tested nothing: B's journal never filled"
    );
    let left = keys_at(&moto.endpoint(), BUCKET, "handoff/pending/");
    check!(b, left.is_empty(), "{} objects left", left.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_object_reaches_no_other_host_and_each_bad_event_is_set_aside_with_its_reason() {
    let moto = Moto::start(BUCKET).await;
    let rx = Receiver::ok().await;
    let other = Receiver::ok().await;
    let steal = format!("@{}/steal", other.addr());
    let big = vec![b'x'; 2048];
    let events = vec![
        event("authority", "POST", &steal, &[], b"{}".to_vec()),
        event(
            "host",
            "POST",
            "/x",
            &[("host", "evil.example")],
            b"{}".to_vec(),
        ),
        event("delete", "DELETE", "/x", &[], b"{}".to_vec()),
        event("climb", "POST", "/../../admin", &[], b"{}".to_vec()),
        event("big", "POST", "/x", &[], big),
        event(
            "good",
            "POST",
            "/fine?q=1",
            &[("x-tenant", "acme")],
            b"{}".to_vec(),
        ),
    ];
    let name = early_name(7, events.len());
    put_object(
        &moto.endpoint(),
        BUCKET,
        &format!("handoff/pending/{name}"),
        &object(&events),
    );
    let dir = tempfile::tempdir().expect("dir");
    // No path in the url: a path not starting with `/` would have been
    // read as part of the authority when joined as text.
    let url = format!("http://{}", rx.addr());
    let yaml = adopter(&url, "ingress: { max_body_bytes: 1KiB }\n");
    let b = start(dir.path(), &yaml, &moto.endpoint()).await;
    let got = rx.wait_for(1, PROMPT).await;
    b.wait_for_log("adopted a hand-off", PROMPT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_eq!(
        b,
        other.count(),
        0,
        "a request reached another host or port"
    );
    check_eq!(b, rx.count(), 1, "only the good event is delivered");
    check_eq!(b, got[0].path_and_query.as_str(), "/fine?q=1");
    check_eq!(b, got[0].method.as_str(), "POST");
    let logs = b.logs();
    for (id, reason) in [
        ("authority", "path"),
        ("host", "header"),
        ("delete", "method"),
        ("climb", "path"),
        ("big", "too_large"),
    ] {
        check!(
            b,
            logs.lines().any(|l| l.contains("set aside, not delivered")
                && l.contains(&format!("id={id}"))
                && l.contains(&format!("reason=\"{reason}\""))),
            "event {id} set aside with reason {reason}"
        );
    }
    let aside = keys_at(&moto.endpoint(), BUCKET, "handoff/damaged/");
    check_eq!(
        b,
        aside.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        [format!("handoff/damaged/{name}")],
        "the refused events are kept for an operator"
    );
    let counted = support::metric(
        &b.admin_url(),
        r#"courier_handoff_events_total{direction="set_aside"}"#,
    )
    .await;
    check_eq!(b, counted, Some(5.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_beside_a_hand_off_neither_stop_nor_delay_it() {
    let moto = Moto::start(BUCKET).await;
    let rx = Receiver::ok().await;
    let odd = [
        "handoff/pending/../x.cho",
        "handoff/pending//x.cho",
        "handoff/pending/a/../../b.cho",
        "handoff/pending/notes.txt",
        "handoff/pending/deeper/0-1.cho",
    ];
    for key in odd {
        put_object(&moto.endpoint(), BUCKET, key, b"junk");
    }
    let name = early_name(9, 1);
    let good = [event("good", "POST", "/x", &[], b"{}".to_vec())];
    put_object(
        &moto.endpoint(),
        BUCKET,
        &format!("handoff/pending/{name}"),
        &object(&good),
    );
    let dir = tempfile::tempdir().expect("dir");
    let b = start(dir.path(), &adopter(&rx.url(), ""), &moto.endpoint()).await;
    // The first look adopts it: well within one poll of the start.
    rx.wait_for(1, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let logs = b.logs();
    let warned = logs
        .lines()
        .filter(|l| l.contains("that is not a hand-off"))
        .count();
    check_eq!(
        b,
        warned,
        odd.len(),
        "one warning per odd key, however many looks"
    );
    check_eq!(b, rx.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_named_to_sort_first_does_not_keep_a_hand_off_waiting() {
    let _alone = support::alone().await;
    const JUNK: usize = 2000;
    let moto = Moto::start(BUCKET).await;
    let rx = Receiver::ok().await;
    let files = tempfile::tempdir().expect("files");
    let junk = files.path().join("junk");
    std::fs::write(&junk, b"abc").expect("junk");
    let mut manifest: Vec<(String, std::path::PathBuf)> = (0..JUNK)
        .map(|i| {
            (
                format!("handoff/pending/{}", early_name(i, 1)),
                junk.clone(),
            )
        })
        .collect();
    let good = files.path().join("good");
    std::fs::write(
        &good,
        object(&[event("good", "POST", "/x", &[], b"{}".to_vec())]),
    )
    .expect("good");
    manifest.push((format!("handoff/pending/{}", early_name(JUNK + 1, 1)), good));
    put_files(&moto.endpoint(), BUCKET, &manifest);
    let dir = tempfile::tempdir().expect("dir");
    let started = tokio::time::Instant::now();
    let b = start(dir.path(), &adopter(&rx.url(), ""), &moto.endpoint()).await;
    rx.wait_for(1, Duration::from_secs(30)).await;
    let took = started.elapsed();
    eprintln!(
        "the valid hand-off was delivered {took:?} after the adopter started, beside {JUNK} junk objects"
    );
    check!(b, took < Duration::from_secs(30), "{took:?}");
    // The junk goes aside too, unread, after it: measured, not waited for
    // whole (moto takes a few dozen such moves a second).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let moved = keys_at(&moto.endpoint(), BUCKET, "handoff/damaged/").len();
    eprintln!(
        "{moved} junk objects set aside {:?} after the start",
        started.elapsed()
    );
    check!(b, moved >= 50, "junk is set aside as it is found: {moved}");
    check_eq!(b, rx.count(), 1, "nothing of the junk is delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_object_is_set_aside_unread_and_one_at_the_body_limit_is_adopted_within_the_memory_bound()
 {
    let _alone = support::alone().await;
    const LIMIT: usize = 16 << 20;
    let moto = Moto::start(BUCKET).await;
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let rx = Receiver::start(behavior(move |req, _| {
        kept.lock().expect("bodies").push(req.body.len());
        Reply::status(200)
    }))
    .await;
    let files = tempfile::tempdir().expect("files");
    let huge = files.path().join("huge");
    {
        // 300 MiB of junk, written without holding it.
        let f = std::fs::File::create(&huge).expect("huge");
        f.set_len(300 << 20).expect("size");
    }
    let at_limit = files.path().join("at-limit");
    let one = [event("big", "POST", "/x", &[], vec![b'y'; LIMIT])];
    std::fs::write(&at_limit, object(&one)).expect("at limit");
    let (huge_name, big_name) = (early_name(1, 5), early_name(2, 1));
    put_files(
        &moto.endpoint(),
        BUCKET,
        &[
            (format!("handoff/pending/{huge_name}"), huge),
            (format!("handoff/pending/{big_name}"), at_limit),
        ],
    );
    let dir = tempfile::tempdir().expect("dir");
    let yaml = adopter(&rx.url(), "ingress: { max_body_bytes: 16MiB }\n");
    let b = start(dir.path(), &yaml, &moto.endpoint()).await;
    rx.wait_for(1, PROMPT).await;
    b.wait_for_log("moved aside for an operator", PROMPT).await;
    check_eq!(b, bodies.lock().expect("bodies").clone(), [LIMIT]);
    let peak = proc_status(b.pid(), "VmHWM").unwrap_or(u64::MAX) / 1024;
    eprintln!(
        "adopter peak RSS: {peak} MiB (one object of {} MiB read, one of 300 MiB not)",
        LIMIT >> 20
    );
    // The bound (docs/object-storage.md): courier's own size (under 32
    // MiB) and five copies of the largest event it takes: the object read,
    // its decoded events, the journal's write, the attempt's read and its
    // request (measured 87 to 103 MiB here, on a busy machine).
    let bound = 32 + 5 * (LIMIT >> 20) as u64;
    check!(b, peak <= bound, "peak RSS {peak} MiB > {bound} MiB");
    let aside = keys_at(&moto.endpoint(), BUCKET, "handoff/damaged/");
    check_eq!(
        b,
        aside,
        [(format!("handoff/damaged/{huge_name}"), 300 << 20)],
        "set aside whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_hand_offs_are_adopted_with_the_key_and_set_aside_without_it() {
    let moto = Moto::start(BUCKET).await;
    let (rx, accept, seen) = endpoint().await;
    accept.store(true, Ordering::SeqCst);
    let good = [event(
        "sealed-good",
        "POST",
        "/x",
        &[],
        b"{\"secret\":1}".to_vec(),
    )];
    let other_key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let (n1, n2, n3, n4) = (
        early_name(1, 1),
        early_name(2, 1),
        early_name(3, 1),
        early_name(4, 1),
    );
    let with_key = handoff_sealed(KEY, &n1, object(&good)).expect("sealed");
    let with_other = handoff_sealed(other_key, &n2, object(&good)).expect("sealed");
    let mut flipped = handoff_sealed(KEY, &n3, object(&good)).expect("sealed");
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    let plain = object(&good);
    for (name, bytes) in [
        (&n1, with_key),
        (&n2, with_other),
        (&n3, flipped),
        (&n4, plain),
    ] {
        put_object(
            &moto.endpoint(),
            BUCKET,
            &format!("handoff/pending/{name}"),
            &bytes,
        );
    }
    let dir = tempfile::tempdir().expect("dir");
    let yaml = sealed(&config(&rx, "1s", "5s"));
    let b = start_env(dir.path(), &yaml, &moto.endpoint(), &[(KEY_ENV, KEY)]).await;
    all_delivered(&[&b], &seen, 1).await;
    b.wait_for_log("adopted a hand-off", PROMPT).await;
    let deadline = tokio::time::Instant::now() + PROMPT;
    // Bounded by the deadline: the three others go aside.
    while keys_at(&moto.endpoint(), BUCKET, "handoff/damaged/").len() < 3 {
        check!(
            b,
            tokio::time::Instant::now() < deadline,
            "not all set aside"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_eq!(
        b,
        seen.lock().expect("seen").delivered.len(),
        1,
        "only the object sealed with the key is delivered"
    );
    let logs = b.logs();
    for why in [
        "a key this courier does not have",
        "fails authentication",
        "it is not encrypted",
    ] {
        check!(b, logs.contains(why), "said: {why}");
    }
    // A courier without the key sets a sealed object aside, and says why.
    drop(b);
    let lone = early_name(5, 1);
    let other = [event("sealed-lone", "POST", "/x", &[], b"{}".to_vec())];
    let sealed_obj = handoff_sealed(KEY, &lone, object(&other)).expect("sealed");
    put_object(
        &moto.endpoint(),
        BUCKET,
        &format!("handoff/pending/{lone}"),
        &sealed_obj,
    );
    let dir2 = tempfile::tempdir().expect("dir");
    let c = start(dir2.path(), &config(&rx, "1s", "5s"), &moto.endpoint()).await;
    c.wait_for_log("this courier has no handoff.encryption_key_env", PROMPT)
        .await;
    check_eq!(c, seen.lock().expect("seen").delivered.len(), 1);
}
