//! The pieces of a line that cost the most, made cheaper with the same
//! output: the timestamp and the text format's fields. Every delivered
//! event and every passthrough request logs a line at `info` (SPEC §6), and
//! `tracing-subscriber`'s own timer and field visitor were about half of a
//! line's cost (write! per field, a styled name and `=` even without
//! colours, a message escaped a character at a time, its date-time written
//! piece by piece): a line was 2.9% of courier's CPU under step b's load
//! and 3.6% under passthrough's, 1.9% and 2.2% with these
//! (benches/RESULTS.md). The line's layout stays the subscriber's
//! (`Format<Full>`), so the two produce one text.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FormatFields, time};

/// RFC 3339 in UTC with microseconds, as `tracing-subscriber`'s
/// `SystemTime` writes it, in one write (humantime's).
pub(super) struct Clock;

/// 10000-01-01T00:00:00Z: humantime writes four-digit years only.
const YEAR_10000: u64 = 253_402_300_800;

impl FormatTime for Clock {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let now = SystemTime::now();
        match now.duration_since(UNIX_EPOCH) {
            Ok(since) if since.as_secs() < YEAR_10000 => {
                write!(w, "{}", humantime::format_rfc3339_micros(now))
            }
            // humantime panics before 1970: a clock set so wrong still logs.
            _ => time::SystemTime.format_time(w),
        }
    }
}

/// The text format's fields, as `DefaultFields` writes them
/// (`name=value`, a space between, `&str` values quoted, `%` values as
/// they display), each written straight to the line. Lines with colours
/// (a terminal), the message, raw identifiers and errors go to
/// `DefaultFields`, whose styling and escaping they need.
pub(super) struct Fields;

impl<'w> FormatFields<'w> for Fields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        if writer.has_ansi_escapes() {
            return DefaultFields::new().format_fields(writer, fields);
        }
        let mut plain = Plain {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut plain);
        plain.result
    }
}

struct Plain<'w> {
    writer: Writer<'w>,
    is_empty: bool,
    result: fmt::Result,
}

impl Plain<'_> {
    /// Whether `field` is written at all (`log.` metadata is not, as the
    /// default visitor skips it), and whether it is the line's first.
    fn start(&mut self, field: &Field) -> Option<bool> {
        (self.result.is_ok() && !field.name().starts_with("log."))
            .then(|| std::mem::replace(&mut self.is_empty, false))
    }

    /// One field: `value` writes it after `name=`, or as the message
    /// (no name, its control characters escaped as the default visitor
    /// escapes them); raw identifiers (`r#type`) go to `default`.
    fn field(
        &mut self,
        field: &Field,
        value: impl FnOnce(&mut dyn fmt::Write) -> fmt::Result,
        default: impl FnOnce(&mut DefaultVisitor<'_>),
    ) {
        let name = field.name();
        if name.starts_with("r#") {
            return self.by_default(field, default);
        }
        let Some(first) = self.start(field) else {
            return;
        };
        let sanitize = self.writer.sanitizes_ansi_escapes();
        let w = &mut self.writer;
        let sep = if first { Ok(()) } else { w.write_char(' ') };
        self.result = sep.and_then(|()| match name {
            "message" if sanitize => value(&mut Escaping(w)),
            "message" => value(w),
            _ => w
                .write_str(name)
                .and_then(|()| w.write_char('='))
                .and_then(|()| value(w)),
        });
    }

    /// The default visitor writes the field, over the same line.
    fn by_default(&mut self, field: &Field, default: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let Some(first) = self.start(field) else {
            return;
        };
        let mut v = DefaultVisitor::new(self.writer.by_ref(), first);
        default(&mut v);
        self.result = tracing_subscriber::field::VisitOutput::finish(v);
    }
}

impl Visit for Plain<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(
            field,
            |w| write!(w, "{value:?}"),
            |v| v.record_debug(field, value),
        );
    }

    /// Quoted, as `{:?}` writes it, but as the message.
    fn record_str(&mut self, field: &Field, value: &str) {
        let message = field.name() == "message";
        self.field(
            field,
            |w| {
                if message {
                    w.write_str(value)
                } else {
                    quoted(w, value)
                }
            },
            |v| v.record_str(field, value),
        );
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(
            field,
            |w| w.write_str(itoa::Buffer::new().format(value)),
            |v| v.record_u64(field, value),
        );
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(
            field,
            |w| w.write_str(itoa::Buffer::new().format(value)),
            |v| v.record_i64(field, value),
        );
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(
            field,
            |w| w.write_str(if value { "true" } else { "false" }),
            |v| v.record_bool(field, value),
        );
    }

    /// Always the default's: an error writes its sources too.
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.by_default(field, |v| v.record_error(field, value));
    }
}

/// `value` as `{:?}` writes a `str`, in one write when no character in
/// it needs escaping (printable ASCII but a quote or a backslash).
fn quoted(w: &mut dyn fmt::Write, value: &str) -> fmt::Result {
    if value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        w.write_char('"')?;
        w.write_str(value)?;
        w.write_char('"')
    } else {
        write!(w, "{value:?}")
    }
}

