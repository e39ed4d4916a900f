use super::*;
use crate::event::Schema;
use crate::storage::StoreUrl;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

struct FakeEnv(HashMap<&'static str, &'static str>);
impl Env for FakeEnv {
    fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| v.to_string())
    }
}

/// `WHSEC_A`/`WHSEC_B`: the vector secret of `crate::event::signature`'s tests and
/// an unprefixed one; `WHSEC_BAD` is not base64.
fn env() -> FakeEnv {
    FakeEnv(HashMap::from([
        ("API_KEY", "s3cret"),
        ("WHSEC_A", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ("WHSEC_B", "c2Vjb25kIGtleQ=="),
        ("WHSEC_BAD", "whsec_hunter2!!"),
        ("ADMIN_TOKEN", "t0ken-for-admin"),
        ("BLANK", "  "),
        (
            "HANDOFF_KEYS",
            "q83vEjRWeJC6u8zd7v8AESIzRFVmd4iZqrvM3e7/ABE= AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        ),
        ("HANDOFF_SHORT", "AAECAw=="),
    ]))
}

const GOOD: &str = "\
listen: 127.0.0.1:8080
destinations:
  orders:
    url: https://hooks.example.com/orders?code=abc
    timeout: 5s
    retry:
      schedule: [50ms, 100ms]
      max_attempts: 3
    status:
      no_retry: [400, 5xx]
      min_delay: { 408: 2m, \"500-599\": 1s }
    headers:
      X-Api-Key: { from_env: API_KEY, secret: true }
      X-Tenant: { value: acme }
";

fn errors(text: &str) -> Vec<String> {
    match parse("c.yaml", text, ".".into(), Purpose::Run, &env()) {
        Ok(_) => panic!("config was accepted:\n{text}"),
        Err(e) => e.lines,
    }
}

fn one_error(text: &str) -> String {
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:#?}");
    e[0].clone()
}

#[test]
fn a_good_config_fills_defaults_and_masks_nothing_it_need_not() {
    let loaded = parse("c.yaml", GOOD, "/etc/courier".into(), Purpose::Run, &env()).expect("valid");
    let s = &loaded.settings;
    assert_eq!(s.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(
        s.journal.dir,
        std::path::Path::new("/etc/courier/./data/journal")
    );
    let d = &s.destinations[0];
    assert_eq!(d.concurrency, 16);
    let by_mode = "destinations:\n  a: { url: http://127.0.0.1:9/a, mode: passthrough }\n  b: { url: http://127.0.0.1:9/b, mode: passthrough, concurrency: 8 }\n";
    let loaded = parse("c.yaml", by_mode, ".".into(), Purpose::Run, &env()).expect("valid");
    let limits: Vec<usize> = loaded
        .settings
        .destinations
        .iter()
        .map(|d| d.concurrency)
        .collect();
    assert_eq!(
        limits,
        [256, 8],
        "passthrough's default, then a configured one"
    );
    assert!(
        loaded.effective.contains("concurrency: 256"),
        "{}",
        loaded.effective
    );
    assert_eq!(d.limits.ttl.as_secs(), 86_400);
    assert_eq!(
        d.target.url("/x", Some("y=1")),
        "https://hooks.example.com/orders/x?code=abc&y=1"
    );
    assert_eq!(d.headers.len(), 2);
    assert!(
        d.headers
            .iter()
            .any(|h| h.name == "x-api-key" && matches!(&h.value, settings::HeaderSource::Fixed(v) if v == "s3cret" && v.is_sensitive()))
    );
    assert!(
        loaded.effective.contains("event_ttl: 24h"),
        "{}",
        loaded.effective
    );
    assert!(!loaded.effective.contains("s3cret"));
}

#[test]
fn secret_literal_values_are_masked_in_the_effective_config() {
    let text = GOOD.replace("{ value: acme }", "{ value: hunter2, secret: true }");
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    assert!(!loaded.effective.contains("hunter2"));
    assert!(loaded.effective.contains("********"));
}

#[test]
fn url_query_values_are_masked_in_the_effective_config() {
    let text = GOOD.replace(
        "url: https://hooks.example.com/orders?code=abc",
        "url: https://hooks.example.com/orders?code=t0ken&flag&x=",
    );
    assert_ne!(text, GOOD, "the fixture names the url");
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    assert!(!loaded.effective.contains("t0ken"), "{}", loaded.effective);
    assert!(
        loaded
            .effective
            .contains("https://hooks.example.com/orders?code=********&flag&x="),
        "{}",
        loaded.effective
    );
}

#[test]
fn unknown_key_names_path_line_and_column() {
    let e = one_error(&GOOD.replace("    timeout: 5s", "    timeout: 5s\n    timout: 5s"));
    assert!(
        e.starts_with("c.yaml:6:5: destinations.orders: unknown key `timout`; expected one of url, mode, schema, eventgrid_topic, timeout, "),
        "{e}"
    );
}

/// A block that may also be a keyword names a wrong key inside it with the
/// keys allowed, as any other block does.
#[test]
fn a_wrong_key_in_a_keyword_or_block_value_names_the_keys_allowed() {
    let e = one_error(&GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    ordering: { key: { header: X, heder: Y } }",
    ));
    assert!(
        e.ends_with("destinations.orders.ordering.key: unknown key `heder`; expected one of header, from_event"),
        "{e}"
    );
    let e = one_error(&GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    dead_letter: { dir: ./dl, redact: [x] }",
    ));
    assert!(
        e.ends_with("destinations.orders.dead_letter: unknown key `redact`; expected one of dir, url, redact_headers, keep_headers"),
        "{e}"
    );
    let e = one_error(&GOOD.replace("    timeout: 5s", "    timeout: 5s\n    dead_letter: [x]"));
    assert!(
        e.ends_with("destinations.orders.dead_letter: expected `none` or a mapping with `dir` or `url`, found a list"),
        "{e}"
    );
}

#[test]
fn max_attempts_out_of_range() {
    let e = one_error(&GOOD.replace("max_attempts: 3", "max_attempts: 31"));
    assert_eq!(
        e,
        "c.yaml:8:21: destinations.orders.retry.max_attempts: 31 is out of range: allowed 1..=30"
    );
}

#[test]
fn ttl_out_of_range() {
    let e = one_error(&GOOD.replace("max_attempts: 3", "max_attempts: 3\n      event_ttl: 30s"));
    assert_eq!(
        e,
        "c.yaml:9:18: destinations.orders.retry.event_ttl: 30s is out of range: allowed 1m..=24h"
    );
}

#[test]
fn jitter_out_of_range() {
    let e = one_error(&GOOD.replace("max_attempts: 3", "max_attempts: 3\n      jitter: 0.9"));
    assert_eq!(
        e,
        "c.yaml:9:15: destinations.orders.retry.jitter: 0.9 is out of range: allowed 0..=0.5"
    );
}

#[test]
fn bad_duration_in_a_list_names_the_item() {
    let e = one_error(&GOOD.replace("[50ms, 100ms]", "[50ms, soon]"));
    assert!(
        e.starts_with(
            "c.yaml:7:24: destinations.orders.retry.schedule[1]: invalid duration `soon`"
        ),
        "{e}"
    );
}

#[test]
fn bad_url_and_scheme() {
    let e = one_error(&GOOD.replace("https://hooks.example.com/orders?code=abc", "ftp://x/y"));
    assert_eq!(
        e,
        "c.yaml:4:10: destinations.orders.url: `ftp://x/y` has scheme `ftp`: allowed http, https"
    );
    let e = one_error(&GOOD.replace("https://hooks.example.com/orders?code=abc", "not a url"));
    assert!(
        e.starts_with("c.yaml:4:10: destinations.orders.url: `not a url` is not"),
        "{e}"
    );
}

#[test]
fn bad_status_code_and_listen_address() {
    let e = one_error(&GOOD.replace("[400, 5xx]", "[400, 700]"));
    assert!(
        e.starts_with(
            "c.yaml:10:23: destinations.orders.status.no_retry[1]: `700` is not a status"
        ),
        "{e}"
    );
    let e = one_error(&GOOD.replace("127.0.0.1:8080", "localhost"));
    assert!(
        e.starts_with("c.yaml:1:9: listen: `localhost` is not an address"),
        "{e}"
    );
}

#[test]
fn missing_secret_env_is_an_error_for_run_and_a_warning_for_check() {
    let text = GOOD.replace("API_KEY", "MISSING_KEY");
    let e = one_error(&text);
    assert_eq!(
        e,
        "c.yaml:13:30: destinations.orders.headers.X-Api-Key.from_env: environment variable MISSING_KEY is not set"
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Check, &env()).expect("check passes");
    assert_eq!(loaded.warnings.len(), 1);
}

#[test]
fn reserved_and_too_many_headers() {
    let e = one_error(&GOOD.replace("X-Tenant: { value: acme }", "webhook-id: { value: x }"));
    assert!(
        e.contains("destinations.orders.headers.webhook-id: `webhook-id` is set by courier"),
        "{e}"
    );
    let many: String = (0..11)
        .map(|i| format!("      H{i}: {{ value: v }}\n"))
        .collect();
    let text = GOOD.replace(
        "      X-Api-Key: { from_env: API_KEY, secret: true }\n      X-Tenant: { value: acme }\n",
        &many,
    );
    let e = one_error(&text);
    assert_eq!(
        e,
        "c.yaml:13:7: destinations.orders.headers: 11 headers: at most 10 are allowed"
    );
    let ten: String = (0..10)
        .map(|i| format!("      H{i}: {{ value: v }}\n"))
        .collect();
    let text = GOOD.replace(
        "      X-Api-Key: { from_env: API_KEY, secret: true }\n      X-Tenant: { value: acme }\n",
        &ten,
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("10 are fine");
    assert_eq!(loaded.settings.destinations[0].headers.len(), 10);
}

#[test]
fn header_values_longer_than_4096_bytes_are_refused() {
    let long = "v".repeat(4097);
    let e = one_error(&GOOD.replace("{ value: acme }", &format!("{{ value: {long} }}")));
    assert_eq!(
        e,
        "c.yaml:14:17: destinations.orders.headers.X-Tenant: value is 4097 bytes: at most 4096 are allowed"
    );
    let max = "v".repeat(4096);
    let text = GOOD.replace("{ value: acme }", &format!("{{ value: {max} }}"));
    assert!(parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).is_ok());
    // From the environment: checked when read, and the value is not shown.
    let big: &'static str = Box::leak("s".repeat(5000).into_boxed_str());
    let env = FakeEnv(HashMap::from([("API_KEY", big)]));
    let e = match parse("c.yaml", GOOD, ".".into(), Purpose::Run, &env) {
        Ok(_) => panic!("accepted a 5000-byte header"),
        Err(e) => e.lines,
    };
    assert_eq!(
        e,
        [
            "c.yaml:13:30: destinations.orders.headers.X-Api-Key.from_env: value of environment variable API_KEY is 5000 bytes: at most 4096 are allowed"
        ]
    );
}

#[test]
fn header_names_differing_only_in_case_are_one_header() {
    let e = one_error(&GOOD.replace("X-Tenant:", "x-api-key:"));
    assert!(
        e.contains("destinations.orders.headers.x-api-key: `x-api-key` is already set: header names ignore case"),
        "{e}"
    );
}

#[test]
fn from_event_paths_are_checked_at_load() {
    let text = GOOD.replace("{ value: acme }", "{ from_event: data.tenant }");
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    assert!(
        loaded.settings.destinations[0]
            .headers
            .iter()
            .any(|h| matches!(
                &h.value,
                settings::HeaderSource::FromEvent { path, .. } if path.as_str() == "data.tenant"
            ))
    );
    assert!(
        loaded.effective.contains("from_event: data.tenant"),
        "{}",
        loaded.effective
    );
    let e = one_error(&GOOD.replace("{ value: acme }", "{ from_event: data..tenant }"));
    assert_eq!(
        e,
        "c.yaml:14:31: destinations.orders.headers.X-Tenant.from_event: `data..tenant` has an empty segment: write dot-separated field names, like data.tenant"
    );
    let e = one_error(&GOOD.replace("{ value: acme }", "{ from_event: \"\" }"));
    assert!(e.contains("X-Tenant.from_event: the path is empty"), "{e}");
    let e = one_error(&GOOD.replace("{ value: acme }", "{ value: acme, from_event: subject }"));
    assert!(
        e.contains("needs exactly one of value, from_env, from_event"),
        "{e}"
    );
}

const SIGNED: &str = "    signing: { secrets_from_env: [WHSEC_A, WHSEC_B] }\n";

fn with_signing(signing: &str) -> String {
    GOOD.replace("    headers:\n", &format!("{signing}    headers:\n"))
}

#[test]
fn signing_secrets_are_read_and_never_printed() {
    let loaded = parse(
        "c.yaml",
        &with_signing(SIGNED),
        ".".into(),
        Purpose::Run,
        &env(),
    )
    .expect("valid");
    let d = &loaded.settings.destinations[0];
    assert_eq!(d.signing.len(), 2);
    assert_eq!(
        d.signing[0],
        crate::event::signature::Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("valid")
    );
    assert!(
        loaded
            .effective
            .contains("secrets_from_env:\n      - WHSEC_A\n      - WHSEC_B"),
        "{}",
        loaded.effective
    );
    for secret in ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "c2Vjb25kIGtleQ"] {
        assert!(!loaded.effective.contains(secret));
        assert!(!format!("{:?}", loaded.settings).contains(secret));
    }
}

#[test]
fn signing_secret_count_is_checked() {
    let e = one_error(&with_signing("    signing: { secrets_from_env: [] }\n"));
    assert_eq!(
        e,
        "c.yaml:12:34: destinations.orders.signing.secrets_from_env: 0 secrets is out of range: allowed 1..=3"
    );
    let e = one_error(&with_signing(
        "    signing: { secrets_from_env: [WHSEC_A, WHSEC_A, WHSEC_B, WHSEC_B] }\n",
    ));
    assert!(
        e.contains("4 secrets is out of range: allowed 1..=3"),
        "{e}"
    );
}

#[test]
fn a_missing_signing_variable_is_an_error_for_run_and_a_warning_for_check() {
    let text = with_signing("    signing: { secrets_from_env: [WHSEC_A, NO_SUCH_SECRET] }\n");
    let e = one_error(&text);
    assert_eq!(
        e,
        "c.yaml:12:44: destinations.orders.signing.secrets_from_env[1]: environment variable NO_SUCH_SECRET is not set"
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Check, &env()).expect("check passes");
    assert_eq!(
        loaded.warnings,
        [
            "c.yaml:12:44: destinations.orders.signing.secrets_from_env[1]: environment variable NO_SUCH_SECRET is not set"
        ]
    );
}

#[test]
fn a_signing_secret_that_is_not_base64_names_the_variable_not_the_value() {
    let e = one_error(&with_signing(
        "    signing: { secrets_from_env: [WHSEC_BAD] }\n",
    ));
    assert_eq!(
        e,
        "c.yaml:12:35: destinations.orders.signing.secrets_from_env[0]: environment variable WHSEC_BAD is not valid base64 after the optional whsec_ prefix"
    );
    assert!(!e.contains("hunter2"));
    // Also for `check`: a present but broken secret is an error there too.
    assert!(
        parse(
            "c.yaml",
            &with_signing("    signing: { secrets_from_env: [WHSEC_BAD] }\n"),
            ".".into(),
            Purpose::Check,
            &env()
        )
        .is_err()
    );
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let text = GOOD
        .replace("max_attempts: 3", "max_attempts: 0\n      jitter: -1")
        .replace("timeout: 5s", "timeout: 0s");
    let e = errors(&text);
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(
        e.iter()
            .any(|l| l.contains("destinations.orders.timeout: 0s is out of range"))
    );
    assert!(
        e.iter()
            .any(|l| l.contains("max_attempts: 0 is out of range"))
    );
    assert!(e.iter().any(|l| l.contains("jitter: -1 is out of range")));
}

#[test]
fn passthrough_takes_a_deadline_defaulting_to_10s_within_its_range() {
    let loaded = parse("c.yaml", GOOD, ".".into(), Purpose::Run, &env()).expect("valid");
    let d = &loaded.settings.destinations[0];
    assert_eq!(
        (d.mode, d.passthrough_deadline),
        (Mode::Durable, Duration::from_secs(10))
    );
    let text = GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    mode: passthrough\n    passthrough_deadline: 2500ms",
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    let d = &loaded.settings.destinations[0];
    assert_eq!(
        (d.mode, d.passthrough_deadline),
        (Mode::Passthrough, Duration::from_millis(2500))
    );
    let e = one_error(&GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    passthrough_deadline: 11m",
    ));
    assert!(
        e.starts_with("c.yaml:6:27: destinations.orders.passthrough_deadline: 11m is out of range"),
        "{e}"
    );
}

