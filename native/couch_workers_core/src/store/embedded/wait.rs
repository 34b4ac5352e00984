//! What the store's one watcher thread, `cw-embed-watch` (`watch.rs`),
//! sleeps on. On Linux, one `ppoll(2)` on
//!
//! * its [`Bell`], an eventfd: rung by this handle for a local reason to
//!   look (a commit that wrote a watched key, a new registration) and by
//!   `close`;
//! * the handle's wake socket (`wake.rs`): another handle committed, and
//!   its commit is visible: the watcher looks at `data_version` once;
//! * an inotify descriptor watching `DIR/wake`: a handle opened or closed,
//!   so the list of peers this handle sends to is read again before its
//!   next send (the directory removed, with this handle's socket file, no
//!   other handle can reach it: notifications end, the watcher polls
//!   until it listens again, below);
//! * only where the wake socket could not be bound (a read-only or full
//!   directory, a path too long for a socket): inotify on the WAL file, as
//!   before the wake sockets. Every write of the WAL by any process (this
//!   one's included) starts a settle window of looks at `data_version`
//!   (the frames are written before the commit is visible; see
//!   `watch.rs`), and the descriptor is left out of the poll for
//!   [`COALESCE`] after each such event, so that a stream of writes wakes
//!   the thread at most ~1,000 times a second (the window's own looks go
//!   on meanwhile);
//!
//! with the timeout of the watcher's schedule (safety look, settle steps,
//! polling). The wake-up of another process's commit thus reaches the
//! thread that reads the watched keys directly: until session 10 a second
//! thread (`cw-embed-notify`) received it and rang the watcher through a
//! condition variable, one more thread hand-off on every cross-node wake-up
//! (bench/RESULTS.md, "Session 10").
//!
//! When the sources fail (a failing read, an inotify queue overflow, this
//! handle's socket file or `DIR/wake` removed), the watcher polls at once
//! and the [`Waiter`] listens again a second later (`relisten.rs`: backing
//! off to a minute while that fails, or while the sources fail again soon
//! after): a new socket in `DIR/wake`
//! (recreated if need be), a new inotify. The other handles learn of the
//! new socket when their watcher threads read the directory's event (or
//! its next timed read, without inotify: about a second), so the watcher
//! goes on polling for a grace after listening again: a commit
//! in between, whose wake-up went nowhere, is still seen at once. Until
//! session 13 a handle that fell back polled `data_version` every few
//! milliseconds until it closed: an idle node stayed at hundreds of
//! wake-ups a second.
//!
//! Either way a quiet store costs nothing: nothing wakes the thread while
//! no process writes. Without a socket or inotify (not Linux, or
//! `wal_notify` off) it waits on the bell alone (a condition variable off
//! Linux) and the watcher polls.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
use super::relisten::Relisten;
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

/// What came during one [`Waiter::wait`] (nothing: the bell rang, the
/// deadline passed, or an event that needs no look, such as a peer list
/// change).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Woken {
    /// Another handle's post-commit wake-up.
    pub(crate) peer: bool,
    /// A write of the WAL (fallback).
    pub(crate) wal: bool,
}

/// The watcher's doorbell for this handle's own reasons to look. Level
/// triggered: a ring that comes between the watcher's check of its flags
/// and its wait makes the wait return at once, so none is lost.
pub(crate) struct Bell {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::OwnedFd,
    #[cfg(not(target_os = "linux"))]
    rung: (std::sync::Mutex<bool>, std::sync::Condvar),
    /// Tests only: the next wait treats its sources as failed.
    #[cfg(feature = "testkit")]
    sources_fault: std::sync::atomic::AtomicBool,
}

impl Bell {
    pub(crate) fn new() -> std::io::Result<Bell> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: a plain syscall with constant flags.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            let fd = linux::owned(fd).ok_or_else(std::io::Error::last_os_error)?;
            Ok(Bell {
                fd,
                #[cfg(feature = "testkit")]
                sources_fault: Default::default(),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(Bell {
                rung: Default::default(),
                #[cfg(feature = "testkit")]
                sources_fault: Default::default(),
            })
        }
    }

    /// Tests only: makes the watcher's wait (woken by this ring) find its
    /// sources failed, as a failing `recv` of the wake socket or read of
    /// inotify would.
    #[cfg(feature = "testkit")]
    pub(crate) fn fail_sources(&self) {
        self.sources_fault.store(true, std::sync::atomic::Ordering::SeqCst);
        self.ring();
    }

    /// Tests only: [`Bell::fail_sources`] not yet taken by a wait.
    #[cfg(feature = "testkit")]
    pub(crate) fn sources_failure_pending(&self) -> bool {
        self.sources_fault.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a wait must treat its sources as failed (tests only).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn take_sources_fault(&self) -> bool {
        #[cfg(feature = "testkit")]
        {
            self.sources_fault.swap(false, std::sync::atomic::Ordering::SeqCst)
        }
        #[cfg(not(feature = "testkit"))]
        {
            false
        }
    }

    /// Wakes the watcher (or makes its next wait return at once).
    pub(crate) fn ring(&self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
            // It fails only when the counter is near u64::MAX: rung anyway.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
        #[cfg(not(target_os = "linux"))]
        {
            let mut rung = self.rung.0.lock().unwrap_or_else(|p| p.into_inner());
            *rung = true;
            self.rung.1.notify_one();
        }
    }
}

/// The watcher thread's side: its bell and, while they work, its sources.
pub(crate) struct Waiter {
    bell: Arc<Bell>,
    #[cfg(target_os = "linux")]
    listen: Option<linux::Listen>,
    /// How to listen again once the sources failed (`None`: there were
    /// none to begin with).
    #[cfg(target_os = "linux")]
    relisten: Option<Relisten>,
}

impl Waiter {
    /// The waiter of the store in `dir`: the bell alone without `sources`
    /// (or, until they can start, where none of them can: the watcher
    /// then polls). `socket`: bind a new wake socket when listening again.
    pub(crate) fn new(dir: &Path, sources: Option<Sources>, socket: bool, bell: Arc<Bell>) -> Waiter {
        #[cfg(target_os = "linux")]
        {
            let relisten = sources.as_ref().map(|s| Relisten::new(dir, s, socket));
            let listen = sources.and_then(|s| linux::Listen::new(dir, s));
            let mut waiter = Waiter { bell, listen, relisten };
            if waiter.listen.is_none() {
                waiter.lost();
            }
            waiter
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (dir, sources, socket);
            Waiter { bell }
        }
    }

