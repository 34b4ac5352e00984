//! The `type` command's options: `--max-running N`,
//! `--max-running-per-group N`, `--activity-timeout SECONDS`, each a
//! positive integer or `infinity`.

use couch_workers_core::job_controls::TypeSetting;

/// The setting `flag` sets; `None` if `flag` is not one of the `type`
/// command's options.
fn maker(flag: &[u8]) -> Option<fn(Option<u64>) -> TypeSetting> {
    match flag {
        b"--max-running" => Some(TypeSetting::MaxRunning),
        b"--max-running-per-group" => Some(TypeSetting::MaxRunningPerGroup),
        b"--activity-timeout" => Some(TypeSetting::ActivityTimeout),
        _ => None,
    }
}

/// Whether `flag` is one of the `type` command's options.
pub fn is_option(flag: &[u8]) -> bool {
    maker(flag).is_some()
}

/// The change that `flag` (one of [`is_option`]'s) with `value` asks for.
pub fn setting(flag: &[u8], value: Option<&str>) -> Result<TypeSetting, String> {
    let make = maker(flag).ok_or("not a type option")?;
    let flag = String::from_utf8_lossy(flag);
    match value.ok_or(format!("{flag} needs a value"))? {
        "infinity" => Ok(make(None)),
        v => match v.parse::<u64>() {
            Ok(n) if n > 0 && n <= i64::MAX as u64 => Ok(make(Some(n))),
            _ => Err(format!("{flag} {v:?} is not a positive integer or infinity")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_refusals() {
        assert_eq!(setting(b"--max-running", Some("8")), Ok(TypeSetting::MaxRunning(Some(8))));
        assert_eq!(setting(b"--activity-timeout", Some("infinity")), Ok(TypeSetting::ActivityTimeout(None)));
        assert_eq!(setting(b"--max-running-per-group", Some("2")), Ok(TypeSetting::MaxRunningPerGroup(Some(2))));
        assert!(!is_option(b"--limit") && is_option(b"--activity-timeout"));
        for bad in ["0", "-1", "x", "", "9223372036854775808"] {
            assert!(setting(b"--max-running", Some(bad)).is_err(), "{bad:?}");
        }
        assert!(setting(b"--max-running", None).is_err());
    }
}
