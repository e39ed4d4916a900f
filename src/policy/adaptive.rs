//! Adaptive concurrency: a destination's limit on attempts in flight,
//! learnt from the answers instead of configured. An AIMD limit (TCP's
//! congestion window, Netflix concurrency-limits' `AIMDLimit`) with a
//! latency gradient and a measured baseline (Envoy's adaptive concurrency
//! filter, its `minRTT`); the caller passes the time in, so tests step it.
//!
//! **Windows.** Decisions are made once per window, about one round trip:
//! a window closes when enough of the attempts *started after it opened*
//! have succeeded (`MIN_SAMPLES`, or half the attempts in flight if more),
//! so what it judges is the limit in force during it, not the one before.
//! Its latency is the median of those attempts' durations: one slow answer
//! among many (a GC pause, a cold cache) does not move it.
//!
//! **Growth.** When a window's median is at most `GROW_BELOW` × the
//! baseline (or `QUEUE_FLOOR / 2` above it, if more), nothing in it said
//! "overloaded", and the limit was used (at least half of it in flight on
//! average over the window's answers: an idle limit proves nothing, and
//! would otherwise climb to `max` and let the next burst through at once;
//! and where the endpoint answers faster than the app sends, more in
//! flight than twice what is needed only costs connections), the limit
//! grows: doubled per window until the first cut (slow start, so that a
//! fast endpoint is found in a few round trips), then by one per window
//! (additive: couriers of several pods that share an endpoint converge to
//! fair shares, which multiplicative growth would not). Just below the
//! value the endpoint last refused, it waits `PLATEAU` windows before
//! trying that value again.
//!
//! **Cuts.** A 429 or 503 (`Busy`), a timeout (`TimedOut`, also a 408) or a
//! refused or reset connection (`SocketError`) cuts the limit at once to
//! `BACKOFF` × it. A window whose median is above `CUT_ABOVE` × the
//! baseline (and `QUEUE_FLOOR` above it) cuts it by the gradient of that
//! threshold over the median, kept within `GRADIENT_FLOOR..=BACKOFF`:
//! twice too slow halves it, barely too slow takes a quarter. At most one cut per round trip: a failure of an
//! attempt that started before the last cut says nothing about the limit
//! set since, so a burst of failures of attempts started under the old
//! limit cuts once, not down to `min`. DNS and TLS failures, 4xx, other
//! 5xx and 410 say nothing about load: they neither cut nor grow.
//!
//! **Baseline.** The endpoint's latency when courier is not queueing
//! there: the median of a window in which at most `PROBE_CONCURRENCY`
//! attempts (or `min`) were in flight. The limiter starts by measuring it
//! (a probe: the limit held there for one window), and measures it again
//! whenever a window runs that low anyway. A window faster than the
//! baseline moves it halfway down (the endpoint got faster: recovered
//! within a few windows, yet one lucky window does not set it), and one
//! within `CONFIRM` × of it confirms it. A baseline neither confirmed nor
//! measured for `PROBE_EVERY` is probed again. So it cannot ratchet
//! upwards under the load courier itself puts there (only a probe, at
//! low concurrency, raises it), and an endpoint that became slower for
//! good (its own database, say) gets a new baseline within `PROBE_EVERY`
//! rather than a limit stuck at `min`.
//!
//! The limit never leaves `min..=max`.

use crate::event::Outcome;
use std::time::Duration;