#[test]
fn passthrough_refuses_what_it_cannot_do_with_positions() {
    let with = |extra: &str| {
        GOOD.replace(
            "    timeout: 5s",
            &format!("    timeout: 5s\n    mode: passthrough\n{extra}"),
        )
    };
    let e = one_error(&with("    schema: eventgrid"));
    assert!(
        e.starts_with("c.yaml:7:13: destinations.orders.schema: passthrough forwards the app's request as it is, so its schema must be custom, not eventgrid"),
        "{e}"
    );
    let e = one_error(&with("    batch: { max_events: 10 }"));
    assert!(
        e.starts_with("c.yaml:7:26: destinations.orders.batch.max_events: passthrough sends each request alone"),
        "{e}"
    );
    let e = one_error(&with("    rate_limit: { per_second: 5 }"));
    assert!(
        e.starts_with(
            "c.yaml:7:17: destinations.orders.rate_limit: passthrough goes at the app's pace"
        ),
        "{e}"
    );
    let topic = "destinations:\n  orders: { url: http://127.0.0.1:9/o, schema: eventgrid, mode: passthrough }\ntopics:\n  shop:\n    schema: eventgrid\n    subscribers: { orders: {} }\n";
    let e = errors(topic);
    assert!(
        e.iter()
            .any(|l| l
                .contains("topics.shop.subscribers.orders: destination `orders` is passthrough")),
        "{e:#?}"
    );
}

#[test]
fn adaptive_concurrency_is_read_into_bounds_capped_at_max_and_printed_whole() {
    use crate::policy::adaptive::Bounds;
    let with = |block: &str| {
        GOOD.replace(
            "    timeout: 5s",
            &format!("    timeout: 5s\n    concurrency: {block}"),
        )
    };
    for (block, want) in [
        ("{ adaptive: {} }", Bounds::DEFAULT),
        (
            "{ adaptive: { min: 2, max: 32, initial: 8 } }",
            Bounds {
                min: 2,
                max: 32,
                initial: 8,
            },
        ),
        (
            "{ adaptive: { max: 4, initial: 4 } }",
            Bounds {
                min: 1,
                max: 4,
                initial: 4,
            },
        ),
    ] {
        let loaded = parse("c.yaml", &with(block), ".".into(), Purpose::Run, &env())
            .unwrap_or_else(|e| panic!("{block}: {e}"));
        let d = &loaded.settings.destinations[0];
        assert_eq!(d.adaptive, Some(want), "{block}");
        assert_eq!(d.concurrency, want.max, "{block}: the cap is max");
        // Every key shown, and the printed config reads back the same.
        let line = format!(
            "  concurrency:\n      adaptive:\n        min: {}\n        max: {}\n        initial: {}\n",
            want.min, want.max, want.initial
        );
        assert!(loaded.effective.contains(&line), "{}", loaded.effective);
        let again = parse(
            "c.yaml",
            &loaded.effective,
            ".".into(),
            Purpose::Run,
            &env(),
        )
        .expect("the effective config is valid");
        assert_eq!(again.settings.destinations[0].adaptive, Some(want));
    }
    let loaded = parse("c.yaml", &with("24"), ".".into(), Purpose::Run, &env()).expect("valid");
    let d = &loaded.settings.destinations[0];
    assert_eq!((d.concurrency, d.adaptive), (24, None));
}

