//! Paging through the sink for the admin API: filters, the opaque cursor,
//! the newest record of an id, and the stream of records a replay of
//! `all` takes, on any [`Shelf`]. Blocking: callers run them off the
//! runtime.
//!
//! A page merges destinations by dead-letter time, newest (or oldest)
//! first; within one destination records come in the order of its files.
//! A page reads only the days and parts it lists from (a bucket's day is
//! listed, and its objects read from the cursor on), never the whole sink.
//! The cursor holds, per destination, the place of the last record listed,
//! so records written while an operator pages never shift a page (newest
//! first) or come at its end (oldest first), and each is listed once, even
//! where two records' times are out of order in a file.

use super::parse::{Record, Summary, parse};
use super::shelf::{Place, Shelf, is_day};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Order {
    Oldest,
    Newest,
}

/// Which records a listing or a replay of `all` takes.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    /// `deadLetterReason`.
    pub reason: Option<String>,
    /// Dead-lettered at or after (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Dead-lettered before.
    pub until_ms: Option<u64>,
}

const DAY_MS: u64 = 86_400_000;

/// Midnight UTC at the start of `day` (`yyyy-mm-dd`).
pub fn day_start_ms(day: &str) -> Option<u64> {
    crate::clock::rfc3339::parse_ms(&format!("{day}T00:00:00Z"))
}

/// When a record was dead-lettered; records from before `deadLetterTime`
/// were, as far as is known, at the start of their file's day.
fn at_ms(r: &Record, day: &str) -> u64 {
    r.dead_lettered_ms()
        .or_else(|| day_start_ms(day))
        .unwrap_or(0)
}

impl Filter {
    /// Whether a day's file can hold a record this filter takes.
    fn day(&self, day: &str) -> bool {
        let Some(start) = day_start_ms(day) else {
            return false;
        };
        self.since_ms.is_none_or(|s| s < start + DAY_MS) && self.until_ms.is_none_or(|u| start < u)
    }

    fn takes(&self, r: &Record, day: &str) -> bool {
        if self
            .reason
            .as_deref()
            .is_some_and(|want| r.reason() != Some(want))
        {
            return false;
        }
        let at = at_ms(r, day);
        self.since_ms.is_none_or(|s| at >= s) && self.until_ms.is_none_or(|u| at < u)
    }
}

/// One destination's sink, as the admin API sees it.
#[derive(Clone)]
pub struct Source {
    pub destination: String,
    pub sink: Arc<dyn Shelf>,
}

/// One record of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub destination: String,
    pub place: Place,
    pub at_ms: u64,
    pub summary: Summary,
    pub replayed: bool,
}

/// Where the next page starts: per destination, after this record.
#[derive(Debug, Clone, PartialEq)]
pub struct Cursor {
    pub order: Order,
    pub after: HashMap<String, Place>,
}

impl Cursor {
    pub fn encode(&self) -> String {
        let mut text = String::from(match self.order {
            Order::Newest => "n",
            Order::Oldest => "o",
        });
        let mut places: Vec<_> = self.after.iter().collect();
        places.sort();
        for (dest, place) in places {
            text.push_str(&format!(
                "\n{}\t{}\t{}\t{dest}",
                place.day, place.part, place.offset
            ));
        }
        URL_SAFE_NO_PAD.encode(text)
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(s).ok()?).ok()?;
        let mut lines = text.split('\n');
        let order = match lines.next()? {
            "n" => Order::Newest,
            "o" => Order::Oldest,
            _ => return None,
        };
        let mut after = HashMap::new();
        for line in lines {
            let mut parts = line.splitn(4, '\t');
            let day = parts.next()?.to_string();
            let part = parts.next()?.to_string();
            let offset = parts.next()?.parse().ok()?;
            let dest = parts.next()?.to_string();
            if !is_day(&day) {
                return None;
            }
            after.insert(dest, Place { day, part, offset });
        }
        Some(Cursor { order, after })
    }
}

pub struct Page {
    pub items: Vec<Item>,
    pub next: Option<Cursor>,
    /// Lines that are not records (damaged by hand, or torn and ended).
    pub unreadable: u64,
}

