//! Two settings of one build measured in turn, off, on, on, off, so that
//! the machine's drift weighs on both alike; the budget is on's mean rate
//! against off's (steps y, l, r, u).

use super::{Budget, Check, Row, budget};

/// The order of the four loads; `false` is the side the other is judged
/// against.
pub const TURNS: [bool; 4] = [false, true, true, false];

/// Per side (off, on): each load's rate, the CPU seconds and events of
/// all its loads; the rows in the order run.
#[derive(Default)]
pub struct Alternated {
    pub rows: Vec<Row>,
    rates: [Vec<f64>; 2],
    cpu: [f64; 2],
    accepted: [f64; 2],
}

impl Alternated {
    /// The number of `on`'s next load (1 or 2), for its row's name.
    pub fn next(&self, on: bool) -> usize {
        self.rates[usize::from(on)].len() + 1
    }

    pub fn push(&mut self, on: bool, row: Row) {
        let i = usize::from(on);
        self.rates[i].push(row.rate.unwrap_or(0.0));
        self.cpu[i] += row.cpu.unwrap_or(0.0);
        self.accepted[i] += row.events.unwrap_or(0.0);
        self.rows.push(row);
    }

    /// Each side's mean rate (events/s) and CPU per event (µs): off, on.
    fn means(&self) -> ([f64; 2], [f64; 2]) {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let rate = [mean(&self.rates[0]), mean(&self.rates[1])];
        let us = [0, 1].map(|i| self.cpu[i] * 1e6 / self.accepted[i].max(1.0));
        (rate, us)
    }

    /// The budget on's rate ≥ `min` × off's; `sides` names them (off, on)
    /// and `unit` is the check's ("x off").
    pub fn budget(&self, name: String, min: f64, sides: [&str; 2], unit: &'static str) -> Budget {
        let (rate, us) = self.means();
        let ratio = rate[1] / rate[0].max(1e-9);
        budget(
            name,
            vec![Check::at_least(ratio, min, unit)],
            format!(
                "{} {:.0}/s at {:.1} µs/event, {} {:.0}/s at {:.1} µs/event (means of two loads each): {ratio:.3}x (≥ {min})",
                sides[1], rate[1], us[1], sides[0], rate[0], us[0]
            ),
        )
    }
}
