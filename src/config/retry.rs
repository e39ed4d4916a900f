//! The `retry.schedule` key: `eventgrid`, a list of delays, or a keyed form
//! (`exponential:`, `sns:`), turned into a policy `Schedule`.

use super::units::{Dur, parse_duration};
use super::validate::Checker;
use crate::policy::Schedule;
use std::time::Duration;

pub(super) fn schedule(c: &mut Checker, path: &str, v: &serde_norway::Value) -> Schedule {
    use serde_norway::Value;
    match v {
        Value::String(s) if s == "eventgrid" => Schedule::EventGrid,
        Value::String(s) => {
            c.err(path, format!("`{s}` is not a schedule: allowed eventgrid, a list of delays like [5s, 5m], exponential:, sns:"));
            Schedule::EventGrid
        }
        Value::Sequence(items) if items.is_empty() => {
            c.err(path, "a list schedule needs at least one delay");
            Schedule::EventGrid
        }
        Value::Sequence(items) => {
            let mut delays = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let p = format!("{path}[{i}]");
                match item.as_str().map(parse_duration) {
                    Some(Ok(d)) => delays.push(c.range_dur(
                        &p,
                        Dur(d),
                        Duration::ZERO,
                        Duration::from_secs(1440 * 60),
                    )),
                    Some(Err(e)) => c.err(p, e),
                    None => c.err(p, "expected a duration with a unit, like 5s or 5m"),
                }
            }
            Schedule::List(delays)
        }
        Value::Mapping(m) => {
            let key = m.keys().next().and_then(|k| k.as_str()).unwrap_or("");
            match key {
                "exponential" | "sns" => c.err(format!("{path}.{key}"), "not supported yet (planned in issue 3)"),
                other => c.err(path, format!("`{other}` is not a schedule: allowed eventgrid, a list of delays, exponential:, sns:")),
            }
            Schedule::EventGrid
        }
        _ => {
            c.err(
                path,
                "expected eventgrid, a list of delays, exponential: or sns:",
            );
            Schedule::EventGrid
        }
    }
}