/// Up to `want` records of one destination after `from`, in `order`.
fn read_one(
    src: &Source,
    filter: &Filter,
    order: Order,
    from: Option<&Place>,
    want: usize,
    unreadable: &mut u64,
) -> std::io::Result<Vec<Item>> {
    let mut items = Vec::new();
    let mut days = src.sink.days(&src.destination)?;
    days.retain(|d| filter.day(d));
    if order == Order::Newest {
        days.reverse();
    }
    for day in days {
        if items.len() >= want {
            break;
        }
        let skip = match (from, order) {
            (Some(p), Order::Oldest) => day < p.day,
            (Some(p), Order::Newest) => day > p.day,
            (None, _) => false,
        };
        if skip {
            continue;
        }
        let mut parts = src.sink.parts(&src.destination, &day)?;
        if order == Order::Newest {
            parts.reverse();
        }
        let replayed = src.sink.replayed(&src.destination, &day)?;
        for (part, _) in parts {
            if items.len() >= want {
                break;
            }
            let here = from.filter(|p| p.day == day);
            let skip = match (here, order) {
                (Some(p), Order::Oldest) => part < p.part,
                (Some(p), Order::Newest) => part > p.part,
                (None, _) => false,
            };
            if skip {
                continue;
            }
            let bound = here.filter(|p| p.part == part).map(|p| p.offset);
            let mut take = |offset: u64, line: &str| -> Option<Item> {
                let Ok(record) = parse(line) else {
                    *unreadable += 1;
                    return None;
                };
                filter.takes(&record, &day).then(|| Item {
                    destination: src.destination.clone(),
                    at_ms: at_ms(&record, &day),
                    replayed: replayed.contains(&(part.clone(), offset)),
                    place: Place {
                        day: day.clone(),
                        part: part.clone(),
                        offset,
                    },
                    summary: record.summary(),
                })
            };
            match order {
                Order::Oldest => {
                    let start = bound.unwrap_or(0);
                    src.sink.lines(
                        &src.destination,
                        &day,
                        &part,
                        start,
                        u64::MAX,
                        &mut |offset, line| {
                            if bound == Some(offset) {
                                return true;
                            }
                            if let Some(item) = take(offset, line) {
                                items.push(item);
                            }
                            items.len() < want
                        },
                    )?;
                }
                Order::Newest => {
                    // A part reads forward: keep the last ones before the bound.
                    let room = want - items.len();
                    let mut last = VecDeque::with_capacity(room);
                    let upto = bound.unwrap_or(u64::MAX);
                    src.sink.lines(
                        &src.destination,
                        &day,
                        &part,
                        0,
                        upto,
                        &mut |offset, line| {
                            if let Some(item) = take(offset, line) {
                                if last.len() == room {
                                    last.pop_front();
                                }
                                last.push_back(item);
                            }
                            true
                        },
                    )?;
                    items.extend(last.into_iter().rev());
                }
            }
        }
    }
    Ok(items)
}

/// Up to `limit` records of `sources` after `after`, merged by time.
pub fn page(
    sources: &[Source],
    filter: &Filter,
    order: Order,
    after: Option<&Cursor>,
    limit: usize,
) -> std::io::Result<Page> {
    let mut unreadable = 0;
    // One more than asked from each: whether there is a next page.
    let want = limit + 1;
    let mut queues: Vec<VecDeque<Item>> = Vec::with_capacity(sources.len());
    for src in sources {
        let from = after.and_then(|c| c.after.get(&src.destination));
        queues.push(read_one(src, filter, order, from, want, &mut unreadable)?.into());
    }
    let available: usize = queues.iter().map(VecDeque::len).sum();
    let mut items = Vec::with_capacity(limit.min(available));
    // Bounded: each round takes one item.
    while items.len() < limit {
        let best = queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.front().map(|item| (i, item.at_ms)))
            .reduce(|a, b| match order {
                Order::Newest if b.1 > a.1 => b,
                Order::Oldest if b.1 < a.1 => b,
                _ => a,
            });
        let Some((i, _)) = best else {
            break;
        };
        if let Some(item) = queues[i].pop_front() {
            items.push(item);
        }
    }
    let next = (available > items.len()).then(|| {
        let mut positions = after.map(|c| c.after.clone()).unwrap_or_default();
        for item in &items {
            positions.insert(item.destination.clone(), item.place.clone());
        }
        Cursor {
            order,
            after: positions,
        }
    });
    Ok(Page {
        items,
        next,
        unreadable,
    })
}

