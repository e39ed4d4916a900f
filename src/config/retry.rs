//! The `retry` block of a destination: `schedule` (`eventgrid`, a list of
//! delays, `exponential:` or `sns:`) and `max_attempts`, turned into a policy
//! `Schedule`, the attempt limit, and the rate limit an SNS delivery policy
//! may carry.
//!
//! `sns:` takes SNS's own camelCase keys so a policy copied from AWS pastes
//! in unchanged, in either of the two shapes AWS shows:
//! - the `healthyRetryPolicy` body itself:
//!   `sns: { minDelayTarget: 1, maxDelayTarget: 60, numRetries: 50, ... }`;
//! - a whole subscription delivery policy: `sns: { healthyRetryPolicy: {...},
//!   throttlePolicy: { maxReceivesPerSecond: 10 }, sicklyRetryPolicy: null,
//!   guaranteed: false }`. `throttlePolicy.maxReceivesPerSecond` is returned
//!   as the destination's rate limit; `sicklyRetryPolicy` and `guaranteed`
//!   are deprecated by SNS and ignored, with a warning when they ask for
//!   something (a non-null `sicklyRetryPolicy`, `guaranteed: true`).
//!
//! With `sns:` the number of attempts is `numRetries + 1` (the first attempt
//! plus the retries), so `retry.max_attempts` must not be set as well: any
//! value there is an error that says to use `numRetries`.
//!
//! `schedule` is walked as a YAML value rather than read into a serde enum
//! of its four shapes: an untagged enum answers a mistake with "did not
//! match any variant", where this walk says which shape it took the value
//! for, what is allowed there, and reports every mistake of the block with
//! its key path and position at once (`Checker`). The typed result is
//! `policy::Schedule`.

use super::schema::Retry;
use super::units::{Dur, parse_duration};
use super::validate::Checker;
use crate::policy::Schedule;
use crate::policy::sns::{
    Backoff, MAX_DELAY_TARGET, MAX_NUM_RETRIES, MAX_TOTAL_RETRY_SECS, SnsPolicy,
};
use serde_norway::{Mapping, Value};
use std::time::Duration;

/// `retry.max_attempts` when not written, but with `sns:`.
pub(super) const DEFAULT_MAX_ATTEMPTS: u32 = 30;
/// `max_attempts` range for every schedule but `sns`.
const MAX_ATTEMPTS: u64 = 30;
const DAY: Duration = Duration::from_secs(24 * 3600);

/// What the `retry` block decides, besides `event_ttl` and `jitter`.
#[derive(Debug)]
pub(super) struct RetryPlan {
    pub schedule: Schedule,
    pub max_attempts: u32,
    /// `throttlePolicy.maxReceivesPerSecond` of a pasted SNS delivery policy.
    pub rate_limit_per_second: Option<u32>,
}

/// Checks `retry.schedule` and `retry.max_attempts`; `path` is the `retry`
/// block's key path. Problems go to `c`; the result is only used when
/// there are none.
pub(super) fn retry(c: &mut Checker, path: &str, r: &Retry) -> RetryPlan {
    let (schedule, rate_limit_per_second) = schedule(c, &format!("{path}.schedule"), &r.schedule);
    let max_path = format!("{path}.max_attempts");
    let is_sns = r
        .schedule
        .as_mapping()
        .is_some_and(|m| m.len() == 1 && m.contains_key("sns"));
    let max_attempts = if is_sns {
        if let Some(n) = r.max_attempts {
            c.err(
                max_path,
                format!(
                    "{n} does not apply to an sns schedule: it makes numRetries + 1 attempts; set numRetries instead and remove max_attempts"
                ),
            );
        }
        match &schedule {
            Schedule::Sns(p) => p.max_attempts(),
            _ => 1,
        }
    } else {
        let n = r.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        c.range_u64(&max_path, n.into(), 1, MAX_ATTEMPTS) as u32
    };
    RetryPlan {
        schedule,
        max_attempts,
        rate_limit_per_second,
    }
}

