//! FoundationDB's mutation formats, as pure functions: the API-520
//! versionstamp parameter and the ADD and BYTE_MAX atomic operations.

use crate::store::{StoreError, Versionstamp, VERSIONSTAMP_LEN};

/// Splits a versionstamped parameter (API 520): the bytes end with a 4-byte
/// little-endian offset of a 10-byte placeholder. Returns the bytes without
/// the offset and the offset.
pub(crate) fn split_versionstamp_param(param: &[u8]) -> Result<(&[u8], usize), StoreError> {
    let Some(split) = param.len().checked_sub(4) else {
        return Err(StoreError::Invalid(format!(
            "versionstamped parameter of {} bytes has no 4-byte offset",
            param.len()
        )));
    };
    let (bytes, offset) = param.split_at(split);
    let mut le = [0u8; 4];
    le.copy_from_slice(offset);
    let offset = u32::from_le_bytes(le) as usize;
    match offset.checked_add(VERSIONSTAMP_LEN) {
        Some(end) if end <= bytes.len() => Ok((bytes, offset)),
        _ => Err(StoreError::Invalid(format!("versionstamp offset {offset} out of range for {} bytes", bytes.len()))),
    }
}

/// The bytes with the placeholder at `offset` replaced by `stamp`
/// (`offset` checked by [`split_versionstamp_param`]).
pub(crate) fn fill_versionstamp(bytes: &[u8], offset: usize, stamp: &Versionstamp) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if let Some(slot) = out.get_mut(offset..offset + VERSIONSTAMP_LEN) {
        slot.copy_from_slice(stamp);
    }
    out
}

/// The versionstamp of a commit: 8-byte big-endian version, then the
/// 2-byte batch order (always 0: one transaction per commit here).
pub(crate) fn versionstamp(version: u64) -> Versionstamp {
    let mut stamp = [0u8; VERSIONSTAMP_LEN];
    stamp[..8].copy_from_slice(&version.to_be_bytes());
    stamp
}

/// FoundationDB's ADD with an 8-byte parameter: the existing value (missing
/// = 0) zero-extended or truncated to 8 bytes, read as little-endian, plus
/// `delta`, wrapping. Always 8 bytes out.
pub(crate) fn add_le_i64(existing: Option<&[u8]>, delta: i64) -> [u8; 8] {
    let mut le = [0u8; 8];
    if let Some(existing) = existing {
        let n = existing.len().min(8);
        le[..n].copy_from_slice(&existing[..n]);
    }
    i64::from_le_bytes(le).wrapping_add(delta).to_le_bytes()
}

/// FoundationDB's BYTE_MAX: `operand` when nothing is stored, else the
/// lexicographically larger of the stored value and `operand`.
pub fn byte_max(existing: Option<&[u8]>, operand: &[u8]) -> Vec<u8> {
    match existing {
        Some(v) if v > operand => v.to_vec(),
        _ => operand.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versionstamp_param_round_trip() {
        let mut param = b"ab".to_vec();
        param.extend_from_slice(&[0xff; 10]);
        param.extend_from_slice(b"z");
        param.extend_from_slice(&2u32.to_le_bytes());
        let (bytes, offset) = split_versionstamp_param(&param).expect("valid");
        assert_eq!(offset, 2);
        let stamp = versionstamp(0x0102_0304_0506_0708);
        let out = fill_versionstamp(bytes, offset, &stamp);
        assert_eq!(out, [b"ab".as_slice(), &[1, 2, 3, 4, 5, 6, 7, 8, 0, 0], b"z"].concat());
    }

    #[test]
    fn versionstamp_param_errors() {
        assert!(split_versionstamp_param(b"abc").is_err());
        let mut param = vec![0u8; 10];
        param.extend_from_slice(&1u32.to_le_bytes());
        assert!(matches!(split_versionstamp_param(&param), Err(StoreError::Invalid(_))));
        let mut param = vec![0u8; 10];
        param.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(split_versionstamp_param(&param), Err(StoreError::Invalid(_))));
    }

    #[test]
    fn add_semantics() {
        assert_eq!(add_le_i64(None, 5), 5i64.to_le_bytes());
        assert_eq!(add_le_i64(Some(&7i64.to_le_bytes()), -10), (-3i64).to_le_bytes());
        assert_eq!(add_le_i64(Some(&i64::MAX.to_le_bytes()), 1), i64::MIN.to_le_bytes());
        assert_eq!(add_le_i64(Some(&[1]), 1), 2i64.to_le_bytes());
        assert_eq!(add_le_i64(Some(&[1, 0, 0, 0, 0, 0, 0, 0, 9, 9]), 1), 2i64.to_le_bytes());
        assert_eq!(add_le_i64(Some(&[]), 0), 0i64.to_le_bytes());
    }

    #[test]
    fn byte_max_keeps_the_larger_and_sets_when_missing() {
        assert_eq!(byte_max(None, b"b"), b"b".to_vec());
        assert_eq!(byte_max(Some(b"c"), b"b"), b"c".to_vec());
        assert_eq!(byte_max(Some(b"a"), b"b"), b"b".to_vec());
        // Lexicographic, not numeric: a longer value with a smaller first
        // byte is smaller; big-endian versions compare as numbers.
        assert_eq!(byte_max(Some(b"\x01\xff\xff"), b"\x02"), b"\x02".to_vec());
        assert_eq!(byte_max(Some(&7u64.to_be_bytes()), &5u64.to_be_bytes()), 7u64.to_be_bytes().to_vec());
    }
}