/// A record found by id: its place, line and whether it was replayed.
pub struct Found {
    pub place: Place,
    pub line: String,
    pub replayed: bool,
}

/// The newest record of each of `ids` in `src`.
pub fn find(src: &Source, ids: &HashSet<String>) -> std::io::Result<HashMap<String, Found>> {
    let mut found = HashMap::new();
    // A few ids that every JSON writer spells the same way are looked for
    // as text before a line is parsed (an app's own `id` field, which older
    // records hold, may escape other characters as it likes).
    let plain = |id: &String| {
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@+".contains(&b))
    };
    let texts: Vec<String> = if ids.len() <= 8 && ids.iter().all(plain) {
        ids.iter().map(|id| format!("\"{id}\"")).collect()
    } else {
        Vec::new()
    };
    for day in src.sink.days(&src.destination)? {
        let replayed = src.sink.replayed(&src.destination, &day)?;
        for (part, _) in src.sink.parts(&src.destination, &day)? {
            src.sink.lines(
                &src.destination,
                &day,
                &part,
                0,
                u64::MAX,
                &mut |offset, line| {
                    // Parse only lines that can hold one of the ids.
                    if !texts.is_empty() && !texts.iter().any(|id| line.contains(id.as_str())) {
                        return true;
                    }
                    if let Ok(record) = parse(line)
                        && let Some(id) = record.id().filter(|id| ids.contains(*id))
                    {
                        found.insert(
                            id.to_string(),
                            Found {
                                replayed: replayed.contains(&(part.clone(), offset)),
                                place: Place {
                                    day: day.clone(),
                                    part: part.clone(),
                                    offset,
                                },
                                line: line.to_string(),
                            },
                        );
                    }
                    true
                },
            )?;
        }
    }
    Ok(found)
}

