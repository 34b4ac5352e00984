//! What the store's watcher thread (`watcher.rs`) listens to besides its
//! bell (`bell.rs`), all in one `ppoll(2)` on Linux:
//!
//! * the handle's wake socket (`wake.rs`): another handle committed, and
//!   its commit is visible: the watcher looks at `data_version` once;
//! * an inotify descriptor watching `DIR/wake`: a handle opened or closed,
//!   so the list of peers this handle sends to is read again before its
//!   next send (the directory removed, with this handle's socket file, no
//!   other handle can reach it: notifications end, the watcher polls
//!   until it listens again, `relisten.rs`);
//! * only where the wake socket could not be bound (a read-only or full
//!   directory, a path too long for a socket): inotify on the WAL file.
//!   Every write of the WAL by any process (this one's included) starts a
//!   settle window of looks at `data_version` (the frames are written
//!   before the commit is visible; see `watcher.rs`), and the descriptor is
//!   left out of the poll for [`COALESCE`] after each such event, so that
//!   a stream of writes wakes the thread at most ~1,000 times a second
//!   (the window's own looks go on meanwhile).

use std::sync::Arc;
use std::time::Duration;

use super::wake::{Peers, WakeSocket};

/// How long the WAL's inotify descriptor stays out of the poll after each
/// of its events (fallback only).
pub(crate) const COALESCE: Duration = Duration::from_millis(1);

/// What the watcher listens to besides its bell (with `wal_notify`).
pub(crate) struct Sources {
    /// This handle's wake socket (`None`: it could not be bound; the WAL
    /// fallback runs instead).
    pub(crate) wake: Option<Arc<WakeSocket>>,
    /// The peer list to mark stale when `DIR/wake` changes.
    pub(crate) peers: Arc<Peers>,
    /// The WAL file's name, for the fallback.
    pub(crate) wal_name: String,
}

/// What came during one wait of the watcher (`Listener::wait`); nothing
/// when the bell rang, the deadline passed, or an event came that needs
/// no look, such as a peer list change.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Woken {
    /// Another handle's post-commit wake-up.
    pub(crate) peer: bool,
    /// A write of the WAL (fallback).
    pub(crate) wal: bool,
}

