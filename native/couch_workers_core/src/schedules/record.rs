//! A schedule's stored record (`docs/keyspace.md`, "Schedule record"):
//! `(1, Spec, Info, Priority | nil, MaxAttempts | nil, Keep | nil,
//! NextRunAt, LastRun | nil)`. `Spec` and `Info` are JSON objects (the
//! spec normalized), `MaxAttempts` and `Keep` are `-1` for infinity,
//! `NextRunAt` the Unix ms of the next slot, `LastRun` the id of the last
//! job a slot created.

use foundationdb_tuple::{pack, unpack, Bytes};

use crate::jobs::{JobOpts, Keep, MaxAttempts};

const FORMAT: i64 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub spec_json: Vec<u8>,
    pub info: Vec<u8>,
    /// The options of each slot's job (`priority`, `max_attempts`, `keep`).
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
        let packed: Packed<'_> = (
            FORMAT,
            Bytes::from(self.spec_json.as_slice()),
            Bytes::from(self.info.as_slice()),
            self.opts.priority,
            max_attempts,
            keep,
            i64::try_from(self.next_run_at).unwrap_or(i64::MAX),
            self.last_run.as_deref().map(Bytes::from),
        );
        pack(&packed)
    }

    /// `None` for a value of another format or shape.
    pub fn decode(value: &[u8]) -> Option<Record> {
        let (format, spec, info, priority, max_attempts, keep, next, last): Packed<'_> = unpack(value).ok()?;
        if format != FORMAT {
            return None;
        }
        let max_attempts = max_attempts.map(|n| if n < 0 { MaxAttempts::Infinity } else { MaxAttempts::Limit(n as u64) });
        let keep = keep.map(|s| if s < 0 { Keep::Infinity } else { Keep::Seconds(s as u64) });
        Some(Record {
            spec_json: spec.into_owned(),
            info: info.into_owned(),
            opts: JobOpts { priority, max_attempts, keep, ..JobOpts::default() },
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
        let bare = Record { opts: JobOpts::default(), last_run: None, ..rec };
        assert_eq!(Record::decode(&bare.encode()), Some(bare));
        assert_eq!(Record::decode(b"\x15\x02"), None);
    }
}
