//! The cluster-file path as libfdb_c takes it: a C string
//! (`fdb_create_database(const char* cluster_file_path, ..)`). The
//! `foundationdb` crate turns the path into a `CString` and panics on an
//! interior NUL, so the path is checked here first, without the `fdb`
//! feature, and a bad one is a clear `invalid` answer on every build.

use std::path::Path;

use super::StoreError;

/// The cluster-file path as a string libfdb_c can take: UTF-8 (the
/// crate's API takes `&str`), not empty, no NUL byte.
pub fn cluster_file_arg(path: &Path) -> Result<&str, StoreError> {
    let s = path
        .to_str()
        .ok_or_else(|| StoreError::Invalid(format!("cluster file path is not UTF-8: {}", path.display())))?;
    if s.is_empty() {
        return Err(StoreError::Invalid("cluster file path is empty".into()));
    }
    if s.contains('\0') {
        return Err(StoreError::Invalid(format!("cluster file path contains a NUL byte: {s:?}")));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_with_a_nul_is_invalid_not_a_panic() {
        let err = cluster_file_arg(Path::new("/etc/foundationdb/fdb\0.cluster")).unwrap_err();
        assert_eq!(err.name(), "invalid");
        assert!(err.to_string().contains("NUL"), "{err}");
    }

    #[test]
    fn an_empty_path_is_invalid() {
        assert_eq!(cluster_file_arg(Path::new("")).unwrap_err().name(), "invalid");
    }

    #[cfg(unix)]
    #[test]
    fn a_path_that_is_not_utf8_is_invalid() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xff.cluster"));
        assert!(cluster_file_arg(path).unwrap_err().to_string().contains("UTF-8"));
    }

    #[tokio::test]
    async fn the_fdb_store_setting_with_a_nul_answers_invalid_on_every_build() {
        let config = crate::store::StoreConfig::Fdb { cluster_file: "/etc/foundationdb/fdb\0.cluster".into() };
        let err = crate::store::open(&config).await.err().expect("refused");
        assert_eq!(err.name(), "invalid", "{err}");
    }

    #[test]
    fn an_ordinary_path_passes_unchanged() {
        assert_eq!(cluster_file_arg(Path::new("/etc/foundationdb/fdb.cluster")), Ok("/etc/foundationdb/fdb.cluster"));
    }
}
