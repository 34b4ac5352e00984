//! Which other processes hold locks on a store file: named in the error of
//! an open that waited too long for them, so that an operator knows whom
//! to look at.
//!
//! Read from `/proc/locks` (Linux), matched by inode. Never by opening the
//! file and asking `fcntl(F_GETLK)`: closing any descriptor of a file
//! drops every POSIX lock this process holds on it, SQLite's included.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// "locks held by pid 12, 34" (the file and its `-shm`), or why not known.
pub(crate) fn describe(file: &Path) -> String {
    let mut inodes = Vec::new();
    for path in [file.to_path_buf(), file.with_file_name(shm_name(file))] {
        if let Ok(meta) = std::fs::metadata(&path) {
            inodes.push(meta.ino());
        }
    }
    let Ok(table) = std::fs::read_to_string("/proc/locks") else {
        return "the lock holders are not known here (no /proc/locks)".into();
    };
    let pids = holders(&table, &inodes, std::process::id());
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

/// The pids other than `me` with a lock (held or awaited) on one of
/// `inodes`, in `/proc/locks` lines such as
/// `1: POSIX  ADVISORY  WRITE 4711 fd:01:1835017 1073741824 1073741825`.
fn holders(table: &str, inodes: &[u64], me: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // The device:inode field; the pid is just before it.
        let Some(at) = fields.iter().position(|f| f.matches(':').count() == 2) else { continue };
        let inode = fields[at].rsplit(':').next().and_then(|i| i.parse::<u64>().ok());
        let pid = at.checked_sub(1).and_then(|p| fields[p].parse::<u32>().ok());
        if let (Some(inode), Some(pid)) = (inode, pid) {
            if inodes.contains(&inode) && pid != me && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::holders;

    #[test]
    fn holders_are_read_by_inode_without_this_process() {
        let table = "1: POSIX  ADVISORY  WRITE 4711 fd:01:77 1073741824 1073741825\n\
                     2: POSIX  ADVISORY  READ 99 fd:01:77 128 128\n\
                     2: -> POSIX  ADVISORY  WRITE 5000 fd:01:78 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 4711 fd:01:77 0 EOF\n\
                     4: POSIX  ADVISORY  WRITE 6000 fd:01:123 0 EOF\n";
        assert_eq!(holders(table, &[77, 78], 99), vec![4711, 5000]);
        assert!(holders(table, &[1], 99).is_empty());
    }
}
