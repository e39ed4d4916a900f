//! The names an attempt's end and a dead letter's cause are known by, as
//! Event Grid spells them: kept typed wherever they are held, and spelt
//! only where they are written (journal rows, records, metrics, the API).

/// Event Grid's `lastDeliveryOutcome` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Delivered,
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Gone,
    PayloadTooLarge,
    TimedOut,
    Busy,
    Failed,
    SocketError,
    ResolutionError,
    TlsError,
    Probation,
    /// The address guard refused every address of the endpoint
    /// (docs/delivery.md, "The address guard").
    AddressNotAllowed,
}

impl Outcome {
    /// Every outcome, in declaration order.
    /// In the order of history's codes: new ones go last.
    pub const ALL: [Outcome; 15] = [
        Outcome::Delivered,
        Outcome::BadRequest,
        Outcome::Unauthorized,
        Outcome::Forbidden,
        Outcome::NotFound,
        Outcome::Gone,
        Outcome::PayloadTooLarge,
        Outcome::TimedOut,
        Outcome::Busy,
        Outcome::Failed,
        Outcome::SocketError,
        Outcome::ResolutionError,
        Outcome::TlsError,
        Outcome::Probation,
        Outcome::AddressNotAllowed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "Delivered",
            Outcome::BadRequest => "BadRequest",
            Outcome::Unauthorized => "Unauthorized",
            Outcome::Forbidden => "Forbidden",
            Outcome::NotFound => "NotFound",
            Outcome::Gone => "Gone",
            Outcome::PayloadTooLarge => "PayloadTooLarge",
            Outcome::TimedOut => "TimedOut",
            Outcome::Busy => "Busy",
            Outcome::Failed => "Failed",
            Outcome::SocketError => "SocketError",
            Outcome::ResolutionError => "ResolutionError",
            Outcome::TlsError => "TlsError",
            Outcome::Probation => "Probation",
            Outcome::AddressNotAllowed => "AddressNotAllowed",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// Event Grid's `deadLetterReason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    MaxDeliveryAttemptsExceeded,
    TimeToLiveExceeded,
    NonRetriableStatus,
    /// The address guard refused the endpoint's addresses.
    AddressNotAllowed,
    /// Its endpoint was disabled (`url: per_event`).
    EndpointDisabled,
}

impl Reason {
    /// In the order of history's codes: new ones go last.
    pub const ALL: [Reason; 5] = [
        Reason::MaxDeliveryAttemptsExceeded,
        Reason::TimeToLiveExceeded,
        Reason::NonRetriableStatus,
        Reason::AddressNotAllowed,
        Reason::EndpointDisabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MaxDeliveryAttemptsExceeded => "MaxDeliveryAttemptsExceeded",
            Reason::TimeToLiveExceeded => "TimeToLiveExceeded",
            Reason::NonRetriableStatus => "NonRetriableStatus",
            Reason::AddressNotAllowed => "AddressNotAllowed",
            Reason::EndpointDisabled => "EndpointDisabled",
        }
    }

    /// The reason named `s` (as `as_str` spells it), e.g. read back from
    /// the journal.
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}