/// The limit's share kept on an overload signal. Above TCP Reno's half,
/// which leaves an endpoint of fixed capacity well below it for much of
/// each cycle (the limit comes back by one per round trip); below Netflix
/// AIMD's 0.9, which keeps such an endpoint busier still but needs three
/// times the round trips, each with its refusals, to come down when the
/// endpoint's capacity falls (64 to 8: 20 cuts against 7). Figures of the
/// simulated endpoint: benches/RESULTS.md.
pub const BACKOFF: f64 = 0.75;
/// The most one latency cut takes off: half, however slow the window.
pub const GRADIENT_FLOOR: f64 = 0.5;
/// A window slower than this times the baseline is queueing: cut. Twice
/// the baseline is "well above" it: endpoints' latencies wander by tens of
/// percent without any queue (Envoy's default buffer is 25%).
pub const CUT_ABOVE: f64 = 2.0;
/// A window at most this times the baseline may grow the limit; between
/// this and `CUT_ABOVE` the limit holds, so that it settles instead of
/// swinging between a cut and a raise every window.
pub const GROW_BELOW: f64 = 1.5;
/// Added latency below this is never a queue worth cutting for (and half
/// of it never stops growth), however small the baseline: at a baseline
/// of a fraction of a millisecond (loopback, a fast LAN) the schedulers at
/// both ends add as much as any queue, while more in flight still
/// delivers more (benches/RESULTS.md, step g). A few milliseconds are
/// nothing to a webhook endpoint, whose answers take tens to hundreds; its
/// 503s and timeouts still cut.
pub const QUEUE_FLOOR: Duration = Duration::from_millis(5);
/// Where the endpoint last refused, the limit stays this many windows
/// before it tries that value again (TCP CUBIC's plateau around its last
/// maximum): an endpoint of fixed capacity N is then refused about once in
/// seven round trips at N, N − 1 most of the time, where one step a window
/// would try N + 1 every third.
pub const PLATEAU: u32 = 4;
/// A window within this of the baseline confirms it (no probe needed).
pub const CONFIRM: f64 = 1.1;
/// Attempts in flight while the baseline is measured: so few that an
/// endpoint worth delivering to does not queue them (Envoy's
/// `min_concurrency` is 3), enough to fill a window in one round trip.
pub const PROBE_CONCURRENCY: usize = 4;
/// Successes a window needs before it is judged: a median of fewer is noise.
pub const MIN_SAMPLES: usize = 4;
/// A baseline this old, neither confirmed nor measured since, is probed
/// again. A probe costs about two round trips at `PROBE_CONCURRENCY`, a
/// fraction of a percent of this at webhook latencies.
pub const PROBE_EVERY: Duration = Duration::from_secs(30);

/// `concurrency: { adaptive: { min, max, initial } }`, checked:
/// `1 <= min <= initial <= max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: usize,
    pub max: usize,
    pub initial: usize,
}

impl Bounds {
    /// The defaults of an `adaptive: {}` block.
    pub const DEFAULT: Bounds = Bounds {
        min: 1,
        max: 256,
        initial: 16,
    };
}

/// What one attempt's outcome says about the endpoint's load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Delivered: its duration is a latency sample.
    Success,
    /// 429, 503, a timeout or a refused or reset connection.
    Overloaded,
    /// Anything else: no word on load.
    Neutral,
}

impl Signal {
    pub fn of(outcome: Outcome) -> Signal {
        match outcome {
            Outcome::Delivered => Signal::Success,
            Outcome::Busy | Outcome::TimedOut | Outcome::SocketError => Signal::Overloaded,
            _ => Signal::Neutral,
        }
    }
}

/// One finished attempt. Times are on the caller's monotonic clock, as
/// offsets from any fixed origin.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub signal: Signal,
    /// How long the attempt took, request to answer (or failure).
    pub took: Duration,
    /// Attempts in flight when it ended, itself included.
    pub in_flight: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Baseline {
    latency: Duration,
    /// When it was last measured or confirmed.
    at: Duration,
}

/// The attempts judged together.
#[derive(Debug)]
struct Window {
    opened: Duration,
    /// Durations of the successes of attempts started since `opened`.
    latencies: Vec<Duration>,
    /// The most attempts in flight reported during the window.
    max_in_flight: usize,
    /// The attempts in flight each answer reported, summed, and the
    /// answers: their mean is how much of the limit was used.
    in_flight_sum: usize,
    answers: usize,
    /// An overload signal came in the window (cut or not).
    overloaded: bool,
}

impl Window {
    fn open(at: Duration) -> Window {
        Window {
            opened: at,
            latencies: Vec::new(),
            max_in_flight: 0,
            in_flight_sum: 0,
            answers: 0,
            overloaded: false,
        }
    }
}

/// One destination's learnt limit.
#[derive(Debug)]
pub struct Limiter {
    bounds: Bounds,
    limit: usize,
    /// Doubling per window until the first cut.
    slow_start: bool,
    last_cut: Option<Duration>,
    /// The limit the endpoint last refused (cut on an overload signal),
    /// until a window passes above it; and windows waited just below it.
    ceiling: Option<usize>,
    plateau: u32,
    baseline: Option<Baseline>,
    /// Measuring the baseline: the limit is held at `probe_limit`.
    probing: bool,
    window: Window,
}

impl Limiter {
    /// Starts at `bounds.initial`, first measuring the baseline.
    pub fn new(bounds: Bounds, now: Duration) -> Limiter {
        Limiter {
            bounds,
            limit: bounds.initial.clamp(bounds.min, bounds.max),
            slow_start: true,
            last_cut: None,
            ceiling: None,
            plateau: 0,
            baseline: None,
            probing: true,
            window: Window::open(now),
        }
    }

    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Attempts that may be in flight now.
    pub fn limit(&self) -> usize {
        if self.probing {
            self.limit.min(self.probe_limit())
        } else {
            self.limit
        }
    }

