//! RFC 3339 date-times (`2025-01-31T12:00:00.123Z`, `...+01:00`): the one
//! parser for every time courier reads, an event's `time` or `eventTime`,
//! a dead-letter record's, an admin query's, a SAS token's expiry.
//!
//! Hand-written rather than `jiff` or `humantime`: RFC 3339 allows any
//! number of fraction digits (.NET writes seven, and nothing caps them;
//! jiff refuses more than nine) and a leap second at `:60`, and ingress
//! must accept every time the Azure and CloudEvents SDKs send; humantime
//! takes no offsets. Calendar arithmetic is Howard Hinnant's
//! `days_from_civil`, exact for every year the format can hold.

/// Whether `s` is an RFC 3339 `date-time` (section 5.6), including a real
/// calendar day and a leap second at `:60`.
pub fn valid(s: &str) -> bool {
    parse(s, Zone::Required).is_some()
}

/// `s` as ms since the epoch; `None` if it is not an RFC 3339 date-time
/// or falls before 1970. A leap second counts as the next second's start.
pub fn parse_ms(s: &str) -> Option<u64> {
    parse(s, Zone::Required).and_then(|ms| u64::try_from(ms).ok())
}

/// The same, where a time without an offset is UTC: as operators type
/// times, and as Python's `str(datetime)` writes a naive one.
pub fn parse_ms_utc_default(s: &str) -> Option<u64> {
    parse(s, Zone::Utc).and_then(|ms| u64::try_from(ms).ok())
}

#[derive(Clone, Copy, PartialEq)]
enum Zone {
    Required,
    /// Missing: UTC.
    Utc,
}

fn parse(s: &str, zone: Zone) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(range)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let separators = b[4] == b'-' && b[7] == b'-' && matches!(b[10], b'T' | b't' | b' ');
    if !separators || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day == 0 || day > days || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &b[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix(b".") {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        // The first three digits, as ms; the rest are finer than courier keeps.
        millis = frac[..digits]
            .iter()
            .chain(std::iter::repeat(&b'0'))
            .take(3)
            .fold(0, |n, d| n * 10 + i64::from(d - b'0'));
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            if ![h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let (h, m) = (
                i64::from((h1 - b'0') * 10 + (h2 - b'0')),
                i64::from((m1 - b'0') * 10 + (m2 - b'0')),
            );
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'-' { -secs } else { secs }
        }
        [] if zone == Zone::Utc => 0,
        _ => return None,
    };
    let secs = days_from_civil(i64::from(year), month, day) * 86_400
        + i64::from(hour) * 3600
        + i64::from(minute) * 60
        + i64::from(second)
        - offset_secs;
    Some(secs * 1000 + millis)
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_rfc3339_date_times() {
        for ok in [
            "2017-06-26T18:41:00.9584103Z",
            "2025-01-31T12:00:00Z",
            "2024-02-29T23:59:60+01:00",
            "1985-04-12t23:20:50.52z",
            "1996-12-19T16:39:57-08:00",
            "1937-01-01T12:00:27.87+00:20",
            "2025-01-31T12:00:00.123456789012345Z",
        ] {
            assert!(valid(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_anything_else() {
        for bad in [
            "",
            "2025-01-31",
            "2025-01-31T12:00:00",
            "2025-01-31T12:00Z",
            "2025-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2025-04-31T00:00:00Z",
            "2025-01-31T24:00:00Z",
            "2025-01-31T12:00:00.Z",
            "2025-01-31T12:00:00+0100",
            "2025-01-31T12:00:00+24:00",
            "2025/01/31T12:00:00Z",
            "yesterday at noon, UTC!",
            "2025-01-31T12:00:00Zjunk",
        ] {
            assert!(!valid(bad), "{bad}");
        }
    }

    #[test]
    fn times_become_ms_since_the_epoch_whatever_their_offset() {
        assert_eq!(parse_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_ms("2026-11-23T13:00:00Z"), Some(1_795_438_800_000));
        assert_eq!(
            parse_ms("2026-11-23T14:00:00+01:00"),
            Some(1_795_438_800_000)
        );
        assert_eq!(
            parse_ms("2026-11-23T12:30:00-00:30"),
            Some(1_795_438_800_000)
        );
        assert_eq!(
            parse_ms("2026-11-23 13:00:00.2509Z"),
            Some(1_795_438_800_250)
        );
        assert_eq!(parse_ms("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        // A leap second is the next second's start.
        assert_eq!(
            parse_ms("2016-12-31T23:59:60Z"),
            parse_ms("2017-01-01T00:00:00Z")
        );
        assert_eq!(parse_ms("1969-12-31T23:59:59Z"), None, "before the epoch");
        assert!(valid("1969-12-31T23:59:59Z"));
    }

    #[test]
    fn only_the_lenient_form_takes_a_time_without_an_offset_as_utc() {
        assert_eq!(parse_ms("2026-11-23 13:00:00"), None);
        assert_eq!(
            parse_ms_utc_default("2026-11-23 13:00:00"),
            Some(1_795_438_800_000)
        );
        assert_eq!(
            parse_ms_utc_default("2026-11-23 13:00:00.250000+00:00"),
            Some(1_795_438_800_250)
        );
        assert_eq!(parse_ms_utc_default("2026-11-23"), None);
    }
}