    /// The sources failed (or never started): plan the next attempt.
    #[cfg(target_os = "linux")]
    fn lost(&mut self) {
        if let Some(r) = self.relisten.as_mut() {
            r.lost();
        }
    }

    /// Listens again if it is time to: `true` when the sources run again.
    #[cfg(target_os = "linux")]
    fn try_relisten(&mut self, now: Instant) -> bool {
        let Some(r) = self.relisten.as_mut() else { return false };
        let Some(sources) = r.due_sources(now) else { return false };
        self.listen = linux::Listen::new(r.dir(), sources);
        let socket = self.listen.as_ref().is_some_and(|l| l.has_socket());
        r.attempted(now, self.listen.is_some(), socket);
        self.listen.is_some()
    }

    /// Notifications run: other handles' commits wake the thread, which
    /// needs no polling (not yet in the grace after listening again).
    pub(crate) fn notified(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.listen.is_some() && !self.relisten.as_ref().is_some_and(Relisten::in_grace)
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// Sleeps until the bell rings, a source has news, or `deadline`
    /// (`None`: no deadline). May return early with nothing (as it does
    /// when it has just listened again: the watcher, still polling for
    /// `relisten.rs`'s grace, plans its next look).
    pub(crate) fn wait(&mut self, deadline: Option<Instant>) -> Woken {
        #[cfg(target_os = "linux")]
        {
            if self.listen.is_none() && self.try_relisten(Instant::now()) {
                return Woken::default();
            }
            let listening = self.listen.is_some();
            // Not listening: wake for the next attempt, even with no watch
            // to poll for (the wait would have no deadline).
            let relisten_at = if listening { None } else { self.relisten.as_ref().and_then(Relisten::next) };
            let deadline = match (deadline, relisten_at) {
                (Some(d), Some(r)) => Some(d.min(r)),
                (d, r) => d.or(r),
            };
            let woken = linux::wait(&self.bell, &mut self.listen, deadline);
            if listening && self.listen.is_none() {
                self.lost();
            }
            woken
        }
        #[cfg(not(target_os = "linux"))]
        {
            let (lock, cvar) = &self.bell.rung;
            let mut rung = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !*rung {
                match deadline {
                    None => rung = cvar.wait(rung).unwrap_or_else(|p| p.into_inner()),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        rung = cvar.wait_timeout(rung, left).unwrap_or_else(|p| p.into_inner()).0;
                    }
                }
            }
            *rung = false;
            Woken::default()
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{Bell, Sources, Woken, COALESCE};
    use crate::store::embedded::wake::{self, Peers, WakeSocket};

    pub(super) fn owned(fd: libc::c_int) -> Option<OwnedFd> {
        // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    }

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

    /// The sources being listened to.
    pub(super) struct Listen {
        wake: Option<Arc<WakeSocket>>,
        peers: Arc<Peers>,
        inotify: Option<Inotify>,
        /// The WAL's inotify descriptor is left out of the poll until then.
        wal_quiet_until: Option<Instant>,
        buf: Vec<u8>,
    }

    impl Listen {
        /// `None`: neither the socket nor inotify is available.
        pub(super) fn new(dir: &Path, sources: Sources) -> Option<Listen> {
            let inotify = inotify(dir, &sources);
            if inotify.is_none() && sources.wake.is_none() {
                return None;
            }
            // Without inotify on `DIR/wake` the sender reads it again now and then.
            sources.peers.set_watched(inotify.as_ref().is_some_and(|i| i.wake_dir.is_some()));
            sources.peers.set_listening(sources.wake.is_some());
            Some(Listen {
                wake: sources.wake,
                peers: sources.peers,
                inotify,
                wal_quiet_until: None,
                buf: vec![0u8; 16 * 1024],
            })
        }
    }

    impl Listen {
        /// Wake-ups come through a socket (else through inotify on the WAL).
        pub(super) fn has_socket(&self) -> bool {
            self.wake.is_some()
        }
    }

    impl Drop for Listen {
        fn drop(&mut self) {
            self.peers.set_watched(false);
            self.peers.set_listening(false);
        }
    }

    fn pollfd(fd: libc::c_int) -> libc::pollfd {
        libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
    }

    fn drain_bell(bell: &Bell) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from an eventfd we own
        // (non-blocking: EAGAIN when not rung).
        let _ = unsafe { libc::read(bell.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }

    pub(super) fn wait(bell: &Bell, listen: &mut Option<Listen>, deadline: Option<Instant>) -> Woken {
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
            pollfd(bell.fd.as_raw_fd()),
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
            drain_bell(bell);
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
            // As the notify thread did: one failing source (or a lost
            // watch: `DIR/wake` removed with this handle's socket file)
            // ends notifications; the watcher polls until the `Waiter`
            // listens again.
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
