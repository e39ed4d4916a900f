//! RFC 3339 date-time check (`2025-01-31T12:00:00.123Z`, `...+01:00`).
//! Hand-written because courier needs only "is it valid", with offsets and
//! any number of fraction digits, which `humantime` does not accept.

/// Whether `s` is an RFC 3339 `date-time` (section 5.6), including a real
/// calendar day and a leap second at `:60`.
pub fn valid(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20 {
        return false;
    }
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(range)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let (Some(year), Some(month), Some(day)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    let (Some(hour), Some(minute), Some(second)) = (num(11..13), num(14..16), num(17..19)) else {
        return false;
    };
    let separators = b[4] == b'-' && b[7] == b'-' && matches!(b[10], b'T' | b't' | b' ');
    if !separators || b[13] != b':' || b[16] != b':' {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if day == 0 || day > days || hour > 23 || minute > 59 || second > 60 {
        return false;
    }
    let mut rest = &b[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return false;
        }
        rest = &frac[digits..];
    }
    match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            let all = [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit());
            all && (h1 - b'0') * 10 + (h2 - b'0') <= 23 && (m1 - b'0') * 10 + (m2 - b'0') <= 59
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::valid;

    #[test]
    fn accepts_rfc3339_date_times() {
        for ok in [
            "2017-06-26T18:41:00.9584103Z",
            "2025-01-31T12:00:00Z",
            "2024-02-29T23:59:60+01:00",
            "1985-04-12t23:20:50.52z",
            "1996-12-19T16:39:57-08:00",
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
}