/// Writes through to `0` with the control characters a terminal could
/// act on escaped, as `tracing-subscriber` escapes a message: ESC, BEL,
/// BS, FF and DEL as `\x1b` and the like, C1 controls (U+0080–U+009F) as
/// `\u{85}` and the like;
/// runs without them in one write.
struct Escaping<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut run = 0;
        for (i, ch) in s.char_indices() {
            let escaped = match ch {
                '\x1b' => "\\x1b",
                '\x07' => "\\x07",
                '\x08' => "\\x08",
                '\x0c' => "\\x0c",
                '\x7f' => "\\x7f",
                '\u{80}'..='\u{9f}' => "",
                _ => continue,
            };
            self.0.write_str(&s[run..i])?;
            if escaped.is_empty() {
                write!(self.0, "\\u{{{:x}}}", ch as u32)?;
            } else {
                self.0.write_str(escaped)?;
            }
            run = i + ch.len_utf8();
        }
        self.0.write_str(&s[run..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("buffer").clone()).expect("utf-8")
        }
    }

    #[derive(Debug)]
    struct Cause;
    impl fmt::Display for Cause {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the disk is full")
        }
    }
    impl std::error::Error for Cause {}

    #[derive(Debug)]
    struct Failed(Cause);
    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cannot write")
        }
    }
    impl std::error::Error for Failed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Lines of every kind of field courier logs, and some it might.
    fn log_lines() {
        let id = String::from("01a2-\"quoted\"\tid");
        let (status, none): (Option<u16>, Option<u16>) = (Some(200), None);
        tracing::info!(destination = %"orders", id = %id, attempts = 3u32, status, last = none, outcome = %"Delivered", since_accept_ms = 9u64, batch = Option::<&str>::None, late = Some(true), "delivered");
        tracing::info!(
            destination = "quotes",
            id = id.as_str(),
            mode = "passthrough",
            took_ms = 12u64,
            "passed through"
        );
        tracing::warn!(offset = -5i64, ok = false, ratio = 0.5f64, r#type = "x", list = ?vec![1, 2], "first {} then {:?}", 1, "two");
        let failed = Failed(Cause);
        tracing::error!(
            error = &failed as &(dyn std::error::Error + 'static),
            "no room"
        );
        tracing::info!("a message with an \x1b[31mescape\x1b[0m and \u{85} in it");
        tracing::info!(message = "\x07\x08\x0c\x7f\u{9f}\u{a0}é\tdone", n = 1u64);
        tracing::info!(text = "tab\there \\ \"q\" é \u{7f}", plain = "a b~c");
        tracing::info!(only = 1u64);
        // `log.` metadata (as `LogTracer` adds) is left out; a message
        // that is not the first field still comes without a name.
        tracing::info!(n = 1u64, log.target = "rustls", message = "late");
        let span = tracing::info_span!("request", method = "POST", n = 2u64, path = %"/a b", later = tracing::field::Empty);
        span.record("later", "set");
        span.in_scope(|| tracing::info!(inner = true, "in a span"));
    }

    fn lines_with<N>(fields: N) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, log_lines);
        buf.text()
    }

    #[test]
    fn fields_are_written_as_the_default_formatter_writes_them() {
        let ours = lines_with(Fields);
        let theirs = lines_with(DefaultFields::new());
        assert_eq!(ours, theirs);
        // What the comparison covers, so that it cannot pass on empty lines.
        for part in [
            r#"delivered destination=orders id=01a2-"quoted"	id attempts=3 status=200 outcome=Delivered since_accept_ms=9 late=true"#,
            r#"passed through destination="quotes" id="01a2-\"quoted\"\tid" mode="passthrough" took_ms=12"#,
            r#"first 1 then "two" offset=-5 ok=false ratio=0.5 type="x" list=[1, 2]"#,
            "no room error=cannot write error.sources=[the disk is full]",
            r"a message with an \x1b[31mescape\x1b[0m and \u{85} in it",
            "logging::format::tests: only=1",
            r"\x07\x08\x0c\x7f\u{9f}",
            r#"plain="a b~c""#,
            "tests: n=1 late",
            r#"request{method="POST" n=2 path=/a b later="set"}: courier::logging::format::tests: in a span inner=true"#,
        ] {
            assert!(ours.contains(part), "no {part:?} in\n{ours}");
        }
    }

    #[test]
    fn the_clock_writes_rfc3339_utc_with_microseconds_as_the_default_timer() {
        let mut ours = String::new();
        let mut theirs = String::new();
        let ms = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        };
        let before = ms(SystemTime::now());
        Clock
            .format_time(&mut Writer::new(&mut ours))
            .expect("ours");
        time::SystemTime
            .format_time(&mut Writer::new(&mut theirs))
            .expect("theirs");
        let after = ms(SystemTime::now());
        assert_eq!(ours.len(), "2026-12-05T05:10:00.123456Z".len(), "{ours}");
        assert_eq!(ours.len(), theirs.len(), "{ours} against {theirs}");
        assert!(ours.ends_with('Z') && ours.as_bytes()[19] == b'.', "{ours}");
        let ms = crate::clock::rfc3339::parse_ms(&ours).expect("rfc 3339");
        assert!(
            (before..=after).contains(&ms),
            "{ours}: {ms} not in {before}..={after}"
        );
    }
}
