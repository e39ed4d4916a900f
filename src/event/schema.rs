//! The three shapes an event comes in (a destination's `schema`): what
//! ingress checks a body against, the delivery headers and batch shape,
//! and what a dead letter's record looks like.

use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Schema {
    /// Any body, delivered as the app sent it.
    #[default]
    Custom,
    Eventgrid,
    Cloudevents,
}

impl Schema {
    pub fn as_str(self) -> &'static str {
        match self {
            Schema::Custom => "custom",
            Schema::Eventgrid => "eventgrid",
            Schema::Cloudevents => "cloudevents",
        }
    }
}
