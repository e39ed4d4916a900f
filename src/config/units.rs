//! Durations and sizes as users write them (`250ms`, `24h`, `64KiB`), kept as
//! their parsed value but printed back in the same human form by `courier check`.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::fmt;
use std::time::Duration;

/// A duration written with a unit, e.g. `250ms`, `10s`, `5m`, `24h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration like 10s")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Dur, E> {
                if n == 0 {
                    return Ok(Dur(Duration::ZERO));
                }
                Err(E::custom(format!(
                    "duration `{n}` has no unit: write it like {n}s or {n}ms"
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses `250ms`, `10s`, `1.5s`, `5m`, `24h`, `1d`; a bare `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|_| {
        format!("invalid duration `{s}`: expected a number with a unit, like 250ms, 10s, 5m or 24h")
    })
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

/// The largest unit that divides the value exactly, so `1440m` prints as
/// `24h`; other values in compact mixed units (`16m40s`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    for (unit, len) in [("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)] {
        if ms.is_multiple_of(len) && (ms / len < 1000 || unit == "h") {
            return format!("{}{unit}", ms / len);
        }
    }
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// A size in bytes, written as an integer or with a unit (`64KiB`, `1MiB`, `1GiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size like 64KiB or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                Err(E::custom(format!("size `{n}` is negative")))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                s.trim()
                    .parse::<bytesize::ByteSize>()
                    .map(|b| Size(b.as_u64()))
                    .map_err(|_| {
                        E::custom(format!(
                            "invalid size `{s}`: expected bytes or a number with a unit, like 64KiB or 1MiB"
                        ))
                    })
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for (unit, len) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if self.0 >= len && self.0.is_multiple_of(len) {
                return write!(f, "{}{unit}", self.0 / len);
            }
        }
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_in_their_largest_exact_unit() {
        for (input, ms, printed) in [
            ("250ms", 250, "250ms"),
            ("10s", 10_000, "10s"),
            ("1440m", 86_400_000, "24h"),
            ("90s", 90_000, "90s"),
            ("1000s", 1_000_000, "16m40s"),
            ("1500ms", 1500, "1s500ms"),
            ("0", 0, "0s"),
        ] {
            let d = parse_duration(input).expect(input);
            assert_eq!(d.as_millis(), ms, "{input}");
            assert_eq!(format_duration(d), printed, "{input}");
        }
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("ten seconds").is_err());
    }

    #[test]
    fn sizes_parse_units_and_print_back() {
        let s: Size = serde_norway::from_str("64KiB").expect("size");
        assert_eq!(s.0, 65_536);
        assert_eq!(s.to_string(), "64KiB");
        let s: Size = serde_norway::from_str("1000").expect("size");
        assert_eq!(s.to_string(), "1000");
        assert!(serde_norway::from_str::<Size>("lots").is_err());
        assert!(serde_norway::from_str::<Size>("-1").is_err());
    }
}
