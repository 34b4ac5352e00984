//! Wake-ups of the watcher thread from outside this handle: the
//! `cw-embed-notify` thread, which blocks in `poll(2)` on
//!
//! * the handle's wake socket (`wake.rs`): another handle committed, and
//!   its commit is visible: the thread rings the [`WatchHub`], whose
//!   watcher looks at `data_version` once;
//! * an inotify descriptor watching `DIR/wake`: a handle opened or closed,
//!   so the list of peers this handle sends to is read again before its
//!   next send;
//! * only where the wake socket could not be bound (a read-only or full
//!   directory, a path too long for a socket): inotify on the WAL file, as
//!   before the wake sockets. Every write of the WAL by any process (this
//!   one's included) rings the hub, which then looks at `data_version`
//!   for a settle window (the frames are written before the commit is
//!   visible; see `watch.rs`), and the thread sleeps [`COALESCE`] after
//!   each such wake-up so that it wakes at most ~1,000 times a second.
//!
//! Either way a quiet store costs nothing: nothing wakes the thread while
//! no process writes. Where neither a socket nor inotify is available
//! (not Linux) [`spawn`] returns `None` and the watcher polls.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::wake::{Peers, WakeSocket};
use super::watch::WatchHub;

/// Pause after each WAL wake-up while writes go on (WAL fallback only).
pub(crate) const COALESCE: Duration = Duration::from_millis(1);

/// What the thread listens to.
pub(crate) struct Sources {
    /// This handle's wake socket (`None`: it could not be bound; the WAL
    /// fallback runs instead).
    pub(crate) wake: Option<Arc<WakeSocket>>,
    /// The peer list to mark stale when `DIR/wake` changes.
    pub(crate) peers: Arc<Peers>,
    /// The WAL file's name, for the fallback.
    pub(crate) wal_name: String,
}

/// The running notifier of one store: stopped by [`Notifier::stop`].
pub(crate) struct Notifier {
    #[cfg(target_os = "linux")]
    stop: linux::StopFd,
}

impl Notifier {
    /// Ends the thread (it exits at once); join its handle afterwards.
    pub(crate) fn stop(&self) {
        #[cfg(target_os = "linux")]
        self.stop.ring();
    }
}

