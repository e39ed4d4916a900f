//! Hand-off (docs/object-storage.md): a pod's journal lives on an `emptyDir` that a
//! rolling deploy deletes. With `handoff.url`, courier writes the events
//! still pending at SIGTERM (after `shutdown_grace`) to objects in a
//! bucket, each event with where its delivery stood, and every courier of
//! the same url adopts them: at start and every `handoff.poll` it claims an
//! object with a conditional create (exactly one wins), appends its events
//! durably to its own journal, then deletes it.
//!
//! Layout under the prefix:
//! - `pending/<uuidv7>-<events>.cho`: a hand-off object (`object`);
//! - `damaged/<object>`: an object that fails its checksum, set aside for
//!   an operator, never adopted in part;
//! - `claims/<object>/<generation>`: who adopts it. A claim older than
//!   `handoff.claim_timeout` belongs to a courier that died while adopting:
//!   the next generation takes over (its events may then be delivered twice,
//!   which at-least-once allows, and which the log says).
//!
//! Every step is ordered so that a crash loses nothing: events leave the
//! journal only once the object holding them is stored; an object is
//! deleted only once its events are durable in the adopter's journal.

mod adopt;
pub(crate) mod object;
mod write;

pub use adopt::adopt_loop;
pub(crate) use adopt::sort;
pub use write::hand_off;

use crate::config::HandoffSettings;
use crate::storage::Bucket;
use object_store::path::Path;

const PENDING: &str = "pending";
const CLAIMS: &str = "claims";
pub(super) const DAMAGED: &str = "damaged";

/// The store, opened, and the settings it was opened with.
pub struct Handoff {
    bucket: Bucket,
    settings: HandoffSettings,
}

impl Handoff {
    pub fn open(settings: &HandoffSettings) -> Result<Handoff, object_store::Error> {
        Ok(Handoff {
            bucket: Bucket::open(&settings.url)?,
            settings: settings.clone(),
        })
    }

    fn pending(&self) -> Path {
        self.bucket.path([PENDING])
    }

    fn object(&self, name: &str) -> Path {
        self.bucket.path([PENDING, name])
    }

    fn claims(&self, name: &str) -> Path {
        self.bucket.path([CLAIMS, name])
    }

    fn claim(&self, name: &str, generation: u32) -> Path {
        let g = format!("{generation:06}");
        self.bucket.path([CLAIMS, name, g.as_str()])
    }
}
