//! A job type's settings, stored once for the whole cluster: the default
//! activity timeout of its jobs and its running limits. The value's
//! format: `docs/keyspace.md` ("Type settings").

use foundationdb_tuple::{pack, unpack};

use crate::error::Error;
use crate::store::StoreError;

/// The format version of the type settings value written by this code.
const SETTINGS_FORMAT: i64 = 1;

/// A job type's settings, defaults filled in. `None` is `infinity` (no
/// timeout, no limit), the default of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TypeSettings {
    /// Seconds a running job may go without a change of its record; the
    /// default of the job option of the same name.
    pub activity_timeout: Option<u64>,
    /// Most jobs of the type running at once, cluster-wide.
    pub max_running: Option<u64>,
    /// Most jobs of one group of the type running at once, cluster-wide.
    pub max_running_per_group: Option<u64>,
}

/// One setting to change (`job_type_set/2`); settings not named keep
/// their values. `None` sets `infinity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeSetting {
    ActivityTimeout(Option<u64>),
    MaxRunning(Option<u64>),
    MaxRunningPerGroup(Option<u64>),
}

impl TypeSetting {
    /// A value is a positive integer or `infinity` (`None`); zero and
    /// values the store's integers cannot hold are refused.
    fn check(self) -> Result<(), Error> {
        let (value, what) = match self {
            TypeSetting::ActivityTimeout(v) => (v, "bad_activity_timeout"),
            TypeSetting::MaxRunning(v) => (v, "bad_max_running"),
            TypeSetting::MaxRunningPerGroup(v) => (v, "bad_max_running_per_group"),
        };
        match value {
            Some(0) => Err(Error::Invalid(what)),
            Some(n) if n > i64::MAX as u64 => Err(Error::Invalid(what)),
            _ => Ok(()),
        }
    }
}

impl TypeSettings {
    /// These settings with `changes` applied, in order; `Invalid` (and
    /// nothing applied) if any value is out of range.
    pub fn with(mut self, changes: &[TypeSetting]) -> Result<TypeSettings, Error> {
        for change in changes {
            change.check()?;
        }
        for change in changes {
            match *change {
                TypeSetting::ActivityTimeout(v) => self.activity_timeout = v,
                TypeSetting::MaxRunning(v) => self.max_running = v,
                TypeSetting::MaxRunningPerGroup(v) => self.max_running_per_group = v,
            }
        }
        Ok(self)
    }

    /// Whether a running limit differs from `other`'s (acceptors waiting
    /// for a slot must look again).
    pub(crate) fn limits_differ(&self, other: &TypeSettings) -> bool {
        self.max_running != other.max_running || self.max_running_per_group != other.max_running_per_group
    }

    /// The stored value: `(1, ActivityTimeout, MaxRunning,
    /// MaxRunningPerGroup)`, each an integer, `-1` for infinity.
    pub fn encode(&self) -> Vec<u8> {
        let int = |v: Option<u64>| v.map_or(-1, |n| n as i64);
        pack(&(SETTINGS_FORMAT, int(self.activity_timeout), int(self.max_running), int(self.max_running_per_group)))
    }

    /// Decodes a stored value; an unknown format or shape is refused
    /// rather than guessed.
    pub fn decode(value: &[u8]) -> Result<TypeSettings, StoreError> {
        let corrupt = |what: &str| StoreError::Invalid(format!("corrupt type settings: {what}"));
        let (format, timeout, max, per_group) =
            unpack::<(i64, i64, i64, i64)>(value).map_err(|e| corrupt(&e.to_string()))?;
        if format != SETTINGS_FORMAT {
            return Err(corrupt(&format!("unknown format {format}")));
        }
        let limit = |v: i64| match v {
            -1 => Ok(None),
            n if n > 0 => Ok(Some(n as u64)),
            n => Err(corrupt(&format!("value {n}"))),
        };
        Ok(TypeSettings {
            activity_timeout: limit(timeout)?,
            max_running: limit(max)?,
            max_running_per_group: limit(per_group)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_round_trips_and_defaults_are_infinity() {
        let s = TypeSettings { activity_timeout: Some(30), max_running: None, max_running_per_group: Some(2) };
        assert_eq!(TypeSettings::decode(&s.encode()), Ok(s));
        assert_eq!(TypeSettings::decode(&TypeSettings::default().encode()), Ok(TypeSettings::default()));
    }

    #[test]
    fn zero_and_oversized_values_are_refused_and_nothing_applies() {
        let s = TypeSettings::default();
        assert_eq!(s.with(&[TypeSetting::MaxRunning(Some(3)), TypeSetting::MaxRunningPerGroup(Some(0))]), Err(Error::Invalid("bad_max_running_per_group")));
        assert_eq!(s.with(&[TypeSetting::ActivityTimeout(Some(u64::MAX))]), Err(Error::Invalid("bad_activity_timeout")));
        assert_eq!(s.with(&[TypeSetting::MaxRunning(Some(0))]), Err(Error::Invalid("bad_max_running")));
        let set = s.with(&[TypeSetting::MaxRunning(Some(3)), TypeSetting::MaxRunning(None)]).unwrap();
        assert_eq!(set, TypeSettings::default(), "later changes win");
    }

    #[test]
    fn unknown_formats_and_values_are_refused() {
        assert!(TypeSettings::decode(&pack(&(2i64, -1i64, -1i64, -1i64))).is_err());
        assert!(TypeSettings::decode(&pack(&(1i64, 0i64, -1i64, -1i64))).is_err());
        assert!(TypeSettings::decode(&pack(&(1i64, -1i64))).is_err());
    }
}
