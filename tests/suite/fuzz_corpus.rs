//! Replays every committed fuzz seed and crash (`fuzz/seeds/<target>/`)
//! through the same checks as the fuzz targets (`fuzz/src/lib.rs`), so a
//! plain `cargo test` on stable keeps found crashes fixed without libFuzzer.

#[path = "../../fuzz/src/lib.rs"]
mod harness;

use bytes::Bytes;
use courier::event::NewEvent;
use courier::fuzzing::{LogWriter, intake_encode};
use courier::journal::record::encode_headers;
use std::path::{Path, PathBuf};

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).expect("read seed");
            (p, data)
        })
        .collect()
}

/// Runs `check` on every seed of `target`, naming the file that panicked.
fn replay(target: &str, check: impl Fn(&[u8])) {
    for (path, data) in seeds(target) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&data)));
        assert!(r.is_ok(), "{} panicked", path.display());
    }
}

#[test]
fn config_seeds() {
    replay("config", harness::config);
}

#[test]
fn ingress_seeds() {
    replay("ingress", harness::ingress);
}

#[test]
fn retry_after_seeds() {
    replay("retry_after", harness::retry_after);
}

#[test]
fn handoff_object_seeds() {
    replay("handoff_object", harness::handoff_object);
}

#[test]
fn intake_decode_seeds() {
    replay("intake_decode", harness::intake_decode);
}

#[test]
fn headers_seeds() {
    replay("headers", harness::headers);
}

#[test]
fn intake_log_seeds() {
    let tmp = tempfile::tempdir().expect("tempdir");
    replay("intake_log", |data| harness::intake_log(tmp.path(), data));
}

fn event(i: u64, headers: Vec<(String, Vec<u8>)>, body: &'static [u8]) -> NewEvent {
    NewEvent {
        id: format!("evt-{i}"),
        destination: "orders".into(),
        method: "POST".into(),
        path: format!("/v1/orders?i={i}"),
        headers,
        body: Bytes::from_static(body),
        accepted_ms: 1_764_000_000_000 + i,
    }
}

fn sample_events() -> Vec<NewEvent> {
    let json = ("content-type".to_string(), b"application/json".to_vec());
    vec![
        event(1, vec![json.clone()], b"{\"order\":1}"),
        event(
            2,
            vec![
                json.clone(),
                ("x-tenant".into(), b"acme".to_vec()),
                ("x-bin".into(), vec![0, 255, 10]),
            ],
            b"[1,2,3]",
        ),
        event(3, vec![], b""),
        event(4, vec![json], PACKED_BODY),
    ]
}

/// A body the writer packs (journal/pack.rs), so that the seeds hold a
/// packed one.
const PACKED_BODY: &[u8] = br#"{"items":[{"sku":"A-1","qty":1},{"sku":"A-2","qty":1},{"sku":"A-3","qty":1},{"sku":"A-4","qty":1},{"sku":"A-5","qty":1},{"sku":"A-6","qty":1},{"sku":"A-7","qty":1},{"sku":"A-8","qty":1}]}"#;

/// A real segment holding `groups`, as `LogWriter` writes it, cut after its
/// last record (the reader takes the file's size as the segment's).
fn segment(groups: &[&[NewEvent]]) -> Vec<u8> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut w =
        LogWriter::open(tmp.path(), 0, 1, &std::collections::BTreeSet::new()).expect("open");
    let mut end = 0;
    let mut seq = 1;
    for g in groups {
        let mut payload = Vec::new();
        for e in g.iter() {
            intake_encode(&mut payload, seq, e, true);
            seq += 1;
        }
        end = w.append(&payload, g.len() as u32, false).expect("append");
    }
    let mut bytes = std::fs::read(tmp.path().join("intake-0000000000000000.log")).expect("read");
    bytes.truncate(end as usize);
    bytes
}

/// A hand-off object holding `events`, each with a delivery state.
fn handoff_object(events: &[NewEvent]) -> Vec<u8> {
    let mut b = courier::fuzzing::HandoffBuilder::default();
    for (i, e) in events.iter().enumerate() {
        b.push(e, &carried(i as u32));
    }
    b.finish()
}

fn carried(i: u32) -> courier::journal::Carried {
    courier::journal::Carried {
        attempts: i + 1,
        next_due_ms: 1_764_000_100_000,
        last_outcome: Some("Busy".into()),
        last_status: Some(503),
        last_attempt_ms: Some(1_764_000_050_000),
        batch: (i == 1).then(|| "batch-1".to_string()),
        fate: None,
    }
}

/// Writes the journal seeds from the real encoders. Run it after a change
/// to the record formats: `cargo test --test fuzz_corpus -- --ignored`.
#[test]
#[ignore = "regenerates fuzz/seeds; run by hand"]
fn write_journal_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let events = sample_events();
    let put = |target: &str, name: &str, data: &[u8]| {
        std::fs::write(root.join(target).join(name), data).expect("write seed");
    };
    for (i, e) in events.iter().enumerate() {
        put(
            "headers",
            &format!("event-{i}"),
            &encode_headers(&e.headers),
        );
    }
    for (name, group) in [
        ("one", &events[..1]),
        ("three", &events[..3]),
        ("packed", &events[3..]),
    ] {
        let mut data = (group.len() as u32).to_le_bytes().to_vec();
        for (seq, e) in group.iter().enumerate() {
            intake_encode(&mut data, seq as i64 + 1, e, true);
        }
        put("intake_decode", name, &data);
    }
    put("handoff_object", "three", &handoff_object(&events[..3]));
    put("intake_log", "one-record", &segment(&[&events[..1]]));
    put(
        "intake_log",
        "two-records",
        &segment(&[&events[..2], &events[2..]]),
    );
}

/// The committed journal seeds decode to what `write_journal_seeds` wrote:
/// the seeds are real records, not just bytes that happen not to panic.
#[test]
fn journal_seeds_are_real_records() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = |name: &str| -> Vec<NewEvent> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/seeds/intake_log")
            .join(name);
        std::fs::copy(path, tmp.path().join("intake-0000000000000000.log")).expect("copy");
        let mut r = courier::fuzzing::LogReader::new(tmp.path());
        let (mut out, mut at) = (Vec::new(), 0);
        while let courier::fuzzing::Read::Record(events, next) = r.read(at).expect("read") {
            out.extend(events.into_iter().map(|l| l.event));
            at = next;
        }
        out
    };
    assert_eq!(log("two-records"), sample_events());
    assert_eq!(log("one-record"), sample_events()[..1]);
    // Written before records followed each other (each padded to 4 KiB,
    // magic "CRR1"): kept as seeds of the older format, which still reads.
    assert_eq!(log("two-records-padded"), sample_events()[..3]);
    assert_eq!(log("one-record-padded"), sample_events()[..1]);
    let object = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/handoff_object/three"),
    )
    .expect("read the hand-off seed");
    let decoded = courier::fuzzing::handoff_decode(&object).expect("a real hand-off object");
    let expected: Vec<_> = sample_events()[..3]
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, e)| (e, carried(i as u32)))
        .collect();
    assert_eq!(decoded, expected);
    // The intake_decode seed of a packed body holds one.
    let packed = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/intake_decode/packed"),
    )
    .expect("read the packed seed");
    let logged = courier::fuzzing::intake_decode(
        0,
        0,
        &packed[4..],
        1,
        false,
        courier::fuzzing::Packed::Read,
    )
    .expect("decodes");
    assert!(logged[0].packed, "the seed's body is not packed");
    assert_eq!(logged[0].event, sample_events()[3]);
}