/// `retry.schedule`, and the rate limit of a pasted SNS delivery policy.
fn schedule(c: &mut Checker, path: &str, v: &Value) -> (Schedule, Option<u32>) {
    match v {
        Value::String(s) if s == "eventgrid" => (Schedule::EventGrid, None),
        Value::String(s) => {
            c.err(
                path,
                format!(
                    "`{s}` is not a schedule: allowed eventgrid, a list of delays like [5s, 5m], exponential:, sns:"
                ),
            );
            (Schedule::EventGrid, None)
        }
        Value::Sequence(items) if items.is_empty() => {
            c.err(path, "a list schedule needs at least one delay");
            (Schedule::EventGrid, None)
        }
        Value::Sequence(items) => {
            let mut delays = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let p = format!("{path}[{i}]");
                if let Some(d) = duration(c, &p, item) {
                    delays.push(c.range_dur(&p, Dur(d), Duration::ZERO, DAY));
                }
            }
            (Schedule::List(delays), None)
        }
        Value::Mapping(m) if m.len() == 1 => {
            let Some((key, body)) = m.iter().next() else {
                return (Schedule::EventGrid, None);
            };
            match key.as_str() {
                Some("exponential") => (exponential(c, &format!("{path}.exponential"), body), None),
                Some("sns") => match sns(c, &format!("{path}.sns"), body) {
                    Some((p, rate)) => (Schedule::Sns(p), rate),
                    None => (Schedule::EventGrid, None),
                },
                _ => {
                    c.err(
                        path,
                        format!(
                            "{} is not a schedule: allowed eventgrid, a list of delays, exponential:, sns:",
                            show(key)
                        ),
                    );
                    (Schedule::EventGrid, None)
                }
            }
        }
        Value::Mapping(m) => {
            let keys: Vec<String> = m.keys().map(show).collect();
            c.err(
                path,
                format!(
                    "a schedule has exactly one kind, found {}: write one of exponential:, sns:",
                    if keys.is_empty() {
                        "none".to_string()
                    } else {
                        keys.join(", ")
                    }
                ),
            );
            (Schedule::EventGrid, None)
        }
        _ => {
            c.err(
                path,
                "expected eventgrid, a list of delays, exponential: or sns:",
            );
            (Schedule::EventGrid, None)
        }
    }
}

/// `exponential: { initial: 1s, max: 10m, multiplier: 2 }`; every key is
/// optional with those values as defaults.
fn exponential(c: &mut Checker, path: &str, v: &Value) -> Schedule {
    let mut initial = Duration::from_secs(1);
    let mut max = Duration::from_secs(600);
    let mut multiplier = 2.0;
    let mut max_path = None;
    let mut initial_ok = true;
    for (key, value) in entries(c, path, v, "initial, max, multiplier") {
        let p = format!("{path}.{key}");
        match key.as_str() {
            "initial" => match duration(c, &p, value) {
                Some(d) if d >= Duration::from_millis(1) && d <= DAY => initial = d,
                Some(d) => {
                    initial_ok = false;
                    c.range_dur(&p, Dur(d), Duration::from_millis(1), DAY);
                }
                None => initial_ok = false,
            },
            "max" => {
                if let Some(d) = duration(c, &p, value) {
                    max = d;
                    max_path = Some(p);
                }
            }
            "multiplier" => match value.as_f64() {
                Some(m) if (1.0..=10.0).contains(&m) => multiplier = m,
                Some(m) => c.err(p, format!("{m} is out of range: allowed 1..=10")),
                None => c.err(
                    p,
                    format!(
                        "{} is not a number: expected 1..=10, like 2 or 1.5",
                        show(value)
                    ),
                ),
            },
            other => c.err(
                p,
                format!("unknown key `{other}`: allowed initial, max, multiplier"),
            ),
        }
    }
    // `max` is checked against the `initial` in force, so `initial: 1h`
    // alone (default max 10m) is reported on `max` with the fix; against
    // 1ms when `initial` itself is wrong (already reported).
    let floor = if initial_ok {
        initial
    } else {
        Duration::from_millis(1)
    };
    if max < floor || max > DAY {
        let max_path = max_path.unwrap_or_else(|| format!("{path}.max"));
        c.err(
            max_path,
            format!(
                "{} is out of range: allowed {}..=24h (at least initial)",
                Dur(max),
                Dur(floor)
            ),
        );
    }
    Schedule::Exponential {
        initial,
        max,
        multiplier,
    }
}

/// The keys of a `healthyRetryPolicy`.
const RETRY_KEYS: [&str; 7] = [
    "minDelayTarget",
    "maxDelayTarget",
    "numRetries",
    "numNoDelayRetries",
    "numMinDelayRetries",
    "numMaxDelayRetries",
    "backoffFunction",
];
/// The keys of a whole subscription delivery policy.
const DELIVERY_KEYS: [&str; 4] = [
    "healthyRetryPolicy",
    "throttlePolicy",
    "sicklyRetryPolicy",
    "guaranteed",
];

