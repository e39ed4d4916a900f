//! The limiter against simulated endpoints on a simulated clock: attempts
//! start whenever the limit has room (a backlog that never runs out,
//! unless a test caps it), each answered after a latency the endpoint
//! decides from the attempts it is serving.

use super::*;

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What an endpoint answers to an attempt that finds `busy` successes in
/// service (itself included), and how long it takes.
type Endpoint = Box<dyn FnMut(usize) -> (Signal, Duration)>;

/// Always `latency`, whatever the load.
fn flat(latency: Duration) -> Endpoint {
    Box::new(move |_| (Signal::Success, latency))
}

/// At most `capacity` in service, each for `service`; beyond, a 503 at once.
fn capacity(capacity: usize, service: Duration) -> Endpoint {
    Box::new(move |busy| {
        if busy > capacity {
            (Signal::Overloaded, MS)
        } else {
            (Signal::Success, service)
        }
    })
}

/// `base` up to `knee` in service, growing in proportion beyond: twice as
/// slow at twice the knee.
fn knee(knee: usize, base: Duration) -> Endpoint {
    Box::new(move |busy| {
        let factor = (busy as f64 / knee as f64).max(1.0);
        (Signal::Success, base.mul_f64(factor))
    })
}

/// An attempt in flight, ordered by when it ends (earliest first).
#[derive(PartialEq, Eq)]
struct Flying {
    ends: Duration,
    started: Duration,
    signal: Signal,
}

impl Ord for Flying {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.ends.cmp(&self.ends)
    }
}

impl PartialOrd for Flying {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

struct Sim {
    limiter: Limiter,
    now: Duration,
    flying: std::collections::BinaryHeap<Flying>,
    /// Successes in service.
    busy: usize,
    /// The most attempts the backlog keeps in flight.
    supply: usize,
    served: u64,
    refused: u64,
    /// Successes in service, integrated over time (attempt-seconds).
    busy_time: f64,
    /// The limit after each answer.
    trace: Vec<(Duration, usize)>,
}

impl Sim {
    fn new(bounds: Bounds) -> Sim {
        let now = Duration::from_secs(100);
        Sim {
            limiter: Limiter::new(bounds, now),
            now,
            flying: std::collections::BinaryHeap::new(),
            busy: 0,
            supply: usize::MAX,
            served: 0,
            refused: 0,
            busy_time: 0.0,
            trace: Vec::new(),
        }
    }

    /// Runs `endpoint` for `d` of simulated time.
    fn run(&mut self, d: Duration, endpoint: &mut Endpoint) {
        let end = self.now + d;
        loop {
            while self.flying.len() < self.limiter.limit().min(self.supply) {
                let (signal, latency) = endpoint(self.busy + 1);
                self.busy += usize::from(signal == Signal::Success);
                self.flying.push(Flying {
                    ends: self.now + latency,
                    started: self.now,
                    signal,
                });
            }
            let Some(next) = self.flying.peek().map(|f| f.ends) else {
                self.now = end;
                return;
            };
            let until = next.min(end);
            self.busy_time += self.busy as f64 * (until - self.now).as_secs_f64();
            self.now = until;
            if next > end {
                return;
            }
            let Some(done) = self.flying.pop() else {
                return;
            };
            match done.signal {
                Signal::Success => {
                    self.served += 1;
                    self.busy -= 1;
                }
                _ => self.refused += 1,
            }
            let sample = Sample {
                signal: done.signal,
                took: self.now - done.started,
                in_flight: self.flying.len() + 1,
            };
            self.limiter.record(sample, self.now);
            self.trace.push((self.now, self.limiter.limit()));
        }
    }

    /// The lowest and highest limit of the last `d`.
    fn range_over_last(&self, d: Duration) -> (usize, usize) {
        let from = self.now - d;
        let limits = self
            .trace
            .iter()
            .filter(|(t, _)| *t >= from)
            .map(|(_, l)| *l);
        let lo = limits.clone().min().expect("answers in the span");
        (lo, limits.max().expect("answers in the span"))
    }