/// Starts `cw-embed-notify` for the store in `dir`. `None`: nothing to
/// listen to here; the watcher polls instead.
pub(crate) fn spawn(dir: &Path, sources: Sources, hub: Arc<WatchHub>) -> Option<(Notifier, JoinHandle<()>)> {
    #[cfg(target_os = "linux")]
    {
        linux::spawn(dir, sources, hub)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (dir, sources, hub);
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

    use super::{Notifier, Sources, COALESCE};
    use crate::store::embedded::wake::{self, WakeSocket};
    use crate::store::embedded::watch::WatchHub;

    /// An eventfd that the thread polls beside its sources.
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

    /// The inotify descriptor and what its watches are.
    struct Inotify {
        fd: OwnedFd,
        /// The watch on `DIR/wake` (peers come and go).
        wake_dir: Option<libc::c_int>,
        /// The watch on `DIR` for the WAL (fallback only), and its name.
        wal: Option<(libc::c_int, Vec<u8>)>,
    }

    fn add_watch(fd: &OwnedFd, dir: &Path, mask: u32) -> Option<libc::c_int> {
        let dir_c = CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: a NUL-terminated path and a descriptor we own.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir_c.as_ptr(), mask) };
        (wd >= 0).then_some(wd)
    }

    fn inotify(dir: &Path, sources: &Sources) -> Option<Inotify> {
        // SAFETY: a plain syscall with constant flags.
        let fd = owned(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        if sources.wake.is_some() {
            let mask = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_TO | libc::IN_MOVED_FROM;
            let wake_dir = add_watch(&fd, &dir.join(wake::DIR_NAME), mask)?;
            Some(Inotify { fd, wake_dir: Some(wake_dir), wal: None })
        } else {
            // The directory, not the WAL file: SQLite deletes and recreates
            // the WAL (when the last connection of the host closes), which
            // would end a watch on the file itself.
            let wal = add_watch(&fd, dir, libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO)?;
            Some(Inotify { fd, wake_dir: None, wal: Some((wal, sources.wal_name.as_bytes().to_vec())) })
        }
    }

    pub(super) fn spawn(dir: &Path, sources: Sources, hub: Arc<WatchHub>) -> Option<(Notifier, JoinHandle<()>)> {
        let inotify = inotify(dir, &sources);
        if inotify.is_none() && sources.wake.is_none() {
            return None;
        }
        // Without inotify on `DIR/wake` the sender reads it again now and then.
        sources.peers.set_watched(inotify.as_ref().is_some_and(|i| i.wake_dir.is_some()));
        // SAFETY: a plain syscall with constant flags.
        let stop = Arc::new(owned(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?);
        let stop_thread = stop.clone();
        let handle = std::thread::Builder::new()
            .name("cw-embed-notify".into())
            .spawn(move || {
                run(inotify.as_ref(), &sources, &stop_thread, &hub);
                sources.peers.set_watched(false);
            })
            .ok()?;
        Some((Notifier { stop: StopFd(stop) }, handle))
    }

    fn run(inotify: Option<&Inotify>, sources: &Sources, stop: &OwnedFd, hub: &WatchHub) {
        let mut buf = vec![0u8; 16 * 1024];
        let pollfd = |fd: libc::c_int| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        loop {
            // Unused slots hold -1, which poll ignores.
            let mut fds = [
                pollfd(stop.as_raw_fd()),
                pollfd(sources.wake.as_ref().map_or(-1, |w| w.socket().as_raw_fd())),
                pollfd(inotify.map_or(-1, |i| i.fd.as_raw_fd())),
            ];
            // SAFETY: three valid pollfd entries; -1: wait until one is ready.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // Cannot wait: tell the watcher to poll from now on.
                hub.set_notified(false);
                return;
            }
            if fds[0].revents != 0 || hub.is_closed() {
                return;
            }
            if fds[1].revents != 0 {
                if let Some(wake) = &sources.wake {
                    match drain_socket(wake, &mut buf) {
                        Ok(0) => {}
                        Ok(n) => {
                            crate::stage::mark("wake_received");
                            sources.peers.count_received(n);
                            hub.peer_committed();
                        }
                        Err(()) => {
                            hub.set_notified(false);
                            return;
                        }
                    }
                }
            }
            if fds[2].revents != 0 {
                let Some(inotify) = inotify else { continue };
                match drain_inotify(inotify, &mut buf) {
                    Ok(seen) => {
                        if seen.wake_dir {
                            sources.peers.mark_stale();
                        }
                        if seen.wal {
                            hub.wal_written();
                            std::thread::sleep(COALESCE);
                        }
                    }
                    Err(()) => {
                        hub.set_notified(false);
                        return;
                    }
                }
            }
        }
    }

    /// Reads every queued byte: how many datagrams came.
    fn drain_socket(wake: &WakeSocket, buf: &mut [u8]) -> Result<u64, ()> {
        let mut n = 0;
        loop {
            match wake.socket().recv(buf) {
                Ok(_) => n += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
    }

    /// What the queued inotify events concern.
    #[derive(Debug, Default, PartialEq, Eq)]
    pub(super) struct Seen {
        pub(super) wake_dir: bool,
        pub(super) wal: bool,
    }

    fn drain_inotify(inotify: &Inotify, buf: &mut [u8]) -> Result<Seen, ()> {
        let mut seen = Seen::default();
        loop {
            // SAFETY: reads into a buffer we own, of its length.
            let n = unsafe { libc::read(inotify.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
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
            let wal = inotify.wal.as_ref().map(|(wd, name)| (*wd, name.as_slice()));
            let more = read_events(&buf[..n], inotify.wake_dir, wal);
            seen.wake_dir |= more.wake_dir;
            seen.wal |= more.wal;
        }
    }

    /// Reads `bytes` (a whole number of `inotify_event`s, as read returns
    /// them): any event of the `wake_dir` watch, an event of the `wal`
    /// watch naming the WAL file; an overflow (events lost) counts as both.
    pub(super) fn read_events(bytes: &[u8], wake_dir: Option<libc::c_int>, wal: Option<(libc::c_int, &[u8])>) -> Seen {
        const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
        let mut at = 0;
        let mut seen = Seen::default();
        while at + HEADER <= bytes.len() {
            // The header's fields, read without assuming alignment.
            let field = |off: usize| u32::from_ne_bytes(bytes[at + off..at + off + 4].try_into().unwrap_or([0; 4]));
            let wd = field(0) as libc::c_int;
            let mask = field(4);
            let len = field(12) as usize;
            let name = bytes.get(at + HEADER..at + HEADER + len).unwrap_or(&[]);
            // The name is NUL-padded to an aligned length.
            let name = name.split(|b| *b == 0).next().unwrap_or(&[]);
            if mask & libc::IN_Q_OVERFLOW != 0 {
                seen.wake_dir = wake_dir.is_some();
                seen.wal = wal.is_some();
            }
            if Some(wd) == wake_dir {
                seen.wake_dir = true;
            }
            if let Some((wal_wd, wal_name)) = wal {
                if wd == wal_wd && name == wal_name {
                    seen.wal = true;
                }
            }
            at += HEADER + len;
        }
        seen
    }

    #[cfg(test)]
    mod tests {
        use super::{read_events, Seen};

        fn event(wd: i32, mask: u32, name: &[u8]) -> Vec<u8> {
            let padded = name.len().div_ceil(16) * 16;
            let mut v = Vec::new();
            v.extend_from_slice(&wd.to_ne_bytes());
            v.extend_from_slice(&mask.to_ne_bytes());
            v.extend_from_slice(&0u32.to_ne_bytes());
            v.extend_from_slice(&(padded as u32).to_ne_bytes());
            let mut n = name.to_vec();
            n.resize(padded, 0);
            v.extend_from_slice(&n);
            v
        }

        const WAL: &[u8] = b"couch_workers.sqlite-wal";

        #[test]
        fn finds_the_wal_among_other_files_and_overflows() {
            let wal = Some((1, WAL));
            let mut other = event(1, libc::IN_MODIFY, b"couch_workers.wait");
            assert_eq!(read_events(&other, None, wal), Seen::default());
            other.extend(event(1, libc::IN_MODIFY, WAL));
            assert_eq!(read_events(&other, None, wal), Seen { wake_dir: false, wal: true });
            assert_eq!(read_events(&event(-1, libc::IN_Q_OVERFLOW, b""), None, wal), Seen { wake_dir: false, wal: true });
            // A name that only starts like the WAL's is another file.
            assert_eq!(read_events(&event(1, libc::IN_MODIFY, b"couch_workers.sqlite-wal2"), None, wal), Seen::default());
        }

        #[test]
        fn any_event_of_the_wake_directory_marks_the_peers_stale() {
            let created = event(2, libc::IN_CREATE, b"123-00ff.sock");
            assert_eq!(read_events(&created, Some(2), None), Seen { wake_dir: true, wal: false });
            // The same name under another watch is not the wake directory.
            assert_eq!(read_events(&created, Some(3), None), Seen::default());
            assert_eq!(read_events(&event(-1, libc::IN_Q_OVERFLOW, b""), Some(2), None), Seen { wake_dir: true, wal: false });
        }
    }
}