#[test]
fn adaptive_bounds_are_checked_with_key_paths_and_positions() {
    let with = |block: &str| {
        GOOD.replace(
            "    timeout: 5s",
            &format!("    timeout: 5s\n    concurrency: {block}"),
        )
    };
    let cases = [
        (
            "{ adaptive: { min: 1, maxx: 3 } }",
            "c.yaml:6:40: destinations.orders.concurrency.adaptive: unknown key `maxx`; expected one of min, max, initial",
        ),
        (
            "{ adaptve: {} }",
            "c.yaml:6:18: destinations.orders.concurrency: missing key `adaptive`\n\
             c.yaml:6:20: destinations.orders.concurrency: unknown key `adaptve`; expected adaptive",
        ),
        (
            "{ adaptive: { max: 8 } }",
            "c.yaml:6:30: destinations.orders.concurrency.adaptive.initial: 16 (the default) is out of range: allowed min..=max, here 1..=8",
        ),
        (
            "{ adaptive: { min: 4, max: 32, initial: 2 } }",
            "c.yaml:6:58: destinations.orders.concurrency.adaptive.initial: 2 is out of range: allowed min..=max, here 4..=32",
        ),
        (
            "{ adaptive: { min: 10, max: 4, initial: 5 } }",
            "c.yaml:6:46: destinations.orders.concurrency.adaptive.max: 4 is less than min (10)",
        ),
        (
            "{ adaptive: { min: 300 } }",
            "c.yaml:6:30: destinations.orders.concurrency.adaptive.max: 256 (the default) is less than min (300)",
        ),
        (
            "{ adaptive: { max: 2000, initial: 0 } }",
            "c.yaml:6:37: destinations.orders.concurrency.adaptive.max: 2000 is out of range: allowed 1..=1024\n\
             c.yaml:6:52: destinations.orders.concurrency.adaptive.initial: 0 is out of range: allowed 1..=1024",
        ),
        (
            "{ adaptive: 8 }",
            "c.yaml:6:30: destinations.orders.concurrency.adaptive: expected a mapping, found `8`",
        ),
        (
            "-1",
            "c.yaml:6:18: destinations.orders.concurrency: expected a whole number or `{ adaptive: { min, max, initial } }`, found `-1`",
        ),
    ];
    for (block, want) in cases {
        assert_eq!(errors(&with(block)).join("\n"), want, "{block}");
    }
    let passthrough = GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    mode: passthrough\n    concurrency: { adaptive: {} }",
    );
    let e = one_error(&passthrough);
    assert!(
        e.starts_with("c.yaml:7:30: destinations.orders.concurrency.adaptive: passthrough goes at the app's pace"),
        "{e}"
    );
}

#[test]
fn batch_defaults_off_and_its_ranges_are_checked_with_positions() {
    let loaded = parse("c.yaml", GOOD, ".".into(), Purpose::Run, &env()).expect("valid");
    let b = loaded.settings.destinations[0].batch;
    assert_eq!(
        (b.max_events, b.preferred_size, b.enabled()),
        (1, 64 * 1024, false)
    );
    let text = GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    batch: { max_events: 100, preferred_size: 4KiB }",
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    let b = loaded.settings.destinations[0].batch;
    assert_eq!(
        (b.max_events, b.preferred_size, b.enabled()),
        (100, 4096, true)
    );
    let e = one_error(&GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    batch:\n      max_events: 5001",
    ));
    assert!(
        e.starts_with("c.yaml:7:19: destinations.orders.batch.max_events: 5001 is out of range: allowed 1..=5000"),
        "{e}"
    );
    let e = errors(&GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    batch: { max_events: 0, preferred_size: 2MiB }",
    ));
    assert_eq!(
        e,
        [
            "c.yaml:6:26: destinations.orders.batch.max_events: 0 is out of range: allowed 1..=5000",
            "c.yaml:6:45: destinations.orders.batch.preferred_size: 2097152 is out of range: allowed 1024..=1048576",
        ]
    );
    let e = one_error(&GOOD.replace(
        "    timeout: 5s",
        "    timeout: 5s\n    batch: { preferred_size: 1000 }",
    ));
    assert!(
        e.contains("batch.preferred_size: 1000 is out of range"),
        "{e}"
    );
}

#[test]
fn yaml_syntax_and_type_errors_have_positions() {
    let e = one_error("listen: [unclosed\n");
    assert!(e.starts_with("c.yaml:"), "{e}");
    let e = one_error(&GOOD.replace("max_attempts: 3", "max_attempts: many"));
    assert!(
        e == "c.yaml:8:21: destinations.orders.retry.max_attempts: expected a whole number, found \"many\"",
        "{e}"
    );
}

#[test]
fn every_schema_is_accepted() {
    for schema in ["custom", "eventgrid", "cloudevents"] {
        let text = GOOD.replace(
            "    timeout: 5s",
            &format!("    timeout: 5s\n    schema: {schema}"),
        );
        let loaded =
            parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("schema accepted");
        assert_eq!(loaded.settings.destinations[0].schema.as_str(), schema);
    }
    let e = one_error(&GOOD.replace("    timeout: 5s", "    timeout: 5s\n    schema: json"));
    assert!(e.contains("destinations.orders.schema"), "{e}");
}

