//! Wake-on-write: tells the watcher thread when any process wrote the
//! store's WAL, so that it need not poll `PRAGMA data_version` while
//! nothing happens.
//!
//! Every commit of every process sharing the store writes its frames into
//! `couch_workers.sqlite-wal` with `write(2)` before it becomes visible
//! (SQLite then publishes it in the `-shm` index, through shared memory,
//! which no file event reports). Linux's inotify reports those writes to
//! any process that watches the directory, so one thread per store,
//! `cw-embed-wal`, blocks on an inotify descriptor and rings the
//! [`WatchHub`] when the WAL changes; the watcher thread then looks at
//! `data_version` for a short settle window (the commit may become visible
//! a moment after its frames are written; see `watch.rs`).
//!
//! A quiet store costs nothing: no timer runs while no process writes.
//! Under load the thread sleeps [`COALESCE`] after each wake-up so that it
//! wakes at most ~1,000 times a second, whatever the commit rate (the
//! kernel merges the events that arrive meanwhile, and the watcher polls
//! during its settle window anyway).
//!
//! Where inotify is not available (not Linux, or the per-user limit of
//! inotify instances or watches is reached) [`spawn`] returns `None` and
//! the watcher keeps polling as before: slower to idle, never wrong.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::watch::WatchHub;

/// Pause after each wake-up while writes go on.
pub(crate) const COALESCE: Duration = Duration::from_millis(1);

/// The running notifier of one store: stopped by [`WalNotifier::stop`].
pub(crate) struct WalNotifier {
    #[cfg(target_os = "linux")]
    stop: linux::StopFd,
}

impl WalNotifier {
    /// Ends the thread (it exits at once); join its handle afterwards.
    pub(crate) fn stop(&self) {
        #[cfg(target_os = "linux")]
        self.stop.ring();
    }
}

/// Starts `cw-embed-wal` for the store in `dir` whose WAL file is named
/// `wal_name`. `None`: no inotify here; the watcher polls instead.
pub(crate) fn spawn(dir: &Path, wal_name: &str, hub: Arc<WatchHub>) -> Option<(WalNotifier, JoinHandle<()>)> {
    #[cfg(target_os = "linux")]
    {
        linux::spawn(dir, wal_name, hub)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (dir, wal_name, hub);
        None
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::Arc;
    use std::thread::JoinHandle;

    use super::{WalNotifier, COALESCE};
    use crate::store::embedded::watch::WatchHub;

    /// An eventfd that the thread polls beside the inotify descriptor.
    pub(super) struct StopFd(Arc<OwnedFd>);

    impl StopFd {
        pub(super) fn ring(&self) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
            let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    fn owned(fd: libc::c_int) -> Option<OwnedFd> {
        // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn spawn(dir: &Path, wal_name: &str, hub: Arc<WatchHub>) -> Option<(WalNotifier, JoinHandle<()>)> {
        // SAFETY: plain syscalls with constant flags.
        let inotify = owned(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        let stop = Arc::new(owned(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?);
        let dir_c = CString::new(dir.as_os_str().as_bytes()).ok()?;
        // The directory, not the WAL file: SQLite deletes and recreates
        // the WAL (when the last connection of the host closes), which
        // would end a watch on the file itself.
        let mask = libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO;
        // SAFETY: a NUL-terminated path and a descriptor we own.
        if unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), dir_c.as_ptr(), mask) } < 0 {
            return None;
        }
        let wal_name = wal_name.as_bytes().to_vec();
        let stop_thread = stop.clone();
        let handle = std::thread::Builder::new()
            .name("cw-embed-wal".into())
            .spawn(move || run(&inotify, &stop_thread, &wal_name, &hub))
            .ok()?;
        Some((WalNotifier { stop: StopFd(stop) }, handle))
    }

    /// What one read of the inotify descriptor found.
    enum Seen {
        Wal,
        Nothing,
    }

    fn run(inotify: &OwnedFd, stop: &OwnedFd, wal_name: &[u8], hub: &WatchHub) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let mut fds = [
                libc::pollfd { fd: inotify.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfd entries; -1: wait until one is ready.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // Cannot wait: tell the watcher to poll from now on.
                hub.set_wal_notify(false);
                return;
            }
            if fds[1].revents != 0 || hub.is_closed() {
                return;
            }
            match drain(inotify, &mut buf, wal_name) {
                Ok(Seen::Wal) => {
                    hub.wal_written();
                    std::thread::sleep(COALESCE);
                }
                Ok(Seen::Nothing) => {}
                Err(()) => {
                    hub.set_wal_notify(false);
                    return;
                }
            }
        }
    }

    /// Reads every queued event; `Wal` if one concerns the WAL file (or
    /// events were lost: the queue overflowed).
    fn drain(inotify: &OwnedFd, buf: &mut [u8], wal_name: &[u8]) -> Result<Seen, ()> {
        let mut seen = Seen::Nothing;
        loop {
            // SAFETY: reads into a buffer we own, of its length.
            let n = unsafe { libc::read(inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return match std::io::Error::last_os_error().kind() {
                    std::io::ErrorKind::WouldBlock => Ok(seen),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => Err(()),
                };
            }
            let n = n as usize;
            if n == 0 {
                return Ok(seen);
            }
            if events_name_wal(&buf[..n], wal_name) {
                seen = Seen::Wal;
            }
        }
    }

    /// Whether any event in `bytes` (a whole number of `inotify_event`s, as
    /// read returns them) names the WAL file or reports an overflow.
    fn events_name_wal(bytes: &[u8], wal_name: &[u8]) -> bool {
        const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
        let mut at = 0;
        let mut found = false;
        while at + HEADER <= bytes.len() {
            // The header's fields, read without assuming alignment.
            let field = |off: usize| u32::from_ne_bytes(bytes[at + off..at + off + 4].try_into().unwrap_or([0; 4]));
            let mask = field(4);
            let len = field(12) as usize;
            let name = bytes.get(at + HEADER..at + HEADER + len).unwrap_or(&[]);
            // The name is NUL-padded to an aligned length.
            let name = name.split(|b| *b == 0).next().unwrap_or(&[]);
            if mask & libc::IN_Q_OVERFLOW != 0 || name == wal_name {
                found = true;
            }
            at += HEADER + len;
        }
        found
    }

    #[cfg(test)]
    mod tests {
        use super::events_name_wal;

        fn event(mask: u32, name: &[u8]) -> Vec<u8> {
            let padded = name.len().div_ceil(16) * 16;
            let mut v = Vec::new();
            v.extend_from_slice(&1i32.to_ne_bytes());
            v.extend_from_slice(&mask.to_ne_bytes());
            v.extend_from_slice(&0u32.to_ne_bytes());
            v.extend_from_slice(&(padded as u32).to_ne_bytes());
            let mut n = name.to_vec();
            n.resize(padded, 0);
            v.extend_from_slice(&n);
            v
        }

        #[test]
        fn finds_the_wal_among_other_files_and_overflows() {
            let wal = b"couch_workers.sqlite-wal";
            let mut other = event(libc::IN_MODIFY, b"couch_workers.wait");
            assert!(!events_name_wal(&other, wal));
            other.extend(event(libc::IN_MODIFY, wal));
            assert!(events_name_wal(&other, wal));
            assert!(events_name_wal(&event(libc::IN_Q_OVERFLOW, b""), wal));
            // A name that only starts like the WAL's is another file.
            assert!(!events_name_wal(&event(libc::IN_MODIFY, b"couch_workers.sqlite-wal2"), wal));
        }
    }
}
