//! Real file-system faults (tmpfs and read-only bind mounts, the
//! immutable attribute) behind guards that undo them even when a test
//! fails.

use std::ffi::CString;
use std::path::{Path, PathBuf};

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("path without NUL")
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A tmpfs of a given size mounted on a directory; unmounted on drop
/// (lazily if something still holds a file open).
pub struct Tmpfs {
    pub path: PathBuf,
}

impl Tmpfs {
    pub fn mount(path: &Path, size_bytes: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
        let data = CString::new(format!("size={size_bytes},mode=0755")).expect("no NUL");
        let fstype = CString::new("tmpfs").expect("no NUL");
        // SAFETY: valid NUL-terminated strings that outlive the call.
        let rc = unsafe { libc::mount(fstype.as_ptr(), cstr(path).as_ptr(), fstype.as_ptr(), 0, data.as_ptr().cast()) };
        if rc != 0 {
            return Err(format!("mount -t tmpfs -o size={size_bytes} on {}: {}", path.display(), errno()));
        }
        Ok(Tmpfs { path: path.to_path_buf() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        unmount(&self.path);
    }
}

fn unmount(path: &Path) {
    let p = cstr(path);
    // SAFETY: a valid path string.
    if unsafe { libc::umount2(p.as_ptr(), 0) } != 0 {
        let first = errno();
        // SAFETY: as above.
        let rc = unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        eprintln!(
            "faults: umount {} failed ({first}); lazy unmount: {}",
            path.display(),
            if rc == 0 { "done".to_string() } else { errno().to_string() }
        );
    }
}

/// `source` bind-mounted on `target`; `set_read_only` remounts the bind
/// read-only or back (a real read-only mount: the kernel answers EROFS).
pub struct BindMount {
    pub target: PathBuf,
}

impl BindMount {
    pub fn new(source: &Path, target: &Path) -> Result<BindMount, String> {
        std::fs::create_dir_all(target).map_err(|e| format!("mkdir {}: {e}", target.display()))?;
        // SAFETY: valid strings; null fstype and data are allowed for a bind.
        let rc = unsafe {
            libc::mount(cstr(source).as_ptr(), cstr(target).as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
        };
        if rc != 0 {
            return Err(format!("mount --bind {} {}: {}", source.display(), target.display(), errno()));
        }
        Ok(BindMount { target: target.to_path_buf() })
    }

    pub fn set_read_only(&self, ro: bool) -> Result<(), String> {
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND;
        if ro {
            flags |= libc::MS_RDONLY;
        }
        // SAFETY: as above.
        let rc = unsafe {
            libc::mount(std::ptr::null(), cstr(&self.target).as_ptr(), std::ptr::null(), flags, std::ptr::null())
        };
        if rc != 0 {
            return Err(format!("remount {} {}: {}", self.target.display(), if ro { "ro" } else { "rw" }, errno()));
        }
        Ok(())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        unmount(&self.target);
    }
}

/// The immutable attribute (`chattr +i`) on some paths: the kernel then
/// refuses writes to them, root's included, also through files already
/// open (on ext4, xfs, btrfs; not on tmpfs). Cleared on drop.
pub struct Immutable {
    paths: Vec<PathBuf>,
}

fn chattr(flag: &str, path: &Path) -> Result<(), String> {
    let out = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run chattr: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("chattr {flag} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Immutable {
    /// Whether the attribute really stops a write through an open file in
    /// `dir` (the probe file is removed again).
    pub fn probe(dir: &Path) -> Result<(), String> {
        use std::io::Write;
        let path = dir.join("immutable-probe");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("probe file: {e}"))?;
        chattr("+i", &path)?;
        let refused = file.write_all(b"x").and_then(|()| file.flush()).is_err();
        let _ = chattr("-i", &path);
        let _ = std::fs::remove_file(&path);
        if refused {
            Ok(())
        } else {
            Err(format!("the file system of {} accepts writes to open immutable files", dir.display()))
        }
    }

    /// Sets the attribute on every path that exists (clearing it again on
    /// failure).
    pub fn set(paths: &[PathBuf]) -> Result<Immutable, String> {
        let mut done = Immutable { paths: Vec::new() };
        for p in paths.iter().filter(|p| p.exists()) {
            chattr("+i", p)?;
            done.paths.push(p.clone());
        }
        Ok(done)
    }

    /// Clears the attribute now.
    pub fn clear(&mut self) {
        for p in self.paths.drain(..) {
            if let Err(e) = chattr("-i", &p) {
                eprintln!("faults: {e}");
            }
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Writes zeros into `path` until the file system is full; returns the
/// bytes written.
pub fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("filler file");
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(_) => break,
        }
    }
    // Whatever fits in smaller pieces too.
    let small = [0u8; 512];
    while let Ok(n) = file.write(&small) {
        if n == 0 {
            break;
        }
        written += n as u64;
    }
    let _ = file.flush();
    written
}
