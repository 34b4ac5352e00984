//! Which other processes hold locks on a store file: named in the error of
//! an open that waited too long for them, so that an operator knows whom
//! to look at.
//!
//! Read from `/proc/locks` (Linux), matched by device and inode. Never by opening the
//! file and asking `fcntl(F_GETLK)`: closing any descriptor of a file
//! drops every POSIX lock this process holds on it, SQLite's included.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// "locks held by pid 12, 34" (the file and its `-shm`), or why not known.
pub(crate) fn describe(file: &Path) -> String {
    let mut files = Vec::new();
    for path in [file.to_path_buf(), file.with_file_name(shm_name(file))] {
        if let Ok(meta) = std::fs::metadata(&path) {
            files.push(FileId::of(&meta));
        }
    }
    let Ok(table) = std::fs::read_to_string("/proc/locks") else {
        return "the lock holders are not known here (no /proc/locks)".into();
    };
    let pids = holders(&table, &files, std::process::id());
    if pids.is_empty() {
        "no other process holds a lock on it now".into()
    } else {
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        format!("locks held by pid {}", list.join(", "))
    }
}

fn shm_name(file: &Path) -> String {
    format!("{}-shm", file.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
}

/// A file as `/proc/locks` names it: device (major, minor) and inode. The
/// inode alone could name a file of another file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    major: u64,
    minor: u64,
    inode: u64,
}

impl FileId {
    fn of(meta: &std::fs::Metadata) -> FileId {
        let dev = meta.dev();
        FileId { major: u64::from(libc::major(dev)), minor: u64::from(libc::minor(dev)), inode: meta.ino() }
    }

    /// `fd:01:1835017`: major and minor in hex, the inode in decimal.
    fn parse(field: &str) -> Option<FileId> {
        let mut parts = field.split(':');
        let major = u64::from_str_radix(parts.next()?, 16).ok()?;
        let minor = u64::from_str_radix(parts.next()?, 16).ok()?;
        let inode = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some(FileId { major, minor, inode })
    }
}

/// The pids other than `me` with a lock (held or awaited) on one of
/// `files`, in `/proc/locks` lines such as
/// `1: POSIX  ADVISORY  WRITE 4711 fd:01:1835017 1073741824 1073741825`.
fn holders(table: &str, files: &[FileId], me: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // The device:inode field; the pid is just before it.
        let Some(at) = fields.iter().position(|f| f.matches(':').count() == 2) else { continue };
        let file = FileId::parse(fields[at]);
        let pid = at.checked_sub(1).and_then(|p| fields[p].parse::<u32>().ok());
        if let (Some(file), Some(pid)) = (file, pid) {
            if files.contains(&file) && pid != me && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::{holders, FileId};

    fn id(major: u64, minor: u64, inode: u64) -> FileId {
        FileId { major, minor, inode }
    }

    #[test]
    fn holders_are_read_by_device_and_inode_without_this_process() {
        let table = "1: POSIX  ADVISORY  WRITE 4711 fd:01:77 1073741824 1073741825\n\
                     2: POSIX  ADVISORY  READ 99 fd:01:77 128 128\n\
                     2: -> POSIX  ADVISORY  WRITE 5000 fd:01:78 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 4711 fd:01:77 0 EOF\n\
                     4: POSIX  ADVISORY  WRITE 6000 fd:01:123 0 EOF\n\
                     5: POSIX  ADVISORY  WRITE 7000 00:2a:77 0 EOF\n";
        assert_eq!(holders(table, &[id(0xfd, 1, 77), id(0xfd, 1, 78)], 99), vec![4711, 5000]);
        assert_eq!(
            holders(table, &[id(0, 0x2a, 77)], 99),
            vec![7000],
            "the same inode on another device is another file"
        );
        assert!(holders(table, &[id(0xfd, 1, 1)], 99).is_empty());
    }

    /// The device as `stat` gives it matches the one `/proc/locks` prints:
    /// a lock this test takes on a file of its own shows up under it.
    #[test]
    fn a_lock_of_this_process_is_found_under_its_stat_device() {
        use std::os::unix::io::AsRawFd;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        let f = std::fs::File::create(&path).expect("create");
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        let file = FileId::of(&std::fs::metadata(&path).expect("stat"));
        let table = std::fs::read_to_string("/proc/locks").expect("/proc/locks");
        assert_eq!(holders(&table, &[file], 0), vec![std::process::id()], "{table}");
    }
}
