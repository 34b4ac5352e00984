//! A schedule's stored record (`docs/keyspace.md`, "Schedule record"):
//! `(1, Spec, Info, Priority | nil, MaxAttempts | nil, Keep | nil,
//! NextRunAt, LastRun | nil)`. `Spec` and `Info` are JSON objects (the
//! spec normalized), `MaxAttempts` and `Keep` are `-1` for infinity,
//! `NextRunAt` the Unix ms of the next slot, `LastRun` the id of the last
//! job a slot created. Format 2, for a schedule whose jobs get a group or
//! an activity timeout: format 1's elements and `Group | nil,
//! ActivityTimeout | nil` (`-1` for infinity).

use foundationdb_tuple::{pack, unpack, Bytes, Element};

use crate::jobs::{ActivityTimeout, JobOpts, Keep, MaxAttempts};

const FORMAT: i64 = 1;
const FORMAT_2: i64 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub spec_json: Vec<u8>,
    pub info: Vec<u8>,
    /// The options of each slot's job (`priority`, `max_attempts`, `keep`,
    /// `group`, `activity_timeout`).
    pub opts: JobOpts,
    pub next_run_at: u64,
    pub last_run: Option<Vec<u8>>,
}

type Packed<'a> = (i64, Bytes<'a>, Bytes<'a>, Option<i64>, Option<i64>, Option<i64>, i64, Option<Bytes<'a>>);

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let max_attempts = self.opts.max_attempts.map(|m| match m {
            MaxAttempts::Limit(n) => i64::try_from(n).unwrap_or(i64::MAX),
            MaxAttempts::Infinity => -1,
        });
        let keep = self.opts.keep.map(|k| match k {
            Keep::Seconds(s) => i64::try_from(s).unwrap_or(i64::MAX),
            Keep::Infinity => -1,
        });
        let extended = self.opts.group.is_some() || self.opts.activity_timeout.is_some();
        let packed: Packed<'_> = (
            if extended { FORMAT_2 } else { FORMAT },
            Bytes::from(self.spec_json.as_slice()),
            Bytes::from(self.info.as_slice()),
            self.opts.priority,
            max_attempts,
            keep,
            i64::try_from(self.next_run_at).unwrap_or(i64::MAX),
            self.last_run.as_deref().map(Bytes::from),
        );
        let mut out = pack(&packed);
        if extended {
            let timeout = self.opts.activity_timeout.map(|t| match t {
                ActivityTimeout::Seconds(s) => i64::try_from(s).unwrap_or(i64::MAX),
                ActivityTimeout::Infinity => -1,
            });
            out.extend(pack(&(self.opts.group.as_deref().map(Bytes::from), timeout)));
        }
        out
    }

    /// `None` for a value of another format or shape.
    pub fn decode(value: &[u8]) -> Option<Record> {
        let all: Vec<Element> = unpack(value).ok()?;
        let (group, activity_timeout, value) = match all.first().and_then(Element::as_i64) {
            Some(FORMAT) if all.len() == 8 => (None, None, value.to_vec()),
            Some(FORMAT_2) if all.len() == 10 => {
                let group = match &all[8] {
                    Element::Nil => None,
                    other => Some(other.as_bytes()?.to_vec()),
                };
                let timeout = match &all[9] {
                    Element::Nil => None,
                    other => match other.as_i64()? {
                        -1 => Some(ActivityTimeout::Infinity),
                        n if n > 0 => Some(ActivityTimeout::Seconds(n as u64)),
                        _ => return None,
                    },
                };
                (group, timeout, pack(&all[..8].to_vec()))
            }
            _ => return None,
        };
        let (_, spec, info, priority, max_attempts, keep, next, last): Packed<'_> = unpack(&value).ok()?;
        let max_attempts = max_attempts.map(|n| if n < 0 { MaxAttempts::Infinity } else { MaxAttempts::Limit(n as u64) });
        let keep = keep.map(|s| if s < 0 { Keep::Infinity } else { Keep::Seconds(s as u64) });
        Some(Record {
            spec_json: spec.into_owned(),
            info: info.into_owned(),
            opts: JobOpts { priority, max_attempts, keep, group, activity_timeout, ..JobOpts::default() },
            next_run_at: u64::try_from(next).ok()?,
            last_run: last.map(Bytes::into_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let rec = Record {
            spec_json: br#"{"every":1000}"#.to_vec(),
            info: b"{}".to_vec(),
            opts: JobOpts { priority: Some(-3), max_attempts: Some(MaxAttempts::Infinity), keep: Some(Keep::Seconds(60)), ..JobOpts::default() },
            next_run_at: 1_767_225_600_000,
            last_run: Some(b"s@1767225599000".to_vec()),
        };
        assert_eq!(Record::decode(&rec.encode()), Some(rec.clone()));
        assert_eq!(unpack::<Vec<Element>>(&rec.encode()).unwrap()[0], Element::Int(1), "no group, no timeout: format 1");
        let with = Record {
            opts: JobOpts {
                group: Some(b"g\x00".to_vec()),
                activity_timeout: Some(ActivityTimeout::Seconds(26)),
                ..rec.opts.clone()
            },
            ..rec.clone()
        };
        assert_eq!(Record::decode(&with.encode()), Some(with.clone()));
        let infinite = Record { opts: JobOpts { activity_timeout: Some(ActivityTimeout::Infinity), ..JobOpts::default() }, ..rec.clone() };
        assert_eq!(Record::decode(&infinite.encode()), Some(infinite));
        let bare = Record { opts: JobOpts::default(), last_run: None, ..rec };
        assert_eq!(Record::decode(&bare.encode()), Some(bare));
        assert_eq!(Record::decode(b"\x15\x02"), None);
    }
}
