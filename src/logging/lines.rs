//! The log's writer thread: lines go into one shared buffer, and a thread
//! writes it to stderr in bursts.
//!
//! Hand-written rather than `tracing_appender::non_blocking`, which wakes
//! its thread for almost every line: under load a futex wake and a
//! `write(2)` every few lines, a share of courier's CPU (benches/RESULTS.md).
//! Here the thread, woken by the first line of a burst, lingers `linger`
//! before it takes the buffer, so it wakes at most once per `linger`, and a
//! logging thread wakes it only when it sleeps with nothing to write.
//! Lossless: past `limit` queued bytes a logging thread wakes the writer and
//! waits for room. After `rest` with nothing to write, the writer gives back
//! the two buffers a burst grew (up to `limit` each) and what the thread
//! freed (`give_back`).

use crate::lifecycle::give_back;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// Where `tracing` writes: clones share one buffer.
#[derive(Clone)]
pub struct Lines {
    inner: Arc<Inner>,
}

/// Stops the writer when dropped, after it has written everything queued.
#[must_use = "dropping the guard stops the log writer"]
pub struct Guard {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

struct Inner {
    state: Mutex<State>,
    /// The writer waits here for lines (or for `linger` to pass).
    ready: Condvar,
    /// Logging threads wait here for room.
    room: Condvar,
    limit: usize,
}

#[derive(Default)]
struct State {
    queued: Vec<u8>,
    /// The writer waits for a first line: the next one must wake it.
    idle: bool,
    closed: bool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned lock is still sound.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, line: &[u8]) {
        let mut s = self.lock();
        // Bounded by the writer: it takes the whole buffer at each turn.
        while s.queued.len() >= self.limit && !s.closed {
            self.ready.notify_one();
            s = self.room.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.queued.extend_from_slice(line);
        if s.idle {
            s.idle = false;
            self.ready.notify_one();
        }
    }
}

/// How long the writer waits before a burst's lines are written, and
/// with nothing to write before it gives back its buffers.
#[derive(Clone, Copy)]
pub struct Pace {
    pub linger: Duration,
    pub rest: Duration,
}

/// Starts the writer thread on `out`.
pub fn spawn<W: Write + Send + 'static>(
    out: W,
    pace: Pace,
    limit: usize,
    name: &str,
) -> std::io::Result<(Lines, Guard)> {
    let inner = Arc::new(Inner {
        state: Mutex::new(State::default()),
        ready: Condvar::new(),
        room: Condvar::new(),
        limit,
    });
    let thread = {
        let inner = inner.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(&inner, out, pace))?
    };
    Ok((
        Lines {
            inner: inner.clone(),
        },
        Guard {
            inner,
            thread: Some(thread),
        },
    ))
}

fn run<W: Write>(inner: &Inner, mut out: W, pace: Pace) {
    let mut taken = Vec::new();
    loop {
        let mut s = inner.lock();
        while s.queued.is_empty() && !s.closed {
            s.idle = true;
            let waited;
            (s, waited) = inner
                .ready
                .wait_timeout(s, pace.rest)
                .unwrap_or_else(PoisonError::into_inner);
            // Once a rest: `taken` has room only after a burst was written.
            if waited.timed_out() && s.queued.is_empty() && taken.capacity() > 0 {
                s.queued = Vec::new();
                taken = Vec::new();
                // A line logged meanwhile is found by the loop's test.
                drop(s);
                give_back::rested();
                s = inner.lock();
            }
        }
        s.idle = false;
        if s.queued.is_empty() {
            return;
        }
        // Let the burst gather, unless closing or a logger waits for room.
        if !s.closed && s.queued.len() < inner.limit {
            s = inner
                .ready
                .wait_timeout(s, pace.linger)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        std::mem::swap(&mut s.queued, &mut taken);
        drop(s);
        inner.room.notify_all();
        // stderr gone (a closed pipe): nothing better to do with a line.
        let _ = out.write_all(&taken).and_then(|()| out.flush());
        taken.clear();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.inner.lock().closed = true;
        self.inner.ready.notify_one();
        self.inner.room.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One event's line: `tracing`'s formatter writes it in one `write_all`.
pub struct LineWriter<'a>(&'a Inner);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter(&self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Records each `write` call the writer thread makes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("sink").concat()).expect("utf-8")
        }
        fn writes(&self) -> usize {
            self.0.lock().expect("sink").len()
        }
    }

    /// Lingers `ms`; rests longer than any test.
    fn lingering(ms: u64) -> Pace {
        Pace {
            linger: Duration::from_millis(ms),
            rest: Duration::from_secs(600),
        }
    }

    /// Waits up to 5 s for `done`.
    fn within_5s(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        // Bounded by the deadline.
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        done()
    }

    #[test]
    fn a_rested_writer_gives_back_its_buffers_and_writes_the_next_line() {
        let sink = Sink::default();
        let pace = Pace {
            linger: Duration::from_millis(1),
            rest: Duration::from_millis(30),
        };
        let (lines, _guard) = spawn(sink.clone(), pace, 1 << 20, "t").expect("spawn");
        let line = "x".repeat(99) + "\n";
        // Two bursts, each written before the next: the queue then holds
        // the buffer the first was written from.
        for burst in 1..=2 {
            for _ in 0..500 {
                log(&lines, &line);
            }
            assert!(
                within_5s(|| sink.text().len() == burst * 50_000),
                "burst {burst} was not written"
            );
        }
        assert!(
            within_5s(|| lines.inner.lock().queued.capacity() == 0),
            "the queue kept {} bytes of room after a rest",
            lines.inner.lock().queued.capacity()
        );
        log(&lines, "after\n");
        assert!(
            within_5s(|| sink.text().ends_with("x\nafter\n")),
            "a line logged after the rest was not written"
        );
    }

    fn log(lines: &Lines, text: &str) {
        lines
            .make_writer()
            .write_all(text.as_bytes())
            .expect("write");
    }

    #[test]
    fn a_burst_of_lines_is_written_in_a_few_writes_in_order() {
        let sink = Sink::default();
        let (lines, guard) = spawn(sink.clone(), lingering(50), 1 << 20, "t").expect("spawn");
        for i in 0..1000 {
            log(&lines, &format!("line {i}\n"));
        }
        drop(guard);
        let want: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(sink.text(), want);
        assert!(
            sink.writes() <= 5,
            "{} writes for one burst of 1000 lines",
            sink.writes()
        );
    }

    #[test]
    fn a_line_is_written_within_its_linger_without_a_close() {
        let sink = Sink::default();
        let (lines, _guard) = spawn(sink.clone(), lingering(20), 1 << 20, "t").expect("spawn");
        log(&lines, "one\n");
        within_5s(|| !sink.text().is_empty());
        assert_eq!(sink.text(), "one\n");
    }

    #[test]
    fn past_the_limit_loggers_wait_and_nothing_is_lost() {
        let sink = Sink::default();
        // A limit of two lines and a long linger: loggers must wake the
        // writer early, or this takes 1000 lingers.
        let (lines, guard) = spawn(sink.clone(), lingering(10_000), 16, "t").expect("spawn");
        let started = Instant::now();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        log(&lines, &format!("{t}:{i:03}\n"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("logger");
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "loggers waited for the linger, not for room"
        );
        drop(guard);
        let text = sink.text();
        assert_eq!(text.lines().count(), 1000, "{text}");
        for t in 0..4 {
            let own: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{t}:")))
                .collect();
            let want: Vec<String> = (0..250).map(|i| format!("{t}:{i:03}")).collect();
            assert_eq!(own, want, "thread {t}'s lines");
        }
    }
}