/// Calls `each` with the records of `src` not yet replayed that `filter`
/// takes, oldest first, in chunks of up to `chunk`, until it returns false.
pub fn unreplayed(
    src: &Source,
    filter: &Filter,
    chunk: usize,
    mut each: impl FnMut(Vec<(Place, String)>) -> bool,
) -> std::io::Result<()> {
    let mut batch = Vec::with_capacity(chunk);
    let mut go_on = true;
    // What exists now: records that replays dead-letter again while this
    // runs are past these ends, and wait for the next replay.
    let mut days = Vec::new();
    for day in src.sink.days(&src.destination)? {
        if filter.day(&day) {
            let parts = src.sink.parts(&src.destination, &day)?;
            days.push((day, parts));
        }
    }
    for (day, parts) in days {
        let replayed = src.sink.replayed(&src.destination, &day)?;
        for (part, size) in parts {
            src.sink.lines(
                &src.destination,
                &day,
                &part,
                0,
                size,
                &mut |offset, line| {
                    if replayed.contains(&(part.clone(), offset)) {
                        return true;
                    }
                    if parse(line).is_ok_and(|r| filter.takes(&r, &day)) {
                        let place = Place {
                            day: day.clone(),
                            part: part.clone(),
                            offset,
                        };
                        batch.push((place, line.to_string()));
                        if batch.len() == chunk {
                            go_on = each(std::mem::take(&mut batch));
                        }
                    }
                    go_on
                },
            )?;
            if !go_on {
                return Ok(());
            }
        }
    }
    if !batch.is_empty() {
        each(batch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadletter::{BucketSink, DirSink, Line};

    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Dir,
        Bucket,
    }

    fn shelf(root: &std::path::Path, kind: Kind) -> Arc<dyn Shelf> {
        match kind {
            Kind::Dir => Arc::new(DirSink::new(root.to_path_buf())),
            Kind::Bucket => {
                let url = format!("file://{}", root.display());
                let url = crate::storage::StoreUrl::parse(&url).expect("url");
                Arc::new(BucketSink::new(
                    crate::storage::Bucket::open(&url).expect("open"),
                ))
            }
        }
    }

    /// Runs `test` on a directory sink and on a bucket sink (a local
    /// store: all of the bucket sink's code but the store's), on a
    /// blocking thread of a runtime, as the admin API runs them.
    fn on_both(test: fn(Kind, &std::path::Path)) {
        for kind in [Kind::Dir, Kind::Bucket] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().to_path_buf();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(rt.spawn_blocking(move || test(kind, &root)))
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
    }

    fn write(sink: &dyn Shelf, dest: &str, day: &str, texts: &[String]) {
        let lines: Vec<Line> = texts.iter().map(|t| Line::bare(t)).collect();
        let refs: Vec<&Line> = lines.iter().collect();
        sink.write(dest, day, &refs).expect("write");
    }

    /// Two destinations over three days: 5 + 7 records, reasons
    /// alternating; written two at a time (a bucket's day in parts).
    fn sources(root: &std::path::Path, kind: Kind) -> Vec<Source> {
        let sink = shelf(root, kind);
        let mut n = 0;
        for (dest, days) in [("a", [2, 0, 3]), ("b", [1, 4, 2])] {
            for (d, count) in days.into_iter().enumerate() {
                let day = format!("2026-11-2{d}");
                let lines: Vec<String> = (0..count)
                    .map(|_| {
                        n += 1;
                        let reason = if n % 2 == 0 { "TimeToLiveExceeded" } else { "NonRetriableStatus" };
                        format!(r#"{{"id":"e{n}","deadLetterReason":"{reason}","deadLetterTime":"{day}T{n:02}:00:00Z","data":{{}}}}"#)
                    })
                    .collect();
                for two in lines.chunks(2) {
                    write(sink.as_ref(), dest, &day, two);
                }
            }
        }
        ["a", "b"]
            .map(|d| Source {
                destination: d.into(),
                sink: sink.clone(),
            })
            .to_vec()
    }

    fn walk(sources: &[Source], filter: &Filter, order: Order, limit: usize) -> Vec<String> {
        let mut ids = Vec::new();
        let mut after = None;
        for _ in 0..100 {
            let p = page(sources, filter, order, after.as_ref(), limit).expect("page");
            assert!(p.items.len() <= limit);
            ids.extend(p.items.iter().map(|i| i.summary.id.clone()));
            match p.next {
                // The cursor survives its text form.
                Some(c) => after = Some(Cursor::decode(&c.encode()).expect("decodes")),
                None => return ids,
            }
        }
        panic!("paging did not end");
    }

    #[test]
    fn pages_return_every_record_once_in_either_order() {
        on_both(pages_in_either_order);
    }

    fn pages_in_either_order(kind: Kind, root: &std::path::Path) {
        let src = sources(root, kind);
        // By dead-letter time across both destinations.
        let oldest = [
            "e1", "e2", "e6", "e7", "e8", "e9", "e10", "e3", "e4", "e5", "e11", "e12",
        ];
        let newest: Vec<&str> = oldest.iter().rev().copied().collect();
        for limit in [1, 2, 5, 12, 50] {
            assert_eq!(
                walk(&src, &Filter::default(), Order::Oldest, limit),
                oldest,
                "limit {limit}"
            );
            assert_eq!(
                walk(&src, &Filter::default(), Order::Newest, limit),
                newest,
                "limit {limit}"
            );
        }
    }

    #[test]
    fn times_out_of_order_in_a_file_still_list_each_record_once() {
        on_both(times_out_of_order);
    }

    fn times_out_of_order(kind: Kind, root: &std::path::Path) {
        let sink = shelf(root, kind);
        let line = |id: &str, hour: u32| {
            format!(r#"{{"id":"{id}","deadLetterTime":"2026-11-20T{hour:02}:00:00Z"}}"#)
        };
        write(
            sink.as_ref(),
            "a",
            "2026-11-20",
            &[line("a1", 5), line("a2", 1), line("a3", 9)],
        );
        write(
            sink.as_ref(),
            "b",
            "2026-11-20",
            &[line("b1", 3), line("b2", 7)],
        );
        let src = ["a", "b"].map(|d| Source {
            destination: d.into(),
            sink: sink.clone(),
        });
        for order in [Order::Oldest, Order::Newest] {
            for limit in [1, 2, 3, 10] {
                let mut ids = walk(&src, &Filter::default(), order, limit);
                ids.sort();
                assert_eq!(
                    ids,
                    ["a1", "a2", "a3", "b1", "b2"],
                    "{order:?} limit {limit}"
                );
            }
        }
    }

    #[test]
    fn filters_take_reason_and_time() {
        on_both(filters);
    }

    fn filters(kind: Kind, root: &std::path::Path) {
        let src = sources(root, kind);
        let ttl = Filter {
            reason: Some("TimeToLiveExceeded".into()),
            ..Filter::default()
        };
        assert_eq!(
            walk(&src, &ttl, Order::Oldest, 3),
            ["e2", "e6", "e8", "e10", "e4", "e12"]
        );
        // a: e1 e2 (day 0), e3 e4 e5 (day 2); b: e6 (day 0), e7-e10 (day 1), e11 e12 (day 2).
        let at = |s: &str| {
            day_start_ms(&s[..10]).map(|d| d + s[11..13].parse::<u64>().expect("h") * 3_600_000)
        };
        let window = Filter {
            since_ms: at("2026-11-21T07:00"),
            until_ms: at("2026-11-22T04:00"),
            ..Filter::default()
        };
        assert_eq!(
            walk(&src, &window, Order::Oldest, 2),
            ["e7", "e8", "e9", "e10", "e3"]
        );
    }

    #[test]
    fn a_replay_of_all_skips_what_was_replayed_and_finds_the_newest_by_id() {
        on_both(replay_of_all);
    }

    fn replay_of_all(kind: Kind, root: &std::path::Path) {
        let src = sources(root, kind);
        let mut first = Vec::new();
        unreplayed(&src[1], &Filter::default(), 3, |chunk| {
            first.push(chunk.len());
            src[1]
                .sink
                .mark_replayed(
                    "b",
                    &chunk.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
                )
                .expect("mark");
            first.len() < 2
        })
        .expect("walk");
        assert_eq!(first, [3, 3], "stopped when asked");
        let mut rest = Vec::new();
        unreplayed(&src[1], &Filter::default(), 3, |chunk| {
            rest.extend(
                chunk
                    .into_iter()
                    .map(|(_, l)| parse(&l).expect("parses").id().map(String::from)),
            );
            true
        })
        .expect("walk");
        assert_eq!(rest, [Some("e12".to_string())]);
        // The same id twice: the newest wins.
        write(
            src[0].sink.as_ref(),
            "a",
            "2026-11-24",
            &[r#"{"id":"e1","v":2}"#.to_string()],
        );
        let ids = HashSet::from(["e1".to_string(), "nope".to_string()]);
        let found = find(&src[0], &ids).expect("find");
        assert_eq!(found.len(), 1);
        let e1 = &found["e1"];
        assert_eq!(e1.place.day, "2026-11-24");
        assert!(e1.line.contains("\"v\":2"));
        assert!(!e1.replayed);
    }

    #[test]
    fn a_bad_cursor_is_refused() {
        assert!(Cursor::decode("not base64!").is_none());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("x")).is_none());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("n\nnot-a-day\t3\ta")).is_none());
        assert!(Cursor::decode(&URL_SAFE_NO_PAD.encode("n\n2026-11-20\t\tx\ta")).is_none());
        let c = Cursor {
            order: Order::Oldest,
            after: HashMap::from([(
                "a\tb".to_string(),
                Place {
                    day: "2026-11-20".into(),
                    part: "0000000000001-0000000000002-x-2.jsonl".into(),
                    offset: 7,
                },
            )]),
        };
        assert_eq!(
            Cursor::decode(&c.encode()),
            Some(c),
            "a name with a tab survives"
        );
    }
}