/// `sns:` in either pasted shape; `None` when something is wrong (already
/// reported).
fn sns(c: &mut Checker, path: &str, v: &Value) -> Option<(SnsPolicy, Option<u32>)> {
    let is_delivery_policy = v.as_mapping().is_some_and(|m| {
        m.keys()
            .any(|k| k.as_str().is_some_and(|k| DELIVERY_KEYS.contains(&k)))
    });
    if !is_delivery_policy {
        return healthy_retry_policy(c, path, v).map(|p| (p, None));
    }
    let mut healthy = None;
    let mut rate = None;
    let mut ok = true;
    for (key, value) in entries(c, path, v, &DELIVERY_KEYS.join(", ")) {
        let p = format!("{path}.{key}");
        match key.as_str() {
            "healthyRetryPolicy" => healthy = Some((p, value)),
            "throttlePolicy" => match throttle_policy(c, &p, value) {
                Ok(r) => rate = r,
                Err(()) => ok = false,
            },
            "sicklyRetryPolicy" => {
                if !value.is_null() {
                    c.warn(
                        p,
                        "deprecated by SNS and ignored: courier retries by healthyRetryPolicy only",
                    );
                }
            }
            "guaranteed" => match value {
                Value::Null | Value::Bool(false) => {}
                Value::Bool(true) => c.warn(
                    p,
                    "deprecated by SNS and ignored: courier keeps every event in its journal until it is delivered or dead-lettered",
                ),
                other => {
                    ok = false;
                    c.err(p, format!("{} is not true or false", show(other)));
                }
            },
            other => {
                ok = false;
                let hint = if RETRY_KEYS.contains(&other) {
                    ": in a pasted delivery policy it goes inside healthyRetryPolicy"
                } else {
                    ""
                };
                c.err(
                    p,
                    format!(
                        "unknown key `{other}` in an SNS delivery policy: allowed {}{hint}",
                        DELIVERY_KEYS.join(", ")
                    ),
                );
            }
        }
    }
    let policy = match healthy {
        Some((p, value)) => healthy_retry_policy(c, &p, value),
        None => Some(SnsPolicy::default()),
    };
    match policy {
        Some(policy) if ok => Some((policy, rate)),
        _ => None,
    }
}

/// `throttlePolicy: { maxReceivesPerSecond: N }`, N ≥ 1; null or no key =
/// no throttling (SNS's default).
fn throttle_policy(c: &mut Checker, path: &str, v: &Value) -> Result<Option<u32>, ()> {
    let mut rate = None;
    let mut ok = true;
    for (key, value) in entries(c, path, v, "maxReceivesPerSecond") {
        let p = format!("{path}.{key}");
        if key != "maxReceivesPerSecond" {
            ok = false;
            c.err(
                p,
                format!("unknown key `{key}` in throttlePolicy: allowed maxReceivesPerSecond"),
            );
            continue;
        }
        match value.as_u64().map(u32::try_from) {
            Some(Ok(n)) if n >= 1 => rate = Some(n),
            _ => {
                ok = false;
                c.err(
                    p,
                    format!(
                        "{} is out of range: allowed a whole number from 1 to {}",
                        show(value),
                        u32::MAX
                    ),
                );
            }
        }
    }
    if ok { Ok(rate) } else { Err(()) }
}