    /// The endpoint's latency without courier's queue, once measured.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline.map(|b| b.latency)
    }

    fn probe_limit(&self) -> usize {
        PROBE_CONCURRENCY.max(self.bounds.min)
    }

    /// Learns from one finished attempt.
    pub fn record(&mut self, sample: Sample, now: Duration) {
        let started = now.checked_sub(sample.took);
        let w = &mut self.window;
        w.max_in_flight = w.max_in_flight.max(sample.in_flight);
        w.in_flight_sum += sample.in_flight;
        w.answers += 1;
        match sample.signal {
            Signal::Overloaded => {
                w.overloaded = true;
                // One cut per round trip: only an attempt started under
                // the limit set by the last cut may cut it again.
                let since_cut = match (self.last_cut, started) {
                    (None, _) => true,
                    (Some(cut), Some(started)) => started >= cut,
                    (Some(_), None) => false,
                };
                if since_cut {
                    self.ceiling = Some(self.limit);
                    self.plateau = 0;
                    self.cut(BACKOFF, now);
                }
                return;
            }
            Signal::Success if started.is_some_and(|s| s >= w.opened) => {
                w.latencies.push(sample.took)
            }
            Signal::Success | Signal::Neutral => return,
        }
        let wanted = if self.probing {
            MIN_SAMPLES
        } else {
            MIN_SAMPLES.max(w.max_in_flight.min(self.limit) / 2)
        };
        if w.latencies.len() >= wanted {
            self.close(now);
        }
    }

    /// Judges the window that just filled, and opens the next.
    fn close(&mut self, now: Duration) {
        let window = std::mem::replace(&mut self.window, Window::open(now));
        let mut latencies = window.latencies;
        let mid = latencies.len() / 2;
        let median = *latencies.select_nth_unstable(mid).1;
        let low = window.max_in_flight <= self.probe_limit();
        match self.baseline {
            // Measured at low concurrency: this is the baseline, up or down.
            // A probe says nothing about the limit itself (its window ran
            // below it by design): judged as measured, no more.
            _ if self.probing => {
                self.baseline = Some(Baseline {
                    latency: median,
                    at: now,
                });
                self.probing = false;
                return;
            }
            _ if low => {
                self.baseline = Some(Baseline {
                    latency: median,
                    at: now,
                });
            }
            Some(b) if median > slower(b.latency, CUT_ABOVE, QUEUE_FLOOR) => {
                let allowed = slower(b.latency, CUT_ABOVE, QUEUE_FLOOR);
                let gradient = allowed.as_secs_f64() / median.as_secs_f64();
                self.cut(gradient.clamp(GRADIENT_FLOOR, BACKOFF), now);
                return;
            }
            Some(b) if median <= b.latency => {
                self.baseline = Some(Baseline {
                    latency: (b.latency + median) / 2,
                    at: now,
                });
            }
            Some(b) if median.as_secs_f64() <= CONFIRM * b.latency.as_secs_f64() => {
                self.baseline = Some(Baseline { at: now, ..b });
            }
            _ => {}
        }
        let Some(b) = self.baseline else { return };
        let fast = median <= slower(b.latency, GROW_BELOW, QUEUE_FLOOR / 2);
        // On average, not at a peak: a burst that filled the limit for a
        // moment says little about the attempts it keeps busy.
        let used = window.in_flight_sum * 2 >= self.limit * window.answers.max(1);
        if fast && used && !window.overloaded {
            self.grow();
        }
        if now.saturating_sub(b.at) >= PROBE_EVERY && self.limit > self.probe_limit() {
            self.probing = true;
        }
    }

    /// One window's raise: doubled in slow start, else one more, waiting
    /// `PLATEAU` windows before the value last refused.
    fn grow(&mut self) {
        let next = if self.slow_start {
            self.limit.saturating_mul(2)
        } else {
            self.limit + 1
        };
        match self.ceiling {
            Some(ceiling) if next > ceiling => self.ceiling = None,
            Some(ceiling) if next == ceiling && self.plateau + 1 < PLATEAU => {
                self.plateau += 1;
                return;
            }
            _ => {}
        }
        self.plateau = 0;
        self.limit = next.clamp(self.bounds.min, self.bounds.max);
    }

    /// Multiplies the limit by `factor` (< 1), and starts a new window.
    fn cut(&mut self, factor: f64, now: Duration) {
        let cut = (self.limit as f64 * factor).floor() as usize;
        self.limit = cut.clamp(self.bounds.min, self.bounds.max);
        self.slow_start = false;
        self.last_cut = Some(now);
        self.window = Window::open(now);
    }
}

/// `baseline` × `ratio`, or `baseline` + `floor` if that is more.
fn slower(baseline: Duration, ratio: f64, floor: Duration) -> Duration {
    baseline.mul_f64(ratio).max(baseline + floor)
}

#[cfg(test)]
mod tests;