    /// Counters reset, for a measure of what follows.
    fn measure(&mut self) {
        self.served = 0;
        self.refused = 0;
        self.busy_time = 0.0;
    }
}

fn bounds(min: usize, max: usize, initial: usize) -> Bounds {
    Bounds { min, max, initial }
}

/// A limiter past its first probe, at `initial` with a 20 ms baseline.
fn measured(initial: usize) -> (Limiter, Duration) {
    let mut now = Duration::from_secs(100);
    let mut l = Limiter::new(bounds(1, 256, initial), now);
    for _ in 0..MIN_SAMPLES {
        now += ms(20);
        l.record(success(ms(20), 4), now);
    }
    assert_eq!(l.baseline(), Some(ms(20)));
    assert_eq!(l.limit(), initial);
    (l, now)
}

fn success(took: Duration, in_flight: usize) -> Sample {
    Sample {
        signal: Signal::Success,
        took,
        in_flight,
    }
}

fn overloaded(took: Duration) -> Sample {
    Sample {
        signal: Signal::Overloaded,
        took,
        in_flight: 16,
    }
}

#[test]
fn the_baseline_is_measured_first_at_low_concurrency() {
    let now = Duration::from_secs(1);
    let mut l = Limiter::new(Bounds::DEFAULT, now);
    assert_eq!(l.limit(), PROBE_CONCURRENCY, "probing before anything");
    assert_eq!(l.baseline(), None);
    for i in 1..=MIN_SAMPLES as u64 {
        l.record(success(ms(30), 4), now + ms(30 + i));
    }
    assert_eq!(l.baseline(), Some(ms(30)));
    assert_eq!(
        l.limit(),
        16,
        "then the initial limit, not grown by the probe"
    );
    // A min above the probe's concurrency is probed at min.
    let l = Limiter::new(bounds(8, 64, 32), now);
    assert_eq!(l.limit(), 8);
}

#[test]
fn fast_successes_grow_the_limit_doubling_until_the_first_cut_then_by_one() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(1), &mut flat(ms(20)));
    assert_eq!(sim.limiter.limit(), 256, "doubled up to max");
    let doublings: Vec<usize> = sim.trace.iter().map(|(_, l)| *l).collect();
    for step in [16, 32, 64, 128] {
        assert!(
            doublings.contains(&step),
            "no {step} on the way: {doublings:?}"
        );
    }
    assert!(!doublings.contains(&17), "slow start doubles");

    let (mut l, mut now) = measured(16);
    l.record(overloaded(MS), now);
    assert_eq!(l.limit(), 12);
    // A window of fast successes started after the cut: one more.
    for _ in 0..MIN_SAMPLES.max(6) {
        now += ms(20);
        l.record(success(ms(19), 12), now);
    }
    assert_eq!(l.limit(), 13, "additive after the first cut");
}

#[test]
fn the_limit_waits_before_the_value_last_refused() {
    let (mut l, mut now) = measured(9);
    l.record(overloaded(MS), now);
    assert_eq!(l.limit(), 6, "9 refused");
    // Every attempt the limit allows, sent together, answered together.
    let mut window = |l: &mut Limiter| {
        now += ms(20);
        let n = l.limit();
        for _ in 0..n {
            now += Duration::from_micros(1);
            l.record(success(ms(20), n), now);
        }
        l.limit()
    };
    let limits: Vec<usize> = (0..9).map(|_| window(&mut l)).collect();
    assert_eq!(
        limits,
        [7, 8, 8, 8, 8, 9, 10, 11, 12],
        "up to 8 a step a window, {PLATEAU} windows to 9, then past it freely"
    );
}

#[test]
fn an_unused_limit_does_not_grow() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.supply = 7;
    sim.run(Duration::from_secs(10), &mut flat(ms(20)));
    assert_eq!(sim.limiter.limit(), 16, "7 in flight never used half of 16");
    sim.supply = 8;
    sim.run(Duration::from_secs(1), &mut flat(ms(20)));
    assert_eq!(sim.limiter.limit(), 32, "8 is half: used");
}