/// Two eventgrid destinations, one cloudevents and one custom, and a topic.
const TOPICS: &str = "\
destinations:
  orders: { url: http://127.0.0.1:9/o, schema: eventgrid }
  audit: { url: http://127.0.0.1:9/a, schema: eventgrid }
  ce: { url: http://127.0.0.1:9/c, schema: cloudevents }
  raw: { url: http://127.0.0.1:9/r }
topics:
  shop:
    schema: eventgrid
    subscribers:
      orders: { event_types: [Shop.OrderCreated], subject_begins_with: /Orders/ }
      audit: {}
";

#[test]
fn a_topic_is_checked_into_settings_and_printed_in_the_effective_config() {
    let loaded = parse("c.yaml", TOPICS, ".".into(), Purpose::Run, &env()).expect("valid");
    let t = loaded.settings.topic("shop").expect("topic");
    assert_eq!(t.schema, Schema::Eventgrid);
    let names: Vec<&str> = t
        .subscribers
        .iter()
        .map(|s| s.destination.as_str())
        .collect();
    assert_eq!(names, ["audit", "orders"]);
    let orders = &t.subscribers[1];
    // Lowered for case-insensitive matching, as Event Grid compares.
    assert_eq!(
        orders.event_types,
        Some(vec!["shop.ordercreated".to_string()])
    );
    assert_eq!(orders.subject_begins_with.as_deref(), Some("/orders/"));
    assert_eq!(t.subscribers[0].event_types, None);
    assert!(loaded.effective.contains("topics:"), "{}", loaded.effective);
    assert!(
        loaded.effective.contains("subject_begins_with: /Orders/"),
        "{}",
        loaded.effective
    );
}

#[test]
fn eventgrid_topics_default_to_the_route_name_and_are_printed() {
    let loaded = parse("c.yaml", TOPICS, ".".into(), Purpose::Run, &env()).expect("valid");
    let s = &loaded.settings;
    assert_eq!(
        s.topic("shop").expect("topic").eventgrid_topic,
        "/courier/shop"
    );
    assert_eq!(
        s.destination("orders").expect("orders").eventgrid_topic,
        "/courier/orders"
    );
    for line in [
        "eventgrid_topic: /courier/shop",
        "eventgrid_topic: /courier/orders",
    ] {
        assert!(loaded.effective.contains(line), "{}", loaded.effective);
    }
    assert_eq!(
        loaded.effective.matches("eventgrid_topic").count(),
        3,
        "the three eventgrid routes only: {}",
        loaded.effective
    );

    let text = TOPICS
        .replace(
            "schema: eventgrid }\n  audit",
            "schema: eventgrid, eventgrid_topic: /subscriptions/x/topics/orders }\n  audit",
        )
        .replace(
            "    schema: eventgrid\n    subscribers",
            "    schema: eventgrid\n    eventgrid_topic: shop-topic\n    subscribers",
        );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    let s = &loaded.settings;
    assert_eq!(
        s.topic("shop").expect("topic").eventgrid_topic,
        "shop-topic"
    );
    assert_eq!(
        s.destination("orders").expect("orders").eventgrid_topic,
        "/subscriptions/x/topics/orders"
    );
}

#[test]
fn an_eventgrid_topic_is_refused_empty_or_beside_another_schema() {
    let e = one_error(&TOPICS.replace(
        "schema: cloudevents }",
        "schema: cloudevents, eventgrid_topic: /t }",
    ));
    assert_eq!(
        e,
        "c.yaml:4:74: destinations.ce.eventgrid_topic: applies to schema eventgrid only (this is cloudevents): it names the Event Grid topic of the events"
    );
    let e = one_error(&TOPICS.replace("/r }", "/r, eventgrid_topic: /t }"));
    assert!(
        e.contains(
            "destinations.raw.eventgrid_topic: applies to schema eventgrid only (this is custom)"
        ),
        "{e}"
    );
    let e = one_error(&TOPICS.replace(
        "    schema: eventgrid\n    subscribers",
        "    schema: eventgrid\n    eventgrid_topic: \" \"\n    subscribers",
    ));
    assert_eq!(
        e,
        "c.yaml:9:22: topics.shop.eventgrid_topic: must not be empty: omit the key for /courier/<name>"
    );
}

#[test]
fn a_case_sensitive_subscriber_keeps_its_subject_filters_as_written() {
    let text = TOPICS.replace(
        "audit: {}",
        "audit: { subject_ends_with: .JPG, subject_case_sensitive: true }",
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    let t = loaded.settings.topic("shop").expect("topic");
    assert_eq!(t.subscribers[0].subject_ends_with.as_deref(), Some(".JPG"));
    assert!(t.subscribers[0].subject_case_sensitive);
}

#[test]
fn a_topic_named_like_a_destination_is_refused() {
    let e = one_error(&TOPICS.replace("  shop:\n", "  audit:\n"));
    assert_eq!(
        e,
        "c.yaml:8:5: topics.audit: `audit` is also a destination: a name is either a topic or a destination, since the app posts to /audit"
    );
}

#[test]
fn a_topic_needs_an_eventgrid_or_cloudevents_schema() {
    let e = one_error(&TOPICS.replace("    schema: eventgrid\n    subscribers", "    subscribers"));
    assert_eq!(
        e,
        "c.yaml:8:5: topics.shop: needs `schema: eventgrid` or `schema: cloudevents`"
    );
    let e = one_error(&TOPICS.replace(
        "    schema: eventgrid\n    subscribers",
        "    schema: custom\n    subscribers",
    ));
    assert!(
        e.starts_with("c.yaml:8:13: topics.shop.schema: custom is not a topic schema"),
        "{e}"
    );
}

#[test]
fn a_topic_needs_subscribers() {
    let text = "destinations:\n  orders: { url: http://127.0.0.1:9/o, schema: eventgrid }\ntopics:\n  shop:\n    schema: eventgrid\n    subscribers: {}\n";
    let e = one_error(text);
    assert!(
        e.starts_with("c.yaml:6:18: topics.shop.subscribers: at least one subscriber is needed"),
        "{e}"
    );
    // Without the key, the error points at the topic.
    let e = one_error(&text.replace("    subscribers: {}\n", ""));
    assert!(
        e.starts_with("c.yaml:5:5: topics.shop.subscribers: at least one subscriber is needed"),
        "{e}"
    );
}

#[test]
fn a_subscriber_must_be_a_destination_of_the_topics_schema() {
    let e = one_error(&TOPICS.replace("audit: {}", "audti: {}"));
    assert_eq!(
        e,
        "c.yaml:11:14: topics.shop.subscribers.audti: `audti` is not a configured destination: subscribers are destinations (audit, ce, orders, raw)"
    );
    let e = errors(&TOPICS.replace("audit: {}", "ce: {}\n      raw: {}"));
    assert_eq!(
        e,
        [
            "c.yaml:11:11: topics.shop.subscribers.ce: destination `ce` has schema cloudevents, topic `shop` has eventgrid: a subscriber gets the topic's events unchanged, so its schema must be eventgrid",
            "c.yaml:12:12: topics.shop.subscribers.raw: destination `raw` has schema custom, topic `shop` has eventgrid: a subscriber gets the topic's events unchanged, so its schema must be eventgrid",
        ]
    );
}

#[test]
fn empty_filter_strings_are_refused() {
    let e = errors(&TOPICS.replace(
        "audit: {}",
        "audit: { event_types: [A, \"\"], subject_begins_with: \"\", subject_ends_with: \"\" }",
    ));
    assert_eq!(
        e,
        [
            "c.yaml:11:33: topics.shop.subscribers.audit.event_types[1]: must not be empty",
            "c.yaml:11:59: topics.shop.subscribers.audit.subject_begins_with: must not be empty: omit the key to take every subject",
            "c.yaml:11:82: topics.shop.subscribers.audit.subject_ends_with: must not be empty: omit the key to take every subject",
        ]
    );
    let e = one_error(&TOPICS.replace("audit: {}", "audit: { event_types: [] }"));
    assert_eq!(
        e,
        "c.yaml:11:29: topics.shop.subscribers.audit.event_types: must list at least one event type: omit the key to take every type"
    );
}

#[test]
fn unknown_keys_in_a_topic_or_subscriber_are_refused() {
    let e = one_error(&TOPICS.replace("audit: {}", "audit: { subject_begins: /x }"));
    assert!(
        e.contains("topics.shop.subscribers.audit: unknown key `subject_begins`; expected one of event_types, subject_begins_with"),
        "{e}"
    );
    let e = one_error(&TOPICS.replace(
        "    schema: eventgrid\n",
        "    schema: eventgrid\n    filter: {}\n",
    ));
    assert!(
        e.contains("topics.shop: unknown key `filter`; expected one of schema, eventgrid_topic, subscribers"),
        "{e}"
    );
}

/// Relative data paths, one destination on the global sink and one with
/// its own; an absolute journal path that `state_dir` must not move.
const STATE: &str = "\
journal: { dir: ./data/journal }
dead_letter: { dir: data/dead-letter }
destinations:
  a: { url: http://127.0.0.1:9/a }
  b: { url: http://127.0.0.1:9/b, dead_letter: { dir: ./own } }
";

/// Journal dir, `a`'s and `b`'s dead-letter dirs, and the effective config,
/// for a config in /etc/courier with `extra` keys and `COURIER_STATE_DIR`.
fn state_paths(extra: &str, var: Option<&'static str>) -> (PathBuf, PathBuf, PathBuf, String) {
    let env = FakeEnv(var.map(|v| (STATE_DIR_ENV, v)).into_iter().collect());
    let text = format!("{extra}{STATE}");
    let loaded = parse("c.yaml", &text, "/etc/courier".into(), Purpose::Run, &env)
        .unwrap_or_else(|e| panic!("rejected: {e}\n{text}"));
    let s = &loaded.settings;
    let sink = |name: &str| match s.destination(name).and_then(|d| d.dead_letter.clone()) {
        Some(crate::config::SinkAt::Dir(dir)) => dir,
        other => panic!("{name} has no directory sink: {other:?}"),
    };
    (
        s.journal.dir.clone(),
        sink("a"),
        sink("b"),
        loaded.effective,
    )
}

#[test]
fn without_state_dir_relative_paths_resolve_in_the_config_folder() {
    let (journal, a, b, effective) = state_paths("", None);
    assert_eq!(journal, Path::new("/etc/courier/data/journal"));
    assert_eq!(a, Path::new("/etc/courier/data/dead-letter"));
    assert_eq!(b, Path::new("/etc/courier/own"));
    assert!(
        effective.contains("state_dir: /etc/courier\n"),
        "{effective}"
    );
}

#[test]
fn the_state_dir_variable_moves_relative_paths_when_the_key_is_absent() {
    let (journal, a, b, effective) = state_paths("", Some("/var/lib/courier"));
    assert_eq!(journal, Path::new("/var/lib/courier/data/journal"));
    assert_eq!(a, Path::new("/var/lib/courier/data/dead-letter"));
    assert_eq!(b, Path::new("/var/lib/courier/own"));
    assert!(
        effective.contains("state_dir: /var/lib/courier\n"),
        "{effective}"
    );
}

#[test]
fn the_state_dir_key_wins_over_the_variable() {
    let (journal, a, b, _) = state_paths("state_dir: /srv/state\n", Some("/var/lib/courier"));
    assert_eq!(journal, Path::new("/srv/state/data/journal"));
    assert_eq!(a, Path::new("/srv/state/data/dead-letter"));
    assert_eq!(b, Path::new("/srv/state/own"));
}

#[test]
fn a_relative_state_dir_resolves_in_the_config_folder() {
    let (journal, a, b, effective) = state_paths("state_dir: ./state\n", None);
    assert_eq!(journal, Path::new("/etc/courier/state/data/journal"));
    assert_eq!(a, Path::new("/etc/courier/state/data/dead-letter"));
    assert_eq!(b, Path::new("/etc/courier/state/own"));
    assert!(
        effective.contains("state_dir: /etc/courier/state\n"),
        "{effective}"
    );
}

#[test]
fn an_empty_state_dir_variable_counts_as_unset() {
    let (journal, ..) = state_paths("", Some(" "));
    assert_eq!(journal, Path::new("/etc/courier/data/journal"));
}

#[test]
fn absolute_data_paths_ignore_the_state_dir() {
    let text = format!("state_dir: /srv/state\n{STATE}").replace("./data/journal", "/j");
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(loaded.settings.journal.dir, Path::new("/j"));
}

#[test]
fn an_empty_state_dir_key_is_an_error() {
    let e = one_error(&format!("state_dir: ''\n{STATE}"));
    assert!(
        e.starts_with("c.yaml:1:12: state_dir: must not be empty"),
        "{e}"
    );
}

#[test]
fn a_pod_address_for_admin_needs_a_token() {
    let open = GOOD.replace(
        "listen: 127.0.0.1:8080",
        "listen: 127.0.0.1:8080\nadmin_listen: 0.0.0.0:9090",
    );
    let e = one_error(&open);
    assert!(
        e.starts_with("c.yaml:2:15: admin_listen: `0.0.0.0:9090` is not a loopback address, so admin_token_env is required"),
        "{e}"
    );
    let with = open.replace(
        "admin_listen: 0.0.0.0:9090",
        "admin_listen: 0.0.0.0:9090\nadmin_token_env: ADMIN_TOKEN",
    );
    let loaded = parse("c.yaml", &with, ".".into(), Purpose::Run, &env()).expect("valid");
    let token = loaded.settings.admin_token.expect("a token");
    let mut h = http::HeaderMap::new();
    h.insert(
        "authorization",
        http::HeaderValue::from_static("Bearer t0ken-for-admin"),
    );
    assert!(token.authorizes(&h));
    assert!(!loaded.effective.contains("t0ken"), "{}", loaded.effective);
    assert!(
        loaded.effective.contains("admin_token_env: ADMIN_TOKEN"),
        "{}",
        loaded.effective
    );
    // Loopback needs no token; a token there is still honoured.
    let lo = parse("c.yaml", GOOD, ".".into(), Purpose::Run, &env()).expect("valid");
    assert!(lo.settings.admin_token.is_none());
}

#[test]
fn an_admin_token_variable_must_be_set_and_not_blank() {
    let cfg = |var: &str| {
        GOOD.replace(
            "listen: 127.0.0.1:8080",
            &format!("listen: 127.0.0.1:8080\nadmin_token_env: {var}"),
        )
    };
    let e = one_error(&cfg("NOT_SET_ANYWHERE"));
    assert!(
        e.starts_with(
            "c.yaml:2:18: admin_token_env: environment variable NOT_SET_ANYWHERE is not set"
        ),
        "{e}"
    );
    let checked = parse(
        "c.yaml",
        &cfg("NOT_SET_ANYWHERE"),
        ".".into(),
        Purpose::Check,
        &env(),
    )
    .expect("check passes");
    assert_eq!(checked.warnings.len(), 1, "{:?}", checked.warnings);
    let e = one_error(&cfg("BLANK"));
    assert!(
        e.contains("admin_token_env: environment variable BLANK is empty"),
        "{e}"
    );
    let e = one_error(&cfg("\"\""));
    assert!(
        e.contains("admin_token_env: must name an environment variable"),
        "{e}"
    );
}

// ------------------------------------------------- the config as bad input

#[test]
fn dot_segment_names_are_refused_with_their_position() {
    for bad in [".", ".."] {
        let text = format!(
            "destinations:\n  ok: {{ url: http://127.0.0.1:9/a }}\n  \"{bad}\": {{ url: http://127.0.0.1:9/b }}\n"
        );
        let e = one_error(&text);
        assert!(
            e.starts_with("c.yaml:3:") && e.contains(&format!("name `{bad}` must be")),
            "{e}"
        );
        let topic = format!(
            "destinations:\n  a: {{ url: http://127.0.0.1:9/a, schema: eventgrid }}\ntopics:\n  \"{bad}\":\n    schema: eventgrid\n    subscribers: {{ a: {{}} }}\n"
        );
        let e = one_error(&topic);
        assert!(e.starts_with("c.yaml:5:") && e.contains("topics."), "{e}");
    }
    // A dot inside a name stays allowed.
    let ok = "destinations:\n  v1.orders: { url: http://127.0.0.1:9/a }\n  ...: { url: http://127.0.0.1:9/b }\n";
    parse("c.yaml", ok, ".".into(), Purpose::Run, &env()).expect("valid");
}

#[test]
fn probation_lengths_are_refused_for_outcomes_that_never_start_one() {
    let text = "destinations:\n  a:\n    url: http://127.0.0.1:9/a\n    probation: { durations: { BadRequest: 1m, Failed: 2s } }\n";
    let e = one_error(text);
    assert!(
        e.starts_with("c.yaml:4:")
            && e.contains("probation.durations.BadRequest: `BadRequest` never starts a probation"),
        "{e}"
    );
}

#[test]
fn a_destination_given_twice_names_both_positions() {
    let text = format!("{GOOD}  orders:\n    url: https://other.example.com/\n");
    assert_eq!(
        one_error(&text),
        "c.yaml:15:3: destinations.orders: duplicate key; first given at 3:3"
    );
}

#[test]
fn a_header_given_twice_names_both_positions() {
    let text = GOOD.replace(
        "      X-Tenant: { value: acme }\n",
        "      X-Tenant: { value: acme }\n      X-Tenant: { value: other }\n",
    );
    assert_eq!(
        one_error(&text),
        "c.yaml:15:7: destinations.orders.headers.X-Tenant: duplicate key; first given at 14:7"
    );
}

#[test]
fn a_top_level_key_or_a_field_given_twice_names_both_positions() {
    let text = format!("{GOOD}listen: 127.0.0.1:8081\n");
    assert_eq!(
        one_error(&text),
        "c.yaml:15:1: listen: duplicate key; first given at 1:1"
    );
    let text = GOOD.replace("    timeout: 5s\n", "    timeout: 5s\n    timeout: 6s\n");
    assert_eq!(
        one_error(&text),
        "c.yaml:6:5: destinations.orders.timeout: duplicate key; first given at 5:5"
    );
}

#[test]
fn typos_in_two_destinations_are_both_reported_in_line_order() {
    let text = format!(
        "{}  billing:\n    url: https://hooks.example.com/billing\n    retyr: {{ max_attempts: 3 }}\n",
        GOOD.replace("    timeout: 5s", "    timout: 5s")
    );
    let e = errors(&text);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(
        e[0].starts_with(
            "c.yaml:5:5: destinations.orders: unknown key `timout`; expected one of url, "
        ),
        "{e:#?}"
    );
    assert!(
        e[1].starts_with(
            "c.yaml:17:5: destinations.billing: unknown key `retyr`; expected one of url, "
        ),
        "{e:#?}"
    );
}

#[test]
fn a_typo_and_an_out_of_range_value_are_reported_together() {
    let text = GOOD.replace("max_attempts: 3", "max_attempts: 31").replace(
        "listen: 127.0.0.1:8080",
        "listen: 127.0.0.1:8080\nlsiten: 127.0.0.1:8081",
    );
    let e = errors(&text);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(
        e[0].starts_with(
            "c.yaml:2:1: unknown key `lsiten`; expected one of listen, admin_listen, "
        ),
        "{e:#?}"
    );
    assert_eq!(
        e[1],
        "c.yaml:9:21: destinations.orders.retry.max_attempts: 31 is out of range: allowed 1..=30"
    );
}

#[test]
fn a_bad_value_is_not_reported_again_as_a_consequence() {
    // The cut `timeout` falls back to its default; nothing more is said of it.
    let text = GOOD.replace("    timeout: 5s", "    timeout: [5s]\n    concurrency: 0");
    let e = errors(&text);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert_eq!(
        e[0],
        "c.yaml:5:14: destinations.orders.timeout: expected a duration like 10s, found a list"
    );
    assert!(
        e[1].starts_with("c.yaml:6:18: destinations.orders.concurrency: 0 is out of range"),
        "{e:#?}"
    );
}

/// Words of Rust that must never reach a user.
const RUST_WORDS: [&str; 8] = [
    "u32",
    "u64",
    "usize",
    "struct",
    "enum",
    "Option",
    "Vec",
    "expected a sequence",
];

#[test]
fn type_errors_are_worded_for_people_not_in_rust_types() {
    let cases = [
        (
            GOOD.replace("max_attempts: 3", "max_attempts: three"),
            "c.yaml:8:21: destinations.orders.retry.max_attempts: expected a whole number, found \"three\"",
        ),
        (
            GOOD.replace("    timeout: 5s", "    timeout: 1.5"),
            "c.yaml:5:14: destinations.orders.timeout: expected a duration like 10s, found `1.5`",
        ),
        (
            format!("journal:\n  max_bytes: [1]\n{GOOD}"),
            "c.yaml:2:14: journal.max_bytes: expected a size like 64KiB or a number of bytes, found a list",
        ),
        (
            GOOD.replace("no_retry: [400, 5xx]", "no_retry: 400"),
            "c.yaml:10:17: destinations.orders.status.no_retry: expected a list, found `400`",
        ),
        (
            format!("journal: ./data\n{GOOD}"),
            "c.yaml:1:10: journal: expected a mapping, found \"./data\"",
        ),
        (
            GOOD.replace(
                "    timeout: 5s",
                "    concurrency: [1]\n    mode: { a: 1 }",
            ),
            "c.yaml:5:18: destinations.orders.concurrency: expected a whole number or `{ adaptive: { min, max, initial } }`, found a list\n\
             c.yaml:6:11: destinations.orders.mode: expected a single word, found a mapping",
        ),
        (
            format!("log: {{ bodies: yes }}\n{GOOD}"),
            "c.yaml:1:16: log.bodies: expected true or false, found \"yes\"",
        ),
        (
            GOOD.replace(
                "min_delay: { 408: 2m, \"500-599\": 1s }",
                "min_delay: { [408]: 2m }",
            ),
            "c.yaml:11:18: destinations.orders.status.min_delay: expected a status code like 404, 5xx or 500-599",
        ),
    ];
    for (text, want) in cases {
        let got = errors(&text).join("\n");
        assert_eq!(got, want);
        for word in RUST_WORDS {
            assert!(!got.contains(word), "{word} in {got}");
        }
    }
}

#[test]
fn a_second_bad_key_after_a_syntax_error_is_not_needed_but_the_syntax_error_has_a_position() {
    let e = one_error("listen: [unclosed\nbogus: 1\n");
    assert!(e.starts_with("c.yaml:"), "{e}");
    for word in RUST_WORDS {
        assert!(!e.contains(word), "{word} in {e}");
    }
}

#[test]
fn credentials_are_redacted_by_default_and_keep_headers_takes_one_back() {
    let text = "\
dead_letter: { dir: ./dl, keep_headers: [Authorization] }
destinations:
  a: { url: http://127.0.0.1:9/a }
  b: { url: http://127.0.0.1:9/b, dead_letter: { dir: ./own, redact_headers: [authorization], keep_headers: [cookie] } }
  c: { url: http://127.0.0.1:9/c }
";
    let loaded = parse("c.yaml", text, ".".into(), Purpose::Run, &env()).expect("valid");
    let redact = |name: &str| {
        loaded
            .settings
            .destination(name)
            .map(|d| d.redact_headers.clone())
            .unwrap_or_default()
    };
    assert_eq!(redact("a"), ["proxy-authorization", "cookie"]);
    assert_eq!(redact("b"), ["authorization", "proxy-authorization"]);
    let none = "destinations:\n  a: { url: http://127.0.0.1:9/a, dead_letter: { dir: ./x } }\n";
    let loaded = parse("c.yaml", none, ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(
        loaded.settings.destinations[0].redact_headers,
        ["authorization", "proxy-authorization", "cookie"]
    );
    let e = one_error(
        "dead_letter: { dir: ./dl, keep_headers: [x-tenant] }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(
        e.contains("dead_letter.keep_headers[0]: `x-tenant` is not redacted by default"),
        "{e}"
    );
    let e = one_error(
        "dead_letter: { dir: ./dl, redact_headers: [cookie], keep_headers: [Cookie] }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(e.contains("`cookie` is also in redact_headers"), "{e}");
}

#[test]
fn redact_headers_are_checked_lowercased_and_joined_per_destination() {
    let text = "\
dead_letter: { dir: ./dl, redact_headers: [Cookie, x-Session] }
destinations:
  a: { url: http://127.0.0.1:9/a }
  b: { url: http://127.0.0.1:9/b, dead_letter: { dir: ./own, redact_headers: [X-Extra, cookie] } }
  c: { url: http://127.0.0.1:9/c, dead_letter: none }
";
    let loaded = parse(
        "c.yaml",
        text,
        "/etc/courier".into(),
        Purpose::Run,
        &FakeEnv(HashMap::new()),
    )
    .unwrap_or_else(|e| panic!("rejected: {e}"));
    let redact = |name: &str| {
        loaded
            .settings
            .destination(name)
            .map(|d| d.redact_headers.clone())
            .unwrap_or_default()
    };
    let defaults = ["authorization", "proxy-authorization", "cookie"];
    assert_eq!(redact("a"), [&defaults[..], &["x-session"]].concat());
    assert_eq!(
        redact("b"),
        [&defaults[..], &["x-session", "x-extra"]].concat()
    );
    let bad = "\
dead_letter: { dir: ./dl, redact_headers: [ok, \"bad header\"] }
destinations:
  a: { url: http://127.0.0.1:9/a }
";
    let e = parse(
        "c.yaml",
        bad,
        "/etc/courier".into(),
        Purpose::Run,
        &FakeEnv(HashMap::new()),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("dead_letter.redact_headers[1]")
            && e.contains("`bad header` is not a valid header name"),
        "{e}"
    );
}

fn with_ingress_keys(list: &str) -> String {
    GOOD.replace(
        "destinations:\n",
        &format!("ingress:\n  keys_from_env: {list}\ndestinations:\n"),
    )
}

#[test]
fn ingress_keys_are_read_counted_and_never_printed() {
    let loaded = parse(
        "c.yaml",
        &with_ingress_keys("[API_KEY, ADMIN_TOKEN]"),
        ".".into(),
        Purpose::Run,
        &env(),
    )
    .expect("valid");
    assert!(loaded.settings.ingress.keys.is_some());
    assert!(
        loaded
            .effective
            .contains("keys_from_env:\n  - API_KEY\n  - ADMIN_TOKEN"),
        "{}",
        loaded.effective
    );
    for secret in ["s3cret", "t0ken-for-admin"] {
        assert!(!loaded.effective.contains(secret));
        assert!(!format!("{:?}", loaded.settings).contains(secret));
    }
    let open = parse("c.yaml", GOOD, ".".into(), Purpose::Run, &env()).expect("valid");
    assert!(open.settings.ingress.keys.is_none());
}

#[test]
fn ingress_key_variables_are_checked_with_positions() {
    assert_eq!(
        one_error(&with_ingress_keys("[]")),
        "c.yaml:3:18: ingress.keys_from_env: 0 keys is out of range: allowed 1..=4"
    );
    assert!(
        one_error(&with_ingress_keys(
            "[API_KEY, API_KEY, API_KEY, API_KEY, API_KEY]"
        ))
        .contains("5 keys is out of range: allowed 1..=4")
    );
    assert_eq!(
        errors(&with_ingress_keys("[API_KEY, \"\", BLANK, NO_SUCH_KEY]")),
        [
            "c.yaml:3:28: ingress.keys_from_env[1]: must name an environment variable, like COURIER_INGRESS_KEY",
            "c.yaml:3:32: ingress.keys_from_env[2]: environment variable BLANK is empty: it must hold a publisher key",
            "c.yaml:3:39: ingress.keys_from_env[3]: environment variable NO_SUCH_KEY is not set",
        ]
    );
}

#[test]
fn credits_per_second_is_read_and_its_range_checked() {
    let with = |n: &str| {
        GOOD.replace(
            "destinations:\n",
            &format!("ingress: {{ credits_per_second: {n} }}\ndestinations:\n"),
        )
    };
    let loaded = parse("c.yaml", &with("50"), ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(loaded.settings.ingress.credits_per_second, 50);
    assert_eq!(
        one_error(&with("20000000")),
        "c.yaml:2:32: ingress.credits_per_second: 20000000 is out of range: allowed 0..=10000000"
    );
}

#[test]
fn the_memory_budget_is_read_and_holds_at_least_the_largest_body() {
    let with = |ingress: &str| {
        GOOD.replace(
            "destinations:\n",
            &format!("ingress: {{ {ingress} }}\ndestinations:\n"),
        )
    };
    let loaded = parse("c.yaml", GOOD, ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(loaded.settings.ingress.max_inflight_bytes, 64 << 20);
    let loaded = parse(
        "c.yaml",
        &with("max_inflight_bytes: 2MiB"),
        ".".into(),
        Purpose::Run,
        &env(),
    )
    .expect("valid");
    assert_eq!(loaded.settings.ingress.max_inflight_bytes, 2 << 20);
    assert_eq!(
        one_error(&with("max_body_bytes: 4MiB, max_inflight_bytes: 2MiB")),
        "c.yaml:2:54: ingress.max_inflight_bytes: 2097152 is less than ingress.max_body_bytes (4194304): a body of that size could never be accepted"
    );
    assert_eq!(
        one_error(&with("max_inflight_bytes: 2TiB")),
        "c.yaml:2:32: ingress.max_inflight_bytes: 2199023255552 is out of range: allowed 1024..=1099511627776"
    );
}

/// PEM files in a temporary folder: a CA, a client certificate and its
/// key, another key, and a file that is not PEM.
fn tls_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let client = rcgen::CertificateParams::new(vec!["courier".to_string()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("sign");
    let other = rcgen::KeyPair::generate().expect("key");
    for (name, text) in [
        ("ca.pem", ca_cert.pem()),
        ("client.pem", client.pem()),
        ("client.key", key.serialize_pem()),
        ("other.key", other.serialize_pem()),
        ("junk.pem", "not a certificate\n".to_string()),
        // `openssl x509 -req` without -extfile: X.509 v1, with its own key.
        (
            "v1.pem",
            include_str!("../../tests/fixtures/v1-client.pem").to_string(),
        ),
        (
            "v1.key",
            include_str!("../../tests/fixtures/v1-client.key").to_string(),
        ),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

fn with_tls(dir: &Path, tls: &str) -> String {
    let tls = tls.replace("DIR", &dir.display().to_string());
    GOOD.replace(
        "    timeout: 5s\n",
        &format!("    timeout: 5s\n    tls: {tls}\n"),
    )
}

#[test]
fn tls_files_are_loaded_at_start_and_kept_as_absolute_paths() {
    let dir = tls_files();
    let text = with_tls(
        dir.path(),
        "{ ca_file: DIR/ca.pem, client_cert: DIR/client.pem, client_key: DIR/client.key }",
    );
    let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
    let tls = loaded.settings.destinations[0].tls.clone().expect("tls");
    assert_eq!(tls.ca_file, Some(dir.path().join("ca.pem")));
    assert_eq!(
        tls.client,
        Some((dir.path().join("client.pem"), dir.path().join("client.key")))
    );
}

#[test]
fn bad_tls_files_are_refused_naming_the_key_and_the_file() {
    let dir = tls_files();
    let cases = [
        (
            "{ ca_file: DIR/junk.pem }",
            "destinations.orders.tls.ca_file",
            "junk.pem holds no PEM certificate",
        ),
        (
            "{ client_cert: DIR/client.pem }",
            "destinations.orders.tls.client_cert",
            "needs client_key too",
        ),
        (
            "{ client_cert: DIR/client.pem, client_key: DIR/other.key }",
            "destinations.orders.tls.client_key",
            "other.key is not the key of the certificate in",
        ),
        (
            "{ client_cert: DIR/v1.pem, client_key: DIR/v1.key }",
            "destinations.orders.tls.client_cert",
            "v1.pem: the certificate cannot be used: it is an X.509 v1 certificate",
        ),
        (
            "{ client_cert: DIR/client.pem, client_key: DIR/ca.pem }",
            "destinations.orders.tls.client_key",
            "ca.pem holds no private key",
        ),
        (
            "{ ca_file: DIR/missing.pem }",
            "destinations.orders.tls.ca_file",
            "cannot read",
        ),
        (
            "{ ca_fille: DIR/ca.pem }",
            "destinations.orders.tls",
            "unknown key `ca_fille`",
        ),
    ];
    for (tls, path, message) in cases {
        let e = one_error(&with_tls(dir.path(), tls));
        assert!(e.starts_with("c.yaml:6:"), "{tls}: {e}");
        assert!(e.contains(path), "{tls}: {e}");
        assert!(e.contains(message), "{tls}: {e}");
    }
    let http = with_tls(dir.path(), "{ ca_file: DIR/ca.pem }")
        .replace("https://hooks.example.com", "http://hooks.example.com");
    assert!(
        one_error(&http).contains("tls applies to https:// only"),
        "{http}"
    );
    // `check` may run where the certificates are not mounted.
    let missing = with_tls(dir.path(), "{ ca_file: DIR/missing.pem }");
    let checked =
        parse("c.yaml", &missing, ".".into(), Purpose::Check, &env()).expect("check passes");
    assert_eq!(checked.warnings.len(), 1, "{:?}", checked.warnings);
    assert!(
        checked.warnings[0].contains("tls.ca_file"),
        "{:?}",
        checked.warnings
    );
}

const TWO: &str = "\
journal: { max_bytes: 64MiB }
ingress: { max_body_bytes: 1MiB }
destinations:
  orders: { url: http://127.0.0.1:9/orders }
  audit:
    url: http://127.0.0.1:9/audit
";

fn shares(text: &str) -> Vec<(String, u64)> {
    let loaded = parse("c.yaml", text, ".".into(), Purpose::Run, &env()).expect("valid");
    loaded
        .settings
        .destinations
        .iter()
        .map(|d| (d.name.clone(), d.max_pending_bytes))
        .collect()
}

#[test]
fn a_share_defaults_to_half_the_journal_and_to_all_of_it_alone() {
    let half = 32 << 20;
    assert_eq!(
        shares(TWO),
        vec![("audit".into(), half), ("orders".into(), half)]
    );
    let loaded = parse("c.yaml", TWO, ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(
        loaded.effective.matches("max_pending_bytes: 32MiB").count(),
        2,
        "{}",
        loaded.effective
    );
    // One durable destination has no other to keep room for; a
    // passthrough one journals nothing.
    let alone = TWO.replace(
        "url: http://127.0.0.1:9/audit",
        "url: http://127.0.0.1:9/audit\n    mode: passthrough",
    );
    assert_eq!(shares(&alone)[1], ("orders".into(), 64 << 20));
    // Half even when a request is larger (a journal of 1 MiB still keeps
    // room for the others), with a warning that such a request never fits.
    let small = TWO.replace("max_bytes: 64MiB", "max_bytes: 1MiB");
    assert_eq!(shares(&small)[0], ("audit".into(), 512 << 10));
    let loaded = parse("c.yaml", &small, ".".into(), Purpose::Check, &env()).expect("valid");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0].starts_with("c.yaml:1:23: journal.max_bytes: half of it (512KiB)"),
        "{:?}",
        loaded.warnings
    );
    // The default may be below one request: then it is the least allowed.
    let given = small.replace(
        "url: http://127.0.0.1:9/audit",
        "url: http://127.0.0.1:9/audit\n    max_pending_bytes: 512KiB",
    );
    assert_eq!(shares(&given)[0], ("audit".into(), 512 << 10));
    let given = TWO.replace(
        "url: http://127.0.0.1:9/audit",
        "url: http://127.0.0.1:9/audit\n    max_pending_bytes: 8MiB",
    );
    assert_eq!(shares(&given)[0], ("audit".into(), 8 << 20));
}

#[test]
fn a_share_out_of_range_names_key_value_and_range() {
    let range = "(at least ingress.max_body_bytes, so that a request fits, or the default share if that is smaller; at most journal.max_bytes)";
    for (text, value, allowed) in [
        (TWO, "512KiB", "1MiB..=64MiB"),
        (TWO, "65MiB", "1MiB..=64MiB"),
        (TWO, "1000", "1MiB..=64MiB"),
        (&TWO.replace("64MiB", "1MiB"), "256KiB", "512KiB..=1MiB"),
    ] {
        let text = text.replace(
            "url: http://127.0.0.1:9/audit",
            &format!("url: http://127.0.0.1:9/audit\n    max_pending_bytes: {value}"),
        );
        assert_eq!(
            one_error(&text),
            format!(
                "c.yaml:7:24: destinations.audit.max_pending_bytes: {value} is out of range: allowed {allowed} {range}"
            )
        );
    }
}

#[test]
fn a_sink_is_a_directory_or_a_bucket_url_and_a_bad_one_names_its_key() {
    let text = "\
dead_letter: { url: s3://bucket/dl/ }
destinations:
  a: { url: http://127.0.0.1:9/a }
  b: { url: http://127.0.0.1:9/b, dead_letter: { url: file:///var/lib/dl } }
  c: { url: http://127.0.0.1:9/c, dead_letter: { dir: ./own } }
";
    let loaded = parse("c.yaml", text, "/etc/courier".into(), Purpose::Run, &env()).expect("valid");
    let sink = |name: &str| {
        loaded
            .settings
            .destination(name)
            .and_then(|d| d.dead_letter.clone())
    };
    let bucket = |u: &str| Some(SinkAt::Bucket(StoreUrl::parse(u).expect("url")));
    assert_eq!(
        sink("a"),
        bucket("s3://bucket/dl"),
        "a trailing / is one prefix"
    );
    assert_eq!(sink("b"), bucket("file:///var/lib/dl"));
    assert_eq!(sink("c"), Some(SinkAt::Dir("/etc/courier/own".into())));

    let e = one_error(
        "dead_letter: { url: http://bucket/x }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(
        e.contains("dead_letter.url") && e.contains("`http` is not one of s3, az, gs, file"),
        "{e}"
    );
    let e = one_error(
        "destinations:\n  a: { url: http://127.0.0.1:9/a, dead_letter: { dir: ./x, url: s3://b/p } }\n",
    );
    assert!(
        e.contains("destinations.a.dead_letter") && e.contains("both `dir` and `url`"),
        "{e}"
    );
    let e = one_error(
        "dead_letter: { redact_headers: [x] }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(
        e.contains("dead_letter") && e.contains("needs `dir: PATH` or `url:"),
        "{e}"
    );
    let e = one_error(
        "dead_letter: { url: s3:///nobucket }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(e.contains("names no bucket"), "{e}");
}

#[test]
fn handoff_keys_come_from_the_environment_and_claims_outlive_two_looks() {
    let base = "destinations:\n  a: { url: http://127.0.0.1:9/a }\n";
    let with = |h: &str| format!("handoff: {{ url: s3://b/h, {h} }}\n{base}");
    let loaded = parse(
        "c.yaml",
        &with("encryption_key_env: HANDOFF_KEYS"),
        ".".into(),
        Purpose::Run,
        &env(),
    )
    .expect("valid");
    let h = loaded.settings.handoff.expect("handoff");
    assert_eq!(h.keys.len(), 2, "two keys for a rotation");
    assert!(!loaded.effective.contains("q83v"), "no key is printed");
    for (handoff, says) in [
        (
            "encryption_key_env: HANDOFF_SHORT",
            "decodes to 4 bytes, not 32",
        ),
        ("encryption_key_env: NOT_SET", "NOT_SET is not set"),
        ("encryption_key_env: BLANK", "holds 0 keys: allowed 1..=4"),
        (
            "poll: 10s, claim_timeout: 20s",
            "must be more than twice handoff.poll (10s)",
        ),
    ] {
        let e = errors(&with(handoff));
        assert!(
            e.iter().any(|l| l.contains("handoff.") && l.contains(says)),
            "{handoff}: {e:#?}"
        );
    }
    assert!(
        parse(
            "c.yaml",
            &with("poll: 10s, claim_timeout: 21s"),
            ".".into(),
            Purpose::Run,
            &env()
        )
        .is_ok()
    );
}

#[test]
fn handoff_takes_a_store_url_and_its_times_are_checked() {
    let text = "handoff: { url: s3://bucket/handoff }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n";
    let loaded = parse("c.yaml", text, ".".into(), Purpose::Run, &env()).expect("valid");
    let h = loaded.settings.handoff.expect("handoff");
    assert_eq!(h.url, StoreUrl::parse("s3://bucket/handoff").expect("url"));
    assert_eq!(
        h.poll,
        Duration::from_secs(30),
        "the documented default poll"
    );
    assert_eq!(
        h.claim_timeout,
        Duration::from_secs(300),
        "the documented default claim_timeout"
    );
    assert!(
        loaded.effective.contains("handoff:"),
        "the effective config shows it: {}",
        loaded.effective
    );
    let e = errors(
        "handoff: { url: ftp://x/y, poll: 10ms, claim_timeout: 2d }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(
        e.iter()
            .any(|l| l.contains("handoff.url") && l.contains("`ftp`")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("handoff.poll") && l.contains("out of range")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("handoff.claim_timeout") && l.contains("out of range")),
        "{e:#?}"
    );
    let e = one_error(
        "handoff: { url: s3://b/h, every: 1s }\ndestinations:\n  a: { url: http://127.0.0.1:9/a }\n",
    );
    assert!(e.contains("every"), "an unknown key is named: {e}");
}

#[test]
fn history_is_on_by_default_off_at_zero_and_its_ranges_are_checked() {
    let dest = "destinations:\n  a: { url: http://127.0.0.1:9/a }\n";
    let loaded = parse("c.yaml", dest, ".".into(), Purpose::Run, &env()).expect("valid");
    let h = loaded.settings.history.expect("on by default");
    assert_eq!(
        h.retain,
        Duration::from_secs(86_400),
        "the documented default retain"
    );
    assert_eq!(h.max_bytes, 256 << 20, "the documented default max_bytes");
    assert!(
        loaded.effective.contains("history:"),
        "{}",
        loaded.effective
    );
    let off = format!("history: {{ retain: 0s }}\n{dest}");
    let loaded = parse("c.yaml", &off, ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(loaded.settings.history, None, "retain: 0s turns it off");
    let e = errors(&format!(
        "history: {{ retain: 500ms, max_bytes: 1KiB }}\n{dest}"
    ));
    assert!(
        e.iter()
            .any(|l| l.contains("history.retain") && l.contains("out of range")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|l| l.contains("history.max_bytes") && l.contains("out of range")),
        "{e:#?}"
    );
    let e = one_error(&format!("history: {{ keep: 1h }}\n{dest}"));
    assert!(e.contains("keep"), "an unknown key is named: {e}");
}

#[test]
fn ordering_keys_are_read_and_checked() {
    use crate::event::ordering::Key;
    let key_of = |key: &str| {
        let text = format!("{GOOD}    ordering: {{ key: {key} }}\n");
        let loaded = parse("c.yaml", &text, ".".into(), Purpose::Run, &env()).expect("valid");
        loaded.settings.destinations[0].ordering.clone()
    };
    assert_eq!(key_of("destination"), Some(Key::Destination));
    assert_eq!(
        key_of("{ header: Ordering-Key }"),
        Some(Key::Header("ordering-key".into())),
        "header names are case-insensitive: kept lower-case"
    );
    let Some(Key::FromEvent(path)) = key_of("{ from_event: data.orderId }") else {
        panic!("from_event gives an event path");
    };
    assert_eq!(path.as_str(), "data.orderId");

    let error_of = |key: &str| one_error(&format!("{GOOD}    ordering: {{ key: {key} }}\n"));
    assert!(
        error_of("subject")
            .contains("destinations.orders.ordering.key: `subject` is not an ordering key"),
        "{}",
        error_of("subject")
    );
    assert!(error_of("{ header: \"bad header\" }").contains(
        "destinations.orders.ordering.key.header: `bad header` is not a valid header name"
    ));
    assert!(
        error_of("{ from_event: \"a..b\" }")
            .contains("destinations.orders.ordering.key.from_event")
    );
    assert!(
        error_of("{ header: A, from_event: b }").contains("name exactly one source"),
        "{}",
        error_of("{ header: A, from_event: b }")
    );
    let passthrough =
        format!("{GOOD}    mode: passthrough\n    ordering: {{ key: destination }}\n");
    assert!(
        errors(&passthrough)
            .iter()
            .any(|e| e
                .contains("destinations.orders.ordering: passthrough sends each request at once")),
        "{:#?}",
        errors(&passthrough)
    );
}

#[test]
fn tracing_is_off_unless_configured_and_its_keys_are_checked() {
    let dest = "destinations:\n  a: { url: http://127.0.0.1:9/a }\n";
    let loaded = parse("c.yaml", dest, ".".into(), Purpose::Run, &env()).expect("valid");
    assert_eq!(loaded.settings.tracing, None, "off when omitted");
    assert!(
        !loaded.effective.contains("tracing"),
        "{}",
        loaded.effective
    );
    let on = format!("tracing: {{ otlp_endpoint: http://127.0.0.1:4318/ }}\n{dest}");
    let loaded = parse("c.yaml", &on, ".".into(), Purpose::Run, &env()).expect("valid");
    let t = loaded.settings.tracing.expect("on");
    assert_eq!(t.traces_url, "http://127.0.0.1:4318/v1/traces");
    assert_eq!(t.sample_ratio, 1.0, "the documented default");
    assert!(
        loaded.effective.contains("sample_ratio: 1.0"),
        "{}",
        loaded.effective
    );
    let on =
        format!("tracing: {{ otlp_endpoint: https://otel.example/base, sample_ratio: 0 }}\n{dest}");
    let t = parse("c.yaml", &on, ".".into(), Purpose::Run, &env())
        .expect("valid")
        .settings
        .tracing
        .expect("on");
    assert_eq!(t.traces_url, "https://otel.example/base/v1/traces");
    assert_eq!(t.sample_ratio, 0.0);

    let e = one_error(&format!(
        "tracing: {{ otlp_endpoint: http://127.0.0.1:4318, sample_ratio: 1.5 }}\n{dest}"
    ));
    assert!(
        e.contains("tracing.sample_ratio")
            && e.contains("allowed 0..=1")
            && e.contains("c.yaml:1:"),
        "{e}"
    );
    for (bad, why) in [
        ("grpc://127.0.0.1:4317", "http or https"),
        ("127.0.0.1:4318", "URL"),
        ("http://u:p@127.0.0.1:4318", "credentials"),
        ("http://127.0.0.1:4318?x=1", "query"),
    ] {
        let e = one_error(&format!("tracing: {{ otlp_endpoint: \"{bad}\" }}\n{dest}"));
        assert!(
            e.contains("tracing.otlp_endpoint") && e.contains(why),
            "{bad}: {e}"
        );
    }
    let e = errors(&format!("tracing: {{ endpoint: http://x }}\n{dest}"));
    assert!(
        e.iter().any(|l| l.contains("unknown key `endpoint`")),
        "an unknown key is named: {e:#?}"
    );
}

#[test]
fn the_address_guard_is_off_for_a_fixed_url_unless_asked_and_its_ranges_are_checked() {
    let dest =
        |extra: &str| format!("destinations:\n  d:\n    url: https://hooks.example/x\n{extra}");
    let parsed = |text: &str| {
        parse("c.yaml", text, ".".into(), Purpose::Run, &env())
            .expect("valid")
            .settings
    };
    assert_eq!(parsed(&dest("")).destinations[0].guard, None);
    for on in ["on", "true"] {
        let s = parsed(&dest(&format!("    endpoints: {{ guard: {on} }}\n")));
        let guard = s.destinations[0].guard.as_ref().expect("on");
        assert!(!guard.allows("10.0.0.1".parse().expect("ip")));
    }
    let s = parsed(&dest(
        "    endpoints: { guard: on, allow_cidrs: [10.20.0.0/16, 192.168.1.7] }\n",
    ));
    let guard = s.destinations[0].guard.as_ref().expect("on");
    assert!(guard.allows("10.20.3.4".parse().expect("ip")));
    assert!(
        guard.allows("192.168.1.7".parse().expect("ip")),
        "a bare address is its own range"
    );
    assert!(!guard.allows("192.168.1.8".parse().expect("ip")));

    let e = one_error(&dest(
        "    endpoints: { guard: on, allow_cidrs: [10.0.0.0/33] }\n",
    ));
    assert!(
        e.contains("destinations.d.endpoints.allow_cidrs[0]") && e.contains("10.0.0.0/33"),
        "{e}"
    );
    let e = one_error(&dest("    endpoints: { allow_cidrs: [10.0.0.0/8] }\n"));
    assert!(
        e.contains("destinations.d.endpoints.allow_cidrs") && e.contains("guard: on"),
        "{e}"
    );
    let e = one_error(&dest("    endpoints: { guard: maybe }\n"));
    assert!(
        e.contains("destinations.d.endpoints.guard") && e.contains("`maybe`"),
        "{e}"
    );
    let e = one_error(
        "destinations:\n  d:\n    url: http://169.254.169.254/latest\n    endpoints: { guard: on }\n",
    );
    assert!(
        e.contains("destinations.d.url") && e.contains("169.254.169.254"),
        "{e}"
    );
    let e = one_error(&dest("    endpoints: { header: Courier-Endpoint }\n"));
    assert!(
        e.contains("destinations.d.endpoints.header") && e.contains("per_event only"),
        "a key of url: per_event on a fixed url: {e}"
    );
}

#[test]
fn url_per_event_reads_its_endpoint_keys_with_defaults_and_refuses_what_cannot_follow() {
    let dest = |extra: &str| format!("destinations:\n  c:\n    url: per_event\n{extra}");
    let parsed = |text: &str| {
        parse("c.yaml", text, ".".into(), Purpose::Run, &env())
            .expect("valid")
            .settings
    };
    let s = parsed(&dest(""));
    let d = &s.destinations[0];
    let p = d.per_event.as_ref().expect("per_event");
    assert_eq!(p.header.as_str(), "courier-endpoint");
    assert_eq!(p.secret_header.as_str(), "courier-endpoint-secret");
    assert_eq!(p.schemes, ["https"]);
    assert_eq!((p.concurrency, p.max_tracked), (4, 100_000));
    assert_eq!(p.max_idle_connections, 10_000);
    assert_eq!(p.disable_after, Some(Duration::from_secs(5 * 86_400)));
    assert_eq!(
        p.max_pending_bytes,
        d.max_pending_bytes / 4,
        "a quarter of the destination's share"
    );
    assert_eq!(p.notify, None);
    let guard = d
        .guard
        .as_ref()
        .expect("the guard is on by default for per_event");
    assert!(!guard.allows("127.0.0.1".parse().expect("ip")));

    let s = parsed(&dest(
        "    concurrency: 8\n    endpoints: { header: X-Target, schemes: [HTTPS, http], concurrency: 2, max_tracked: 10, max_idle_connections: 0, guard: off }\n",
    ));
    let d = &s.destinations[0];
    let p = d.per_event.as_ref().expect("per_event");
    assert_eq!(p.header.as_str(), "x-target");
    assert_eq!(p.schemes, ["https", "http"]);
    assert_eq!((p.concurrency, p.max_tracked), (2, 10));
    assert_eq!(p.max_idle_connections, 0, "no connection kept idle");
    assert_eq!(d.guard, None, "turned off by the operator");
    let s = parsed(
        "destinations:\n  c:\n    url: per_event\n    endpoints: { disable_after: 0s, notify: ops }\n  ops:\n    url: https://ops.example/hooks\n",
    );
    let p = s.destinations[0].per_event.clone().expect("per_event");
    assert_eq!(p.disable_after, None, "0s: never");
    assert_eq!(p.notify.as_deref(), Some("ops"));

    for (extra, key, words) in [
        (
            "    endpoints: { schemes: [ftp] }\n",
            "endpoints.schemes[0]",
            "`ftp`",
        ),
        (
            "    endpoints: { header: \"bad header\" }\n",
            "endpoints.header",
            "`bad header`",
        ),
        (
            "    endpoints: { secret_header: courier-endpoint }\n",
            "endpoints.secret_header",
            "also endpoints.header",
        ),
        (
            "    concurrency: 2\n    endpoints: { concurrency: 3 }\n",
            "endpoints.concurrency",
            "more than the destination's",
        ),
        (
            "    endpoints: { max_tracked: 0 }\n",
            "endpoints.max_tracked",
            "out of range",
        ),
        (
            "    endpoints: { max_idle_connections: 1000001 }\n",
            "endpoints.max_idle_connections",
            "out of range",
        ),
        (
            "    endpoints: { disable_after: 50ms }\n",
            "endpoints.disable_after",
            "out of range",
        ),
        (
            "    endpoints: { notify: ops }\n",
            "endpoints.notify",
            "`ops` is not a destination",
        ),
        (
            "    endpoints: { notify: c }\n",
            "endpoints.notify",
            "fixed url",
        ),
        (
            "    max_pending_bytes: 64MiB\n    endpoints: { max_pending_bytes: 128MiB }\n",
            "endpoints.max_pending_bytes",
            "at most the destination's",
        ),
        (
            "    batch: { max_events: 10 }\n",
            "batch.max_events",
            "one endpoint",
        ),
        (
            "    mode: passthrough\n    schema: custom\n",
            "mode",
            "durable",
        ),
        (
            "    concurrency: { adaptive: {} }\n",
            "concurrency.adaptive",
            "one slow endpoint",
        ),
    ] {
        let errors = errors(&dest(extra));
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&format!("destinations.c.{key}")) && e.contains(words)),
            "{extra}: {errors:?}"
        );
    }
    let topic = "destinations:\n  c:\n    url: per_event\n    schema: eventgrid\ntopics:\n  t:\n    schema: eventgrid\n    subscribers: { c: {} }\n";
    let errors = errors(topic);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("topics.t.subscribers.c") && e.contains("fixed url")),
        "{errors:?}"
    );
}