/// A `healthyRetryPolicy` body (null = every default), with SNS's ranges,
/// the phases fitting in `numRetries`, and the 3600 s total.
fn healthy_retry_policy(c: &mut Checker, path: &str, v: &Value) -> Option<SnsPolicy> {
    let defaults = SnsPolicy::default();
    let mut written: [Option<u64>; 6] = [None; 6];
    let mut backoff = defaults.backoff_function;
    let mut ok = true;
    for (key, value) in entries(c, path, v, &RETRY_KEYS.join(", ")) {
        let p = format!("{path}.{key}");
        if key == "backoffFunction" {
            match value.as_str().and_then(Backoff::parse) {
                Some(b) => backoff = b,
                None => {
                    ok = false;
                    let names: Vec<&str> = Backoff::ALL.iter().map(|b| b.as_str()).collect();
                    c.err(
                        p,
                        format!(
                            "{} is not a backoff function: allowed {}",
                            show(value),
                            names.join(", ")
                        ),
                    );
                }
            }
            continue;
        }
        let Some(slot) = RETRY_KEYS.iter().position(|k| *k == key) else {
            ok = false;
            c.err(
                p,
                format!(
                    "unknown key `{key}` in an SNS retry policy: allowed {}",
                    RETRY_KEYS.join(", ")
                ),
            );
            continue;
        };
        match value.as_u64() {
            Some(n) => written[slot] = Some(n),
            None => {
                ok = false;
                c.err(
                    p,
                    format!(
                        "{} is not a whole number ≥ 0{}",
                        show(value),
                        if slot < 2 { " of seconds" } else { "" }
                    ),
                );
            }
        }
    }
    if !ok {
        return None;
    }
    let key = |i: usize| format!("{path}.{}", RETRY_KEYS[i]);
    let shown = |i: usize, default: u32| match written[i] {
        Some(n) => n.to_string(),
        None => format!("{default} (its default)"),
    };
    let [min, max, num, no_delay, min_delay, max_delay] = [
        written[0].unwrap_or(defaults.min_delay_target.into()),
        written[1].unwrap_or(defaults.max_delay_target.into()),
        written[2].unwrap_or(defaults.num_retries.into()),
        written[3].unwrap_or(0),
        written[4].unwrap_or(0),
        written[5].unwrap_or(0),
    ];
    // minDelayTarget: 1..=maxDelayTarget; maxDelayTarget: minDelayTarget..=3600.
    // When min > max, blame the key that was written (min when both were).
    if max > MAX_DELAY_TARGET.into() || max < 1 {
        ok = false;
        c.err(
            key(1),
            format!(
                "{max} is out of range: allowed {}..={MAX_DELAY_TARGET} (seconds, from minDelayTarget = {})",
                min.clamp(1, MAX_DELAY_TARGET.into()),
                shown(0, defaults.min_delay_target)
            ),
        );
    } else if min < 1 || (min > max && written[0].is_some()) {
        ok = false;
        c.err(
            key(0),
            format!(
                "{min} is out of range: allowed 1..={max} (seconds, up to maxDelayTarget = {})",
                shown(1, defaults.max_delay_target)
            ),
        );
    } else if min > max {
        ok = false;
        c.err(
            key(1),
            format!(
                "{max} is out of range: allowed {min}..={MAX_DELAY_TARGET} (seconds, from minDelayTarget = {})",
                shown(0, defaults.min_delay_target)
            ),
        );
    }
    if num > MAX_NUM_RETRIES.into() {
        ok = false;
        c.err(
            key(2),
            format!("{num} is out of range: allowed 0..={MAX_NUM_RETRIES}"),
        );
    }
    let phases = no_delay.saturating_add(min_delay).saturating_add(max_delay);
    if ok && phases > num {
        ok = false;
        c.err(
            key(2),
            format!(
                "numRetries {} is less than the phases need: numNoDelayRetries {no_delay} + numMinDelayRetries {min_delay} + numMaxDelayRetries {max_delay} = {phases}",
                shown(2, defaults.num_retries)
            ),
        );
    }
    if !ok {
        return None;
    }
    // Every value is now within 0..=3600 or 0..=100.
    let narrow = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let policy = SnsPolicy {
        min_delay_target: narrow(min),
        max_delay_target: narrow(max),
        num_retries: narrow(num),
        num_no_delay_retries: narrow(no_delay),
        num_min_delay_retries: narrow(min_delay),
        num_max_delay_retries: narrow(max_delay),
        backoff_function: backoff,
    };
    let total = policy.total_retry_time();
    if total.as_secs() > MAX_TOTAL_RETRY_SECS {
        c.err(
            path,
            format!(
                "total retry time is {}s (pre-backoff {min_delay}×{min}s + backoff {}s + post-backoff {max_delay}×{max}s), more than SNS's limit of {MAX_TOTAL_RETRY_SECS}s: lower numRetries, the delays or the phase counts",
                total.as_secs(),
                policy.backoff_time().as_secs(),
            ),
        );
        return None;
    }
    Some(policy)
}