#[test]
fn each_overload_signal_cuts_multiplicatively_and_other_answers_do_not() {
    for outcome in [Outcome::Busy, Outcome::TimedOut, Outcome::SocketError] {
        let (mut l, now) = measured(16);
        let signal = Signal::of(outcome);
        assert_eq!(signal, Signal::Overloaded, "{outcome:?}");
        l.record(overloaded(MS), now + MS);
        assert_eq!(l.limit(), 12, "{outcome:?}: 16 × {BACKOFF}");
        l.record(overloaded(MS), now + ms(5));
        assert_eq!(l.limit(), 9, "{outcome:?}: again, started after the cut");
    }
    for outcome in [
        Outcome::Failed,
        Outcome::BadRequest,
        Outcome::NotFound,
        Outcome::Gone,
        Outcome::ResolutionError,
        Outcome::TlsError,
    ] {
        let (mut l, now) = measured(16);
        let signal = Signal::of(outcome);
        assert_eq!(signal, Signal::Neutral, "{outcome:?}");
        for i in 1..=20 {
            let sample = Sample {
                signal,
                took: ms(500),
                in_flight: 16,
            };
            l.record(sample, now + ms(i));
        }
        assert_eq!(l.limit(), 16, "{outcome:?} neither cuts nor grows");
    }
}

#[test]
fn a_burst_of_failures_started_before_the_cut_cuts_once() {
    let (mut l, now) = measured(64);
    // 64 attempts sent together, all refused: the first answer cuts, the
    // other 63 were sent under the old limit.
    for i in 0..64 {
        l.record(overloaded(ms(3)), now + ms(3) + Duration::from_micros(i));
    }
    assert_eq!(l.limit(), 48, "one cut, not down to min");
    // A timeout of an attempt that started 30 s ago is as old.
    l.record(overloaded(Duration::from_secs(30)), now + ms(10));
    assert_eq!(l.limit(), 48);
    // Refused again, sent after the cut: the limit is still too high.
    l.record(overloaded(ms(1)), now + ms(20));
    assert_eq!(l.limit(), 36);
}

#[test]
fn latency_well_above_the_baseline_cuts_by_the_gradient() {
    // Eight attempts sent together after the probe, answered together.
    let window = |l: &mut Limiter, now: &mut Duration, took: Duration| {
        *now += took;
        for _ in 0..8 {
            *now += Duration::from_micros(1);
            l.record(success(took, 16), *now);
        }
    };
    let (mut l, mut now) = measured(16);
    window(&mut l, &mut now, ms(30));
    assert_eq!(l.limit(), 32, "1.5 × the baseline still grows");
    let (mut l, mut now) = measured(16);
    window(&mut l, &mut now, ms(35));
    assert_eq!(l.limit(), 16, "between 1.5 and 2 × it holds");
    let (mut l, mut now) = measured(16);
    window(&mut l, &mut now, ms(44));
    assert_eq!(l.limit(), 12, "a little above 2 ×: cut by {BACKOFF}");
    let (mut l, mut now) = measured(16);
    window(&mut l, &mut now, ms(200));
    assert_eq!(l.limit(), 8, "ten times: cut by half, no more");
    // One slow answer among fast ones is not the window's latency.
    let (mut l, mut now) = measured(16);
    now += ms(500);
    for took in [20, 20, 21, 500, 20, 19, 20, 20] {
        now += Duration::from_micros(1);
        l.record(success(ms(took), 16), now);
    }
    assert_eq!(l.limit(), 32);
}

#[test]
fn latency_that_doubles_under_load_holds_the_limit_near_the_knee() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(20), &mut knee(8, ms(20)));
    let (lo, hi) = sim.range_over_last(Duration::from_secs(10));
    assert!(
        (8..=17).contains(&lo) && (8..=17).contains(&hi),
        "{lo}..={hi}: between the knee and twice it"
    );
    // The same endpoint without the knee lets it climb.
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(20), &mut flat(ms(20)));
    assert_eq!(sim.limiter.limit(), 256);
}

