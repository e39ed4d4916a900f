//! Pure delivery policy: what an answer means, when to try again, when to
//! stop. No I/O and no clocks here; callers pass times in, so every rule is
//! unit tested exhaustively.

pub mod adaptive;
pub mod address;
pub mod classify;
pub mod inline;
pub mod limits;
pub mod probation;
pub mod rate;
pub mod schedule;
pub mod sns;

pub use classify::{Classified, StatusPolicy, Transport, Verdict};
pub use limits::{Limits, Next, Plan};
pub use schedule::Schedule;
