//! A schedule's spec: when its slots fall due. Given as a JSON object
//! (`every` or `cron`, and optionally `start_at`, `overlap`, `catch_up`)
//! and stored in the normalized form [`Spec::to_json`] writes.
//!
//! Slots are Unix ms. `every`: `start_at + k * every` (`start_at`
//! defaults to 0, so every node and every re-set agree on the slots);
//! `cron`: the minutes a standard 5-field pattern matches, in UTC, at or
//! after `start_at` (parsed and evaluated by the `croner` crate).

use chrono::{DateTime, TimeZone as _, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde_json::{Map, Value};

/// The shortest `every`, in ms.
pub const MIN_EVERY_MS: u64 = 1000;

/// Most runs `catch_up => all` creates for the slots one outage missed.
pub const MAX_CATCH_UP: usize = 100;

/// When the slots fall.
#[derive(Debug, Clone)]
pub enum Period {
    Every(u64),
    Cron { pattern: String, cron: Box<Cron> },
}

/// What runs when the cluster was down across several slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// One run, for the latest missed slot.
    Latest,
    /// None: wait for the next slot.
    None,
    /// One run per missed slot, the latest [`MAX_CATCH_UP`].
    All,
}

impl CatchUp {
    pub fn name(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::None => "none",
            CatchUp::All => "all",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub period: Period,
    pub start_at: Option<u64>,
    /// Whether a due run is created while the previous run is still
    /// scheduled, pending or running.
    pub overlap: bool,
    pub catch_up: CatchUp,
}

/// The slots due at one look: the latest ones, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// At most [`MAX_CATCH_UP`], the latest last.
    pub slots: Vec<u64>,
    /// More than one slot was due: the ones before the latest were
    /// missed (the cluster was down across them).
    pub missed: bool,
}

