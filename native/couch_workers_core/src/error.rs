//! The outcomes an API call can have besides success.
//!
//! Kept apart from [`StoreError`]: an `Error` is an *expected* answer
//! (`not_found`, `already_exists`, `not_owner`, `canceled`) or bad input,
//! which the NIF turns into `{error, Atom}`; store conflicts never get here
//! (the retry loop retries them), other store failures arrive as
//! `Error::Store` and become `{error, Name}` with the store error's name.

use crate::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    #[error("not the owner")]
    NotOwner,
    #[error("canceled")]
    Canceled,
    /// A conditional write (`if_vs`) found the job changed or gone.
    #[error("changed")]
    Changed,
    /// A fenced write (`if_leader`) found another leadership than its
    /// epoch's, or none.
    #[error("not the leader")]
    NotLeader,
    /// A schedule's spec that cannot be used, and why.
    #[error("bad schedule: {0}")]
    BadSchedule(String),
    /// Bad input that passed the NIF's shape checks (an empty worker id,
    /// a zero timeout, ...).
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another scheduled, pending or running job of the type holds the
    /// unique key asked for: its id.
    #[error("duplicate of job {0:?}")]
    Duplicate(Vec<u8>),
}

impl Error {
    /// The atom the Erlang side sees in `{error, Atom}`.
    pub fn name(&self) -> &'static str {
        match self {
            Error::NotFound => "not_found",
            Error::AlreadyExists => "already_exists",
            Error::NotOwner => "not_owner",
            Error::Canceled => "canceled",
            Error::Changed => "changed",
            Error::NotLeader => "not_leader",
            Error::BadSchedule(_) => "bad_schedule",
            Error::Invalid(what) => what,
            Error::Store(e) => e.name(),
            Error::Duplicate(_) => "duplicate",
        }
    }
}

/// Checks a key against FoundationDB's limit before anything is written,
/// so that the caller gets `{error, key_too_large}` rather than a failed
/// commit.
pub fn check_key(key: &[u8]) -> Result<(), Error> {
    if key.len() > crate::store::MAX_KEY_SIZE {
        Err(Error::Store(StoreError::KeyTooLarge))
    } else {
        Ok(())
    }
}

/// Same for a value.
pub fn check_value(value: &[u8]) -> Result<(), Error> {
    if value.len() > crate::store::MAX_VALUE_SIZE {
        Err(Error::Store(StoreError::ValueTooLarge))
    } else {
        Ok(())
    }
}