#[cfg(target_os = "linux")]
pub(crate) use linux::{wait, OpenSources};

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{Sources, Woken, COALESCE};
    use crate::store::embedded::bell::{owned, Bell};
    use crate::store::embedded::wake::{self, Peers, WakeSocket};

    /// The inotify descriptor and what its watches are.
    struct Inotify {
        fd: OwnedFd,
        /// The watch on `DIR/wake` (peers come and go).
        wake_dir: Option<libc::c_int>,
        /// This handle's socket file's name in `DIR/wake`.
        own_socket: Option<Vec<u8>>,
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
        if let Some(socket) = &sources.wake {
            let mask = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_TO | libc::IN_MOVED_FROM;
            let wake_dir = add_watch(&fd, &dir.join(wake::DIR_NAME), mask)?;
            let own_socket = socket.file_name().map(|n| n.as_bytes().to_vec());
            Some(Inotify { fd, wake_dir: Some(wake_dir), own_socket, wal: None })
        } else {
            // The directory, not the WAL file: SQLite deletes and recreates
            // the WAL (when the last connection of the host closes), which
            // would end a watch on the file itself.
            let wal = add_watch(&fd, dir, libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO)?;
            Some(Inotify {
                fd,
                wake_dir: None,
                own_socket: None,
                wal: Some((wal, sources.wal_name.as_bytes().to_vec())),
            })
        }
    }

    /// The sources being listened to: their open descriptors.
    pub(crate) struct OpenSources {
        wake: Option<Arc<WakeSocket>>,
        peers: Arc<Peers>,
        inotify: Option<Inotify>,
        /// The WAL's inotify descriptor is left out of the poll until then.
        wal_quiet_until: Option<Instant>,
        buf: Vec<u8>,
    }

    impl OpenSources {
        /// `None`: neither the socket nor inotify is available.
        pub(crate) fn new(dir: &Path, sources: Sources) -> Option<OpenSources> {
            let inotify = inotify(dir, &sources);
            if inotify.is_none() && sources.wake.is_none() {
                return None;
            }
            // Without inotify on `DIR/wake` the sender reads it again now and then.
            sources.peers.set_watched(inotify.as_ref().is_some_and(|i| i.wake_dir.is_some()));
            sources.peers.set_listening(sources.wake.is_some());
            Some(OpenSources {
                wake: sources.wake,
                peers: sources.peers,
                inotify,
                wal_quiet_until: None,
                buf: vec![0u8; 16 * 1024],
            })
        }
    }

    impl OpenSources {
        /// Wake-ups come through a socket (else through inotify on the WAL).
        pub(crate) fn has_socket(&self) -> bool {
            self.wake.is_some()
        }
    }

    impl Drop for OpenSources {
        fn drop(&mut self) {
            self.peers.set_watched(false);
            self.peers.set_listening(false);
        }
    }

    fn pollfd(fd: libc::c_int) -> libc::pollfd {
        libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
    }

    /// One `ppoll` on the bell and the open sources, until `deadline`
    /// (`None`: none). A source that fails (or a lost watch: `DIR/wake`
    /// removed with this handle's socket file) sets `listen` to `None`:
    /// notifications end, and the watcher polls until it listens again.
    pub(crate) fn wait(bell: &Bell, listen: &mut Option<OpenSources>, deadline: Option<Instant>) -> Woken {
        let now = Instant::now();
        let mut timeout = deadline.map(|d| d.saturating_duration_since(now));
        let mut wal_fd_polled = true;
        if let Some(l) = listen.as_mut() {
            if let Some(until) = l.wal_quiet_until {
                if now >= until {
                    l.wal_quiet_until = None;
                } else {
                    wal_fd_polled = false;
                    timeout = Some(timeout.map_or(until - now, |t| t.min(until - now)));
                }
            }
        }
        // Unused slots hold -1, which poll ignores.
        let mut fds = [
            pollfd(bell.fd()),
            pollfd(listen.as_ref().and_then(|l| l.wake.as_ref()).map_or(-1, |w| w.socket().as_raw_fd())),
            pollfd(
                listen
                    .as_ref()
                    .and_then(|l| l.inotify.as_ref())
                    .filter(|_| wal_fd_polled)
                    .map_or(-1, |i| i.fd.as_raw_fd()),
            ),
        ];
        let ts = timeout.map(timespec);
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: three valid pollfd entries, a live timespec or null (no
        // deadline), no signal mask change.
        let ready = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ts_ptr, std::ptr::null()) };
        let mut woken = Woken::default();
        if ready < 0 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                // Cannot wait on the sources: poll from now on (the bell
                // alone is polled next time), and do not spin meanwhile.
                *listen = None;
                std::thread::sleep(timeout.unwrap_or(COALESCE).min(COALESCE));
            }
            return woken;
        }
        if ready == 0 {
            return woken;
        }
        if fds[0].revents != 0 {
            bell.drain();
        }
        let Some(l) = listen.as_mut() else { return woken };
        let mut failed = bell.take_sources_fault();
        if fds[1].revents != 0 {
            if let Some(wake) = &l.wake {
                match drain_socket(wake, &mut l.buf) {
                    Ok(0) => {}
                    Ok(n) => {
                        crate::stage::mark("wake_received");
                        l.peers.count_received(n);
                        woken.peer = true;
                    }
                    Err(()) => failed = true,
                }
            }
        }
        if fds[2].revents != 0 {
            if let Some(inotify) = &l.inotify {
                match drain_inotify(inotify, &mut l.buf) {
                    Ok(seen) => {
                        failed |= seen.lost;
                        if seen.wake_dir {
                            l.peers.mark_stale();
                        }
                        if seen.wal {
                            woken.wal = true;
                            l.wal_quiet_until = Some(Instant::now() + COALESCE);
                        }
                    }
                    Err(()) => failed = true,
                }
            }
        }
        if failed {
            // One failing source (or a lost watch: `DIR/wake` removed with
            // this handle's socket file) ends notifications; the watcher
            // polls until the `Listener` listens again.
            *listen = None;
        }
        woken
    }

    fn timespec(d: Duration) -> libc::timespec {
        libc::timespec {
            tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
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
        /// A watch is gone (`IN_IGNORED`: its directory was removed, or
        /// its file system unmounted). For `DIR/wake`, this handle's
        /// socket file went with it: no other handle can wake it any more.
        pub(super) lost: bool,
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
            let wake_dir = inotify.wake_dir.map(|wd| (wd, inotify.own_socket.as_deref().unwrap_or(&[])));
            let more = read_events(&buf[..n], wake_dir, wal);
            seen.wake_dir |= more.wake_dir;
            seen.wal |= more.wal;
            seen.lost |= more.lost;
        }
    }

    /// Reads `bytes` (a whole number of `inotify_event`s, as read returns
    /// them): any event of the `wake_dir` watch (given with this handle's
    /// socket file's name), an event of the `wal` watch naming the WAL
    /// file; an overflow (events lost) counts as both. Lost: the socket
    /// file deleted or moved away (the directory removed: its watch stays
    /// while the sockets bound in it pin it, so no `IN_IGNORED` comes), or
    /// either watch removed (`IN_IGNORED`).
    pub(super) fn read_events(
        bytes: &[u8],
        wake_dir: Option<(libc::c_int, &[u8])>,
        wal: Option<(libc::c_int, &[u8])>,
    ) -> Seen {
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
            if let Some((wake_wd, own_socket)) = wake_dir {
                if wd == wake_wd {
                    seen.wake_dir = true;
                    let gone = libc::IN_DELETE | libc::IN_MOVED_FROM;
                    if mask & gone != 0 && !own_socket.is_empty() && name == own_socket {
                        seen.lost = true;
                    }
                }
            }
            let ours = wake_dir.is_some_and(|(w, _)| wd == w) || wal.is_some_and(|(w, _)| wd == w);
            if ours && mask & libc::IN_IGNORED != 0 {
                seen.lost = true;
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
            assert_eq!(read_events(&other, None, wal), Seen { wal: true, ..Seen::default() });
            assert_eq!(
                read_events(&event(-1, libc::IN_Q_OVERFLOW, b""), None, wal),
                Seen { wal: true, ..Seen::default() }
            );
            // A name that only starts like the WAL's is another file.
            assert_eq!(
                read_events(&event(1, libc::IN_MODIFY, b"couch_workers.sqlite-wal2"), None, wal),
                Seen::default()
            );
        }

        const OWN: &[u8] = b"123-00ff.sock";

        #[test]
        fn the_own_socket_file_removed_or_a_removed_watch_is_lost() {
            let lost = Seen { wake_dir: true, wal: false, lost: true };
            assert_eq!(read_events(&event(2, libc::IN_DELETE, OWN), Some((2, OWN)), None), lost);
            assert_eq!(read_events(&event(2, libc::IN_MOVED_FROM, OWN), Some((2, OWN)), None), lost);
            // Another handle's socket going only changes the peers.
            let other = event(2, libc::IN_DELETE, b"124-00ff.sock");
            assert_eq!(read_events(&other, Some((2, OWN)), None), Seen { wake_dir: true, ..Seen::default() });
            let ignored = event(2, libc::IN_IGNORED, b"");
            assert_eq!(read_events(&ignored, Some((2, OWN)), None), lost);
            assert_eq!(read_events(&ignored, None, Some((2, WAL))), Seen { lost: true, ..Seen::default() });
            // Another watch's removal is not ours.
            assert_eq!(read_events(&ignored, Some((3, OWN)), None), Seen::default());
        }

        #[test]
        fn any_event_of_the_wake_directory_marks_the_peers_stale() {
            let created = event(2, libc::IN_CREATE, b"124-00ff.sock");
            assert_eq!(read_events(&created, Some((2, OWN)), None), Seen { wake_dir: true, ..Seen::default() });
            // The same name under another watch is not the wake directory.
            assert_eq!(read_events(&created, Some((3, OWN)), None), Seen::default());
            assert_eq!(
                read_events(&event(-1, libc::IN_Q_OVERFLOW, b""), Some((2, OWN)), None),
                Seen { wake_dir: true, ..Seen::default() }
            );
        }
    }
}