/// The `(key, value)` pairs of a mapping; null is an empty mapping (a
/// bare `sns:` means every default). Anything else, or a key that is not a
/// string, is reported.
fn entries<'v>(
    c: &mut Checker,
    path: &str,
    v: &'v Value,
    allowed: &str,
) -> Vec<(String, &'v Value)> {
    static EMPTY: std::sync::LazyLock<Mapping> = std::sync::LazyLock::new(Mapping::new);
    let m: &Mapping = match v {
        Value::Null => &EMPTY,
        Value::Mapping(m) => m,
        other => {
            c.err(
                path,
                format!("{} is not a mapping: expected keys {allowed}", show(other)),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (k, value) in m.iter() {
        match k.as_str() {
            Some(k) => out.push((k.to_string(), value)),
            None => c.err(path, format!("{} is not a key: allowed {allowed}", show(k))),
        }
    }
    out
}

/// A duration with a unit, like `5s`, reported at `path` when it is not one.
fn duration(c: &mut Checker, path: &str, v: &Value) -> Option<Duration> {
    match v.as_str().map(parse_duration) {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            c.err(path, e);
            None
        }
        None => {
            c.err(path, "expected a duration with a unit, like 5s or 5m");
            None
        }
    }
}

/// A YAML value for messages: `abc` (quoted), 1.5, true, null, `[1,2]` as JSON.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("`{s}`"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_string(),
        other => serde_json::to_string(other).unwrap_or_else(|_| "this value".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Env, Loaded, Purpose, parse};
    use crate::policy::Schedule;
    use crate::policy::limits::{Limits, Plan};
    use crate::policy::schedule::Phase;
    use crate::policy::sns::SnsPolicy;
    use std::time::Duration;

    struct NoEnv;
    impl Env for NoEnv {
        fn get(&self, _: &str) -> Option<String> {
            None
        }
    }

    /// The example delivery policy of the SNS documentation, verbatim.
    const SNS_REFERENCE: &str = r#"{ "healthyRetryPolicy": { "minDelayTarget": 1, "maxDelayTarget": 60, "numRetries": 50, "numNoDelayRetries": 3, "numMinDelayRetries": 2, "numMaxDelayRetries": 35, "backoffFunction": "exponential" }, "sicklyRetryPolicy": null, "throttlePolicy": { "maxReceivesPerSecond": 10 }, "guaranteed": false }"#;

    /// A config whose only destination has `retry:` lines `retry` (each
    /// indented by the caller to 6 spaces).
    fn config(retry: &str) -> String {
        format!(
            "destinations:\n  orders:\n    url: https://hooks.example.com/orders\n    retry:\n{retry}"
        )
    }

    fn load(retry: &str) -> Result<Loaded, Vec<String>> {
        parse("c.yaml", &config(retry), ".".into(), Purpose::Run, &NoEnv).map_err(|e| e.lines)
    }

    fn loaded(retry: &str) -> Loaded {
        match load(retry) {
            Ok(l) => l,
            Err(e) => panic!("rejected: {e:#?}\n{retry}"),
        }
    }

    fn one_error(retry: &str) -> String {
        match load(retry) {
            Ok(_) => panic!("accepted:\n{retry}"),
            Err(e) => {
                assert_eq!(e.len(), 1, "{e:#?}");
                e[0].clone()
            }
        }
    }

    fn schedule_and_limits(l: &Loaded) -> (&Schedule, Limits) {
        let d = &l.settings.destinations[0];
        (&d.schedule, d.limits)
    }

    #[test]
    fn the_sns_reference_delivery_policy_pastes_in_verbatim() {
        let l = loaded(&format!("      schedule:\n        sns: {SNS_REFERENCE}\n"));
        // `sicklyRetryPolicy: null` and `guaranteed: false` ask for nothing.
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        let d = &l.settings.destinations[0];
        assert_eq!(d.schedule, Schedule::Sns(SnsPolicy::reference()));
        assert_eq!(d.limits.max_attempts, 51);
        assert_eq!(d.rate_limit_per_second, Some(10));
        let plan = Plan::compute(&d.schedule, &d.limits);
        assert_eq!(plan.attempts.len(), 51);
        assert_eq!(plan.ends_at.as_secs(), 2209);
    }

    #[test]
    fn the_body_alone_and_the_yaml_block_form_give_the_same_policy() {
        let body = loaded(
            "      schedule:\n        sns: { minDelayTarget: 1, maxDelayTarget: 60, numRetries: 50, numNoDelayRetries: 3, numMinDelayRetries: 2, numMaxDelayRetries: 35, backoffFunction: exponential }\n",
        );
        assert_eq!(
            schedule_and_limits(&body).0,
            &Schedule::Sns(SnsPolicy::reference())
        );
        let block = loaded(
            "      schedule:\n        sns:\n          healthyRetryPolicy:\n            minDelayTarget: 1\n            maxDelayTarget: 60\n            numRetries: 50\n            numNoDelayRetries: 3\n            numMinDelayRetries: 2\n            numMaxDelayRetries: 35\n            backoffFunction: exponential\n",
        );
        assert_eq!(
            schedule_and_limits(&block).0,
            &Schedule::Sns(SnsPolicy::reference())
        );
    }

    #[test]
    fn sns_with_no_keys_is_three_retries_twenty_seconds_apart() {
        for retry in [
            "      schedule: { sns: {} }\n",
            "      schedule:\n        sns:\n",
            "      schedule: { sns: { healthyRetryPolicy: null } }\n",
        ] {
            let l = loaded(retry);
            let (schedule, limits) = schedule_and_limits(&l);
            assert_eq!(schedule, &Schedule::Sns(SnsPolicy::default()), "{retry}");
            assert_eq!(limits.max_attempts, 4);
            let plan = Plan::compute(schedule, &limits);
            let at: Vec<u64> = plan.attempts.iter().map(|a| a.at.as_secs()).collect();
            assert_eq!(at, [0, 20, 40, 60]);
        }
    }

    #[test]
    fn sns_ranges_name_the_key_the_value_and_what_is_allowed() {
        let sns = |body: &str| one_error(&format!("      schedule:\n        sns: {{ {body} }}\n"));
        let p = "destinations.orders.retry.schedule.sns";
        let cases = [
            (
                "minDelayTarget: 0",
                format!(
                    "c.yaml:6:32: {p}.minDelayTarget: 0 is out of range: allowed 1..=20 (seconds, up to maxDelayTarget = 20 (its default))"
                ),
            ),
            (
                "minDelayTarget: 61, maxDelayTarget: 60",
                format!(
                    "{p}.minDelayTarget: 61 is out of range: allowed 1..=60 (seconds, up to maxDelayTarget = 60)"
                ),
            ),
            (
                "minDelayTarget: 30",
                format!(
                    "{p}.minDelayTarget: 30 is out of range: allowed 1..=20 (seconds, up to maxDelayTarget = 20 (its default))"
                ),
            ),
            (
                "minDelayTarget: 0, maxDelayTarget: 0",
                format!(
                    "{p}.maxDelayTarget: 0 is out of range: allowed 1..=3600 (seconds, from minDelayTarget = 0)"
                ),
            ),
            (
                "maxDelayTarget: 10",
                format!(
                    "{p}.maxDelayTarget: 10 is out of range: allowed 20..=3600 (seconds, from minDelayTarget = 20 (its default))"
                ),
            ),
            (
                "maxDelayTarget: 3601",
                format!(
                    "{p}.maxDelayTarget: 3601 is out of range: allowed 20..=3600 (seconds, from minDelayTarget = 20 (its default))"
                ),
            ),
            (
                "numRetries: 101",
                format!("{p}.numRetries: 101 is out of range: allowed 0..=100"),
            ),
            (
                "numNoDelayRetries: -1",
                format!("{p}.numNoDelayRetries: -1 is not a whole number ≥ 0"),
            ),
            (
                "numMinDelayRetries: 1.5",
                format!("{p}.numMinDelayRetries: 1.5 is not a whole number ≥ 0"),
            ),
            (
                "minDelayTarget: 1s",
                format!("{p}.minDelayTarget: `1s` is not a whole number ≥ 0 of seconds"),
            ),
            (
                "numMaxDelayRetries: 4",
                format!(
                    "{p}.numRetries: numRetries 3 (its default) is less than the phases need: numNoDelayRetries 0 + numMinDelayRetries 0 + numMaxDelayRetries 4 = 4"
                ),
            ),
            (
                "numRetries: 5, numNoDelayRetries: 3, numMinDelayRetries: 3",
                format!(
                    "{p}.numRetries: numRetries 5 is less than the phases need: numNoDelayRetries 3 + numMinDelayRetries 3 + numMaxDelayRetries 0 = 6"
                ),
            ),
            (
                "backoffFunction: cubic",
                format!(
                    "{p}.backoffFunction: `cubic` is not a backoff function: allowed linear, arithmetic, geometric, exponential"
                ),
            ),
            (
                "numRetry: 5",
                format!(
                    "{p}.numRetry: unknown key `numRetry` in an SNS retry policy: allowed minDelayTarget, maxDelayTarget, numRetries, numNoDelayRetries, numMinDelayRetries, numMaxDelayRetries, backoffFunction"
                ),
            ),
        ];
        for (body, want) in cases {
            let e = sns(body);
            assert!(e.ends_with(&want), "{body}:\n got  {e}\n want …{want}");
        }
    }

    #[test]
    fn a_policy_over_3600s_of_retries_is_rejected_naming_its_total() {
        let e = one_error(
            "      schedule:\n        sns: { minDelayTarget: 60, maxDelayTarget: 600, numRetries: 12, numMaxDelayRetries: 2 }\n",
        );
        assert!(
            e.contains("destinations.orders.retry.schedule.sns: total retry time is 4500s (pre-backoff 0×60s + backoff 3300s + post-backoff 2×600s), more than SNS's limit of 3600s"),
            "{e}"
        );
        // Exactly 3600s is allowed.
        loaded(
            "      schedule:\n        sns: { minDelayTarget: 360, maxDelayTarget: 360, numRetries: 10 }\n",
        );
    }

    #[test]
    fn a_pasted_delivery_policy_checks_its_own_keys() {
        let e =
            one_error("      schedule:\n        sns: { healthyRetryPolicy: {}, numRetries: 5 }\n");
        assert!(
            e.contains("sns.numRetries: unknown key `numRetries` in an SNS delivery policy: allowed healthyRetryPolicy, throttlePolicy, sicklyRetryPolicy, guaranteed: in a pasted delivery policy it goes inside healthyRetryPolicy"),
            "{e}"
        );
        let e = one_error(
            "      schedule:\n        sns: { healthyRetryPolicy: { numRetries: 500 }, guaranteed: false }\n",
        );
        assert!(
            e.contains("sns.healthyRetryPolicy.numRetries: 500 is out of range: allowed 0..=100"),
            "{e}"
        );
        let e = one_error(
            "      schedule:\n        sns: { throttlePolicy: { maxReceivesPerSecond: 0 } }\n",
        );
        assert!(
            e.contains("sns.throttlePolicy.maxReceivesPerSecond: 0 is out of range: allowed a whole number from 1 to 4294967295"),
            "{e}"
        );
        let e = one_error("      schedule:\n        sns: { throttlePolicy: { maxReceives: 5 } }\n");
        assert!(
            e.contains(
                "sns.throttlePolicy.maxReceives: unknown key `maxReceives` in throttlePolicy"
            ),
            "{e}"
        );
        let e = one_error("      schedule:\n        sns: { guaranteed: maybe }\n");
        assert!(
            e.contains("sns.guaranteed: `maybe` is not true or false"),
            "{e}"
        );
    }

    #[test]
    fn deprecated_sns_attributes_are_ignored_with_a_warning_when_they_ask_for_something() {
        let l = loaded(
            "      schedule:\n        sns: { healthyRetryPolicy: { numRetries: 2 }, sicklyRetryPolicy: { numRetries: 9 }, guaranteed: true }\n",
        );
        assert_eq!(l.warnings.len(), 2, "{:#?}", l.warnings);
        assert!(l.warnings[0].contains("sns.sicklyRetryPolicy: deprecated by SNS and ignored"));
        assert!(l.warnings[1].contains("sns.guaranteed: deprecated by SNS and ignored"));
        assert_eq!(l.settings.destinations[0].limits.max_attempts, 3);
    }

    #[test]
    fn max_attempts_with_sns_must_be_left_to_num_retries() {
        let e = one_error("      schedule: { sns: { numRetries: 50 } }\n      max_attempts: 10\n");
        assert_eq!(
            e,
            "c.yaml:6:21: destinations.orders.retry.max_attempts: 10 does not apply to an sns schedule: it makes numRetries + 1 attempts; set numRetries instead and remove max_attempts"
        );
        // An explicit 30 is not the default: it is refused too.
        let e = one_error(
            "      schedule: { sns: { numRetries: 50, maxDelayTarget: 60 } }\n      max_attempts: 30\n",
        );
        assert!(e.contains("30 does not apply to an sns schedule"), "{e}");
        let l = loaded("      schedule: { sns: { numRetries: 50, maxDelayTarget: 60 } }\n");
        assert_eq!(l.settings.destinations[0].limits.max_attempts, 51);
    }

    /// `courier check` prints what is in force, and what it prints loads.
    #[test]
    fn the_effective_config_shows_the_default_max_attempts_but_not_beside_sns() {
        let l = loaded("      schedule: [5s]\n");
        assert!(l.effective.contains("max_attempts: 30"), "{}", l.effective);
        let l = loaded("      schedule: { sns: { numRetries: 5 } }\n");
        assert!(!l.effective.contains("max_attempts"), "{}", l.effective);
        let again = parse("c.yaml", &l.effective, ".".into(), Purpose::Run, &NoEnv)
            .unwrap_or_else(|e| panic!("the printed config is refused: {e:#?}"));
        assert_eq!(again.settings.destinations[0].limits.max_attempts, 6);
    }

    #[test]
    fn exponential_doubles_up_to_its_max() {
        let l = loaded(
            "      schedule:\n        exponential: { initial: 1s, max: 10m, multiplier: 2 }\n",
        );
        let (schedule, limits) = schedule_and_limits(&l);
        assert_eq!(
            schedule,
            &Schedule::Exponential {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(600),
                multiplier: 2.0
            }
        );
        assert_eq!(limits.max_attempts, 30);
        let plan = Plan::compute(schedule, &limits);
        let delays: Vec<u64> = plan
            .attempts
            .iter()
            .take(13)
            .map(|a| a.delay.as_secs())
            .collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert!(plan.attempts.iter().all(|a| a.phase == Phase::Exponential));
        // No keys: those same defaults.
        let bare = loaded("      schedule:\n        exponential:\n");
        assert_eq!(schedule_and_limits(&bare).0, schedule);
    }

    #[test]
    fn exponential_ranges() {
        let exp = |body: &str| {
            one_error(&format!(
                "      schedule:\n        exponential: {{ {body} }}\n"
            ))
        };
        let p = "destinations.orders.retry.schedule.exponential";
        let cases = [
            (
                "initial: 0s",
                format!("{p}.initial: 0s is out of range: allowed 1ms..=24h"),
            ),
            (
                "initial: 25h",
                format!("{p}.initial: 25h is out of range: allowed 1ms..=24h"),
            ),
            (
                "initial: 25h, max: 24h",
                format!("{p}.initial: 25h is out of range: allowed 1ms..=24h"),
            ),
            (
                "initial: 1h",
                format!("{p}.max: 10m is out of range: allowed 1h..=24h (at least initial)"),
            ),
            (
                "initial: 1m, max: 30s",
                format!("{p}.max: 30s is out of range: allowed 1m..=24h (at least initial)"),
            ),
            (
                "max: 25h",
                format!("{p}.max: 25h is out of range: allowed 1s..=24h (at least initial)"),
            ),
            (
                "multiplier: 11",
                format!("{p}.multiplier: 11 is out of range: allowed 1..=10"),
            ),
            (
                "multiplier: 0.5",
                format!("{p}.multiplier: 0.5 is out of range: allowed 1..=10"),
            ),
            (
                "multiplier: two",
                format!("{p}.multiplier: `two` is not a number: expected 1..=10, like 2 or 1.5"),
            ),
            (
                "initial: 5",
                format!("{p}.initial: expected a duration with a unit, like 5s or 5m"),
            ),
            (
                "factor: 2",
                format!("{p}.factor: unknown key `factor`: allowed initial, max, multiplier"),
            ),
        ];
        for (body, want) in cases {
            let e = exp(body);
            assert!(e.ends_with(&want), "{body}:\n got  {e}\n want …{want}");
        }
    }

    #[test]
    fn a_schedule_mapping_has_exactly_one_known_kind() {
        let e = one_error("      schedule: { fibonacci: {} }\n");
        assert!(
            e.contains("retry.schedule: `fibonacci` is not a schedule"),
            "{e}"
        );
        let e = one_error("      schedule: { exponential: {}, sns: {} }\n");
        assert!(
            e.contains(
                "retry.schedule: a schedule has exactly one kind, found `exponential`, `sns`"
            ),
            "{e}"
        );
        let e = one_error("      schedule: { sns: [1, 2] }\n");
        assert!(
            e.ends_with("retry.schedule.sns: [1,2] is not a mapping: expected keys minDelayTarget, maxDelayTarget, numRetries, numNoDelayRetries, numMinDelayRetries, numMaxDelayRetries, backoffFunction"),
            "{e}"
        );
    }

    #[test]
    fn eventgrid_and_lists_keep_their_max_attempts_range() {
        let e = one_error("      schedule: [5s, 1m]\n      max_attempts: 31\n");
        assert!(
            e.ends_with("retry.max_attempts: 31 is out of range: allowed 1..=30"),
            "{e}"
        );
        let e = one_error("      schedule: { exponential: {} }\n      max_attempts: 0\n");
        assert!(
            e.ends_with("retry.max_attempts: 0 is out of range: allowed 1..=30"),
            "{e}"
        );
        let l = loaded("      max_attempts: 5\n");
        let (schedule, limits) = schedule_and_limits(&l);
        assert_eq!((schedule, limits.max_attempts), (&Schedule::EventGrid, 5));
    }
}