#[test]
fn the_baseline_does_not_ratchet_upwards_under_sustained_load() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(600), &mut knee(8, ms(20)));
    let baseline = sim.limiter.baseline().expect("measured");
    assert!(baseline <= ms(22), "baseline {baseline:?} after 10 minutes");
    let (lo, hi) = sim.range_over_last(Duration::from_secs(60));
    assert!(
        lo >= 2 && hi <= 17,
        "{lo}..={hi} in the tenth minute (a probe holds it at {PROBE_CONCURRENCY})"
    );
    // Probes are rare: the endpoint was kept near the knee.
    sim.measure();
    sim.run(Duration::from_secs(120), &mut knee(8, ms(20)));
    let busy = sim.busy_time / 120.0;
    assert!(busy >= 10.0, "{busy:.1} attempts in service on average");
}

#[test]
fn an_endpoint_that_became_slower_for_good_gets_a_new_baseline() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(2), &mut flat(ms(20)));
    assert_eq!(sim.limiter.baseline(), Some(ms(20)));
    sim.run(Duration::from_secs(60), &mut flat(ms(60)));
    let baseline = sim.limiter.baseline().expect("measured");
    assert!(
        (ms(55)..=ms(65)).contains(&baseline),
        "baseline {baseline:?}"
    );
    let (lo, _) = sim.range_over_last(Duration::from_secs(20));
    assert!(lo >= 64, "climbed again, at least to {lo}");
}

#[test]
fn a_baseline_gone_stale_is_probed_again() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(5), &mut capacity(16, ms(20)));
    let (_, hi) = sim.range_over_last(Duration::from_secs(2));
    assert!(hi <= 17, "{hi}");
    // Slower by less than twice, for its own reasons, with room for more:
    // the limit holds (1.8 × the baseline is not fast), until a probe
    // finds 36 ms at low concurrency.
    let mut slower = capacity(64, ms(36));
    sim.run(Duration::from_secs(15), &mut slower);
    assert!(sim.limiter.limit() <= 17, "held at {}", sim.limiter.limit());
    sim.run(Duration::from_secs(30), &mut slower);
    assert_eq!(sim.limiter.baseline(), Some(ms(36)));
    let (lo, _) = sim.range_over_last(Duration::from_secs(5));
    assert!(lo >= 40, "grown to the new capacity: {lo}");
}

#[test]
fn a_baseline_confirmed_by_the_windows_is_not_probed_again() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(2), &mut flat(ms(20)));
    // 5% slower: within the noise, the baseline stands; no probe.
    sim.run(Duration::from_secs(60), &mut flat(ms(21)));
    let (lo, _) = sim.range_over_last(Duration::from_secs(60));
    assert_eq!(lo, 256, "never held down to probe");
    assert_eq!(sim.limiter.baseline(), Some(ms(20)));
    // 30% slower grows still, but does not confirm it: probed within 30 s.
    sim.run(Duration::from_secs(31), &mut flat(ms(26)));
    let (lo, _) = sim.range_over_last(Duration::from_secs(31));
    assert_eq!(lo, PROBE_CONCURRENCY, "probed");
    assert_eq!(sim.limiter.baseline(), Some(ms(26)));
}

#[test]
fn the_baseline_follows_an_endpoint_that_got_faster() {
    let mut sim = Sim::new(bounds(1, 16, 16));
    sim.run(Duration::from_secs(2), &mut flat(ms(40)));
    assert_eq!(sim.limiter.baseline(), Some(ms(40)));
    sim.run(Duration::from_secs(1), &mut flat(ms(10)));
    let baseline = sim.limiter.baseline().expect("measured");
    assert!(baseline <= ms(11), "baseline {baseline:?}");
    // Now 25 ms is 2.5 × it: cut, until a window at low concurrency
    // finds 25 ms there too, its new baseline.
    sim.run(Duration::from_secs(1), &mut flat(ms(25)));
    let (lo, _) = sim.range_over_last(Duration::from_secs(1));
    assert!(lo <= PROBE_CONCURRENCY, "cut to {lo}");
    assert_eq!(sim.limiter.baseline(), Some(ms(25)));
}

