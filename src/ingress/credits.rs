//! Service Bus's credit throttle (docs/configuration.md
//! `ingress.credits_per_second`): each route gets N credits at the start of
//! a one-second period, an accepted event costs 1 and, on a topic, each
//! subscription filter it is evaluated against costs 1 more; when a
//! request needs more than are left, it is refused whole until the next
//! period begins.
//!
//! Written here rather than with `governor`: its GCRA hands one credit back
//! every 1/N s, so a burst spread over a tenth of a second gets more than N
//! through, and Service Bus's semantics are a grant per period. A period
//! begins with the first request after the last one ended, so a burst
//! after an idle second gets exactly N, wherever the clock's second falls.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

const PERIOD_MS: u64 = 1000;

/// Every route's current period. One lock: the critical section is a few
/// additions, far shorter than anything else a request does.
#[derive(Default)]
pub struct Credits {
    periods: Mutex<HashMap<String, Period>>,
}

#[derive(Clone, Copy)]
struct Period {
    began_ms: u64,
    used: u64,
}

/// Why a request was not given its credits.
#[derive(Debug, PartialEq, Eq)]
pub enum Throttled {
    /// The period's credits are spent: the next period begins in `ms`.
    Wait { ms: u64 },
    /// The request alone needs more than a whole period grants.
    Never { cost: u64 },
}

impl Credits {
    /// Takes `cost` credits of `route`'s period at `now_ms` (a monotonic
    /// clock), or none. `per_second` is read per request, so that a reload
    /// applies at once.
    pub fn take(
        &self,
        route: &str,
        per_second: u64,
        cost: u64,
        now_ms: u64,
    ) -> Result<(), Throttled> {
        if cost > per_second {
            return Err(Throttled::Never { cost });
        }
        let mut periods = self.periods.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = Period {
            began_ms: now_ms,
            used: 0,
        };
        let period = match periods.get_mut(route) {
            Some(p) => p,
            None => periods.entry(route.to_string()).or_insert(fresh),
        };
        let ends_ms = period.began_ms.saturating_add(PERIOD_MS);
        if now_ms >= ends_ms {
            *period = fresh;
        }
        if period.used + cost > per_second {
            let ends_ms = period.began_ms + PERIOD_MS;
            return Err(Throttled::Wait {
                ms: ends_ms - now_ms,
            });
        }
        period.used += cost;
        Ok(())
    }
}

/// What a request costs: each event 1, and on a topic 1 more per
/// subscriber, since every subscription's filter is evaluated for it.
pub fn cost(events: usize, subscribers: usize) -> u64 {
    events as u64 * (1 + subscribers as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_795_000_000_123;

    #[test]
    fn a_period_grants_its_credits_once_and_refuses_the_rest_until_it_ends() {
        let c = Credits::default();
        for i in 0..50 {
            assert_eq!(c.take("orders", 50, 1, T0 + i), Ok(()), "event {i}");
        }
        assert_eq!(
            c.take("orders", 50, 1, T0 + 50),
            Err(Throttled::Wait { ms: 950 })
        );
        assert_eq!(
            c.take("orders", 50, 1, T0 + 999),
            Err(Throttled::Wait { ms: 1 })
        );
        // Another route has its own credits.
        assert_eq!(c.take("billing", 50, 50, T0 + 999), Ok(()));
        // The next period starts with the first request after the last ended.
        assert_eq!(c.take("orders", 50, 50, T0 + 1000), Ok(()));
        assert_eq!(
            c.take("orders", 50, 1, T0 + 1999),
            Err(Throttled::Wait { ms: 1 })
        );
        assert_eq!(c.take("orders", 50, 1, T0 + 5000), Ok(()));
        assert_eq!(c.take("orders", 50, 49, T0 + 5999), Ok(()));
        assert_eq!(
            c.take("orders", 50, 1, T0 + 5999),
            Err(Throttled::Wait { ms: 1 })
        );
    }

    #[test]
    fn a_refused_request_takes_nothing_and_one_too_big_is_never_admitted() {
        let c = Credits::default();
        assert_eq!(c.take("shop", 10, 4, T0), Ok(()));
        assert_eq!(c.take("shop", 10, 4, T0), Ok(()));
        assert_eq!(c.take("shop", 10, 4, T0), Err(Throttled::Wait { ms: 1000 }));
        // The refusal took nothing: the 2 left are still there.
        assert_eq!(c.take("shop", 10, 2, T0 + 1), Ok(()));
        assert_eq!(
            c.take("shop", 10, 11, T0 + 2000),
            Err(Throttled::Never { cost: 11 })
        );
        assert_eq!(c.take("shop", 10, 10, T0 + 2000), Ok(()));
    }

    #[test]
    fn a_topic_event_costs_one_per_subscriber_more() {
        assert_eq!(cost(1, 0), 1);
        assert_eq!(cost(1, 3), 4);
        assert_eq!(cost(200, 0), 200);
        assert_eq!(cost(5, 2), 15);
    }
}
