//! Events as values, apart from where they are stored.

pub mod rules;