impl Spec {
    /// Parses a JSON object; `Err(why)` names what is wrong.
    pub fn parse(json: &[u8]) -> Result<Spec, String> {
        let value: Value = serde_json::from_slice(json).map_err(|e| format!("not a JSON object: {e}"))?;
        let Value::Object(map) = value else { return Err("the spec is not a map".into()) };
        Spec::from_map(&map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<Spec, String> {
        if let Some(key) = map.keys().find(|k| !matches!(k.as_str(), "every" | "cron" | "start_at" | "overlap" | "catch_up")) {
            return Err(format!("unknown key {key}"));
        }
        let period = match (map.get("every"), map.get("cron")) {
            (Some(_), Some(_)) => return Err("every and cron together".into()),
            (None, None) => return Err("neither every nor cron".into()),
            (Some(every), None) => match every.as_u64() {
                Some(ms) if ms >= MIN_EVERY_MS => Period::Every(ms),
                _ => return Err(format!("every must be an integer of at least {MIN_EVERY_MS} (ms)")),
            },
            (None, Some(Value::String(pattern))) => Period::Cron { pattern: pattern.clone(), cron: Box::new(parse_cron(pattern)?) },
            (None, Some(_)) => return Err("cron must be a binary".into()),
        };
        let start_at = match map.get("start_at") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().filter(|ms| *ms <= MAX_MS).ok_or("start_at must be a non-negative integer (Unix ms)")?),
        };
        let overlap = match map.get("overlap") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("overlap must be true or false".into()),
        };
        let catch_up = match map.get("catch_up").map(|v| v.as_str()) {
            None | Some(Some("latest")) => CatchUp::Latest,
            Some(Some("none")) => CatchUp::None,
            Some(Some("all")) => CatchUp::All,
            Some(_) => return Err("catch_up must be latest, none or all".into()),
        };
        let spec = Spec { period, start_at, overlap, catch_up };
        if spec.first_slot_from(0).is_none() {
            return Err("the spec has no slot".into());
        }
        Ok(spec)
    }

    /// The normalized JSON object, every field written, in this order
    /// whatever the build's `serde_json` features (what is stored and
    /// what `schedules/1` shows).
    pub fn to_json(&self) -> Vec<u8> {
        let period = match &self.period {
            Period::Every(ms) => format!(r#""every":{ms}"#),
            Period::Cron { pattern, .. } => format!(r#""cron":{}"#, Value::from(pattern.clone())),
        };
        let start_at = self.start_at.map(|at| format!(r#","start_at":{at}"#)).unwrap_or_default();
        format!(r#"{{{period}{start_at},"overlap":{},"catch_up":"{}"}}"#, self.overlap, self.catch_up.name()).into_bytes()
    }

    /// The first slot at or after `t` (and `start_at`); `None` past the
    /// last one a cron pattern has (or past year 9999).
    pub fn first_slot_from(&self, t: u64) -> Option<u64> {
        let t = t.max(self.start_at.unwrap_or(0));
        match &self.period {
            Period::Every(every) => {
                let start = self.start_at.unwrap_or(0);
                let k = (t - start).div_ceil(*every);
                start.checked_add(k.checked_mul(*every)?).filter(|at| *at <= MAX_MS)
            }
            Period::Cron { cron, .. } => {
                // Whole seconds: a 5-field pattern matches at second 0.
                let from = utc(t.div_ceil(1000).checked_mul(1000)?)?;
                let next = cron.find_next_occurrence(&from, true).ok()?;
                u64::try_from(next.timestamp_millis()).ok().filter(|at| *at <= MAX_MS)
            }
        }
    }

    /// The slots due at `now` of a schedule whose next slot is `next`
    /// (`next <= now`).
    pub fn due(&self, next: u64, now: u64) -> Due {
        match &self.period {
            Period::Every(every) => {
                let start = self.start_at.unwrap_or(0);
                let first = (next.max(start) - start) / every;
                let last = (now.max(start) - start) / every;
                let from = first.max(last.saturating_sub(MAX_CATCH_UP as u64 - 1));
                Due { slots: (from..=last).map(|k| start + k * every).collect(), missed: last > first }
            }
            Period::Cron { cron, .. } => {
                let mut slots = Vec::new();
                let mut more = false;
                let mut at = utc(now / 1000 * 1000);
                while let Some(t) = at {
                    let Ok(prev) = cron.find_previous_occurrence(&t, true) else { break };
                    let Ok(ms) = u64::try_from(prev.timestamp_millis()) else { break };
                    if ms < next {
                        break;
                    }
                    if slots.len() == MAX_CATCH_UP {
                        more = true;
                        break;
                    }
                    slots.push(ms);
                    at = ms.checked_sub(1000).and_then(utc);
                }
                slots.reverse();
                Due { missed: more || slots.len() > 1, slots }
            }
        }
    }

    /// The slots to run of `due`, as `catch_up` says: the one due slot
    /// when none was missed; else the latest, none, or all.
    pub fn to_run(&self, due: &Due) -> Vec<u64> {
        match (due.missed, self.catch_up) {
            (false, _) | (true, CatchUp::Latest) => due.slots.last().copied().into_iter().collect(),
            (true, CatchUp::None) => Vec::new(),
            (true, CatchUp::All) => due.slots.clone(),
        }
    }
}

/// The last instant of year 9999, in Unix ms: slots stay within it.
const MAX_MS: u64 = 253_402_300_799_999;

fn utc(ms: u64) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(i64::try_from(ms).ok()?).single()
}

/// A standard 5-field pattern (minute hour day-of-month month
/// day-of-week), no seconds, no year, no `@` nickname.
fn parse_cron(pattern: &str) -> Result<Cron, String> {
    let fields = pattern.split_whitespace().count();
    if fields != 5 {
        return Err(format!("cron must have 5 fields (minute hour day month weekday), not {fields}"));
    }
    let parser = CronParser::builder().seconds(Seconds::Disallowed).year(Year::Disallowed).build();
    parser.parse(pattern).map_err(|e| format!("cron: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Spec {
        Spec::parse(json.as_bytes()).expect(json)
    }

    fn bad(json: &str) -> String {
        Spec::parse(json.as_bytes()).expect_err(json)
    }

    #[test]
    fn bad_specs_say_why() {
        assert!(bad(r#"{"every": 999}"#).contains("at least 1000"));
        assert!(bad(r#"{"every": -5}"#).contains("at least 1000"));
        assert!(bad(r#"{"every": 1000, "cron": "* * * * *"}"#).contains("together"));
        assert!(bad(r#"{}"#).contains("neither"));
        assert!(bad(r#"{"every": 1000, "color": 1}"#).contains("unknown key color"));
        assert!(bad(r#"{"cron": "61 * * * *"}"#).starts_with("cron:"));
        assert!(bad(r#"{"cron": "0 * * * * *"}"#).contains("5 fields"));
        assert!(bad(r#"{"cron": "@daily"}"#).contains("5 fields"));
        assert!(bad(r#"{"cron": 5}"#).contains("binary"));
        assert!(bad(r#"{"every": 1000, "catch_up": "some"}"#).contains("catch_up"));
        assert!(bad(r#"{"every": 1000, "overlap": 1}"#).contains("overlap"));
        assert!(bad(r#"{"every": 1000, "start_at": -1}"#).contains("start_at"));
        assert!(bad(r#"[1]"#).contains("not a map"));
    }

    #[test]
    fn every_slots_are_multiples_from_start_at() {
        let s = spec(r#"{"every": 60000}"#);
        assert_eq!(s.first_slot_from(0), Some(0));
        assert_eq!(s.first_slot_from(1), Some(60_000));
        assert_eq!(s.first_slot_from(60_000), Some(60_000));
        let s = spec(r#"{"every": 1000, "start_at": 5500}"#);
        assert_eq!(s.first_slot_from(0), Some(5500));
        assert_eq!(s.first_slot_from(5501), Some(6500));
        assert_eq!(s.to_json(), br#"{"every":1000,"start_at":5500,"overlap":false,"catch_up":"latest"}"#.to_vec());
    }

    #[test]
    fn cron_slots_are_utc_minutes() {
        // 2026-01-01T00:00:00Z = 1767225600000.
        let s = spec(r#"{"cron": "30 2 * * *"}"#);
        let midnight = 1_767_225_600_000;
        assert_eq!(s.first_slot_from(midnight), Some(midnight + (2 * 60 + 30) * 60_000));
        assert_eq!(s.first_slot_from(midnight + 9_000_000), Some(midnight + 9_000_000), "at the slot: that slot");
        assert_eq!(s.first_slot_from(midnight + 9_000_001), Some(midnight + 86_400_000 + 9_000_000));
        let every_minute = spec(r#"{"cron": "* * * * *"}"#);
        assert_eq!(every_minute.first_slot_from(midnight + 1), Some(midnight + 60_000));
        assert_eq!(every_minute.first_slot_from(midnight), Some(midnight));
    }

    #[test]
    fn catch_up_decides_what_runs_after_missed_slots() {
        let latest = spec(r#"{"every": 1000}"#);
        let due = latest.due(10_000, 15_500);
        assert_eq!(due, Due { slots: vec![10_000, 11_000, 12_000, 13_000, 14_000, 15_000], missed: true });
        assert_eq!(latest.to_run(&due), vec![15_000]);
        let none = spec(r#"{"every": 1000, "catch_up": "none"}"#);
        assert_eq!(none.to_run(&due), Vec::<u64>::new());
        let all = spec(r#"{"every": 1000, "catch_up": "all"}"#);
        assert_eq!(all.to_run(&due), due.slots);
        // One slot due, none missed: it runs whatever catch_up says.
        let one = none.due(10_000, 10_900);
        assert_eq!(one, Due { slots: vec![10_000], missed: false });
        assert_eq!(none.to_run(&one), vec![10_000]);
        // At most 100, the latest.
        let long = all.due(0, 1_000_000);
        assert_eq!(long.slots.len(), MAX_CATCH_UP);
        assert_eq!((long.slots[0], *long.slots.last().unwrap()), (901_000, 1_000_000));
    }

    #[test]
    fn cron_catch_up_walks_back_at_most_100_slots() {
        let s = spec(r#"{"cron": "*/5 * * * *", "catch_up": "all"}"#);
        let midnight = 1_767_225_600_000;
        let due = s.due(midnight, midnight + 12 * 60_000 + 30_000);
        assert_eq!(due.slots, vec![midnight, midnight + 300_000, midnight + 600_000]);
        assert!(due.missed);
        let one = s.due(midnight + 600_000, midnight + 600_500);
        assert_eq!(one, Due { slots: vec![midnight + 600_000], missed: false });
        let long = s.due(midnight, midnight + 86_400_000);
        assert_eq!(long.slots.len(), MAX_CATCH_UP);
        assert_eq!(*long.slots.last().unwrap(), midnight + 86_400_000);
        assert!(long.missed);
    }
}