#[test]
fn an_endpoint_of_fixed_capacity_is_kept_busy_with_few_refusals() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    let mut endpoint = capacity(8, ms(20));
    sim.run(Duration::from_secs(2), &mut endpoint);
    sim.measure();
    sim.run(Duration::from_secs(40), &mut endpoint);
    let busy = sim.busy_time / 40.0 / 8.0;
    let refused = sim.refused as f64 / (sim.served + sim.refused) as f64;
    assert!(busy >= 0.9, "{busy:.2} of the capacity used");
    assert!(refused <= 0.03, "{refused:.3} of the attempts refused");
    // Its latency never left the baseline: confirmed, never probed again.
    let (lo, hi) = sim.range_over_last(Duration::from_secs(40));
    assert!(lo > PROBE_CONCURRENCY && hi <= 9, "{lo}..={hi}");
}

#[test]
fn the_limit_climbs_back_when_the_endpoint_recovers() {
    let mut sim = Sim::new(Bounds::DEFAULT);
    sim.run(Duration::from_secs(5), &mut capacity(4, ms(20)));
    let (_, hi) = sim.range_over_last(Duration::from_secs(2));
    assert!(hi <= 5, "at most one over a capacity of 4: {hi}");
    let mut recovered = capacity(32, ms(20));
    sim.run(Duration::from_secs(3), &mut recovered);
    sim.measure();
    sim.run(Duration::from_secs(5), &mut recovered);
    let busy = sim.busy_time / 5.0 / 32.0;
    assert!(busy >= 0.8, "{busy:.2} of the new capacity used");
}

#[test]
fn the_limit_never_leaves_its_bounds() {
    let b = bounds(3, 7, 5);
    let mut l = Limiter::new(b, Duration::ZERO);
    assert_eq!(l.limit(), 4, "probing, above min");
    // A small LCG: the same mix of answers every run.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        seed >> 33
    };
    let mut now = Duration::ZERO;
    let (mut lowest, mut highest) = (usize::MAX, 0);
    for round in 0..20_000 {
        now += MS;
        // Stretches of fast answers, then of refusals and slow ones.
        let storm = (round / 2_000) % 2 == 1;
        let r = next();
        let signal = match r % 10 {
            0..=5 if storm => Signal::Overloaded,
            0 => Signal::Neutral,
            _ => Signal::Success,
        };
        let took = if storm {
            ms(10 + r % 200)
        } else {
            ms(10 + r % 3)
        };
        let in_flight = 1 + (r % 8) as usize;
        l.record(
            Sample {
                signal,
                took,
                in_flight,
            },
            now,
        );
        let limit = l.limit();
        assert!((3..=7).contains(&limit), "{limit} at {round}");
        lowest = lowest.min(limit);
        highest = highest.max(limit);
    }
    assert_eq!((lowest, highest), (3, 7), "both bounds were pressed");
    // Out of range initial values are clamped (config refuses them).
    assert_eq!(Limiter::new(bounds(2, 4, 9), Duration::ZERO).limit(), 4);
}

#[test]
fn a_few_milliseconds_over_a_tiny_baseline_are_no_queue() {
    let mut now = Duration::from_secs(100);
    let mut l = Limiter::new(bounds(1, 256, 16), now);
    for _ in 0..MIN_SAMPLES {
        now += Duration::from_micros(200);
        l.record(success(Duration::from_micros(200), 4), now);
    }
    assert_eq!(l.baseline(), Some(Duration::from_micros(200)));
    // Eight answers sent together after the last judgement.
    let mut window = |l: &mut Limiter, took: Duration| {
        now += took;
        for _ in 0..8 {
            now += Duration::from_micros(1);
            l.record(success(took, 16), now);
        }
        l.limit()
    };
    assert_eq!(
        window(&mut l, ms(2)),
        32,
        "10 × the baseline, 1.8 ms more: grows"
    );
    assert_eq!(window(&mut l, ms(4)), 32, "3.8 ms more: holds");
    assert_eq!(
        window(&mut l, ms(8)),
        20,
        "7.8 ms more: cut by 5.2 / 8, 32 × 0.65 = 20.8"
    );
}
