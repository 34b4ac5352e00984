//! Post-commit wake-ups between the store handles that share a directory.
//!
//! Each handle (each node of the host, the CLI too) binds a Unix datagram
//! socket `DIR/wake/<pid>-<random>.sock` ([`WakeSocket`]). After every
//! commit of its write connection (SQLite's WAL hook, which runs once the
//! commit is visible to every other connection and the write lock is
//! released; one per group commit, not per member), and after the commit
//! of a read-mode transaction that wrote (on its read connection, which
//! has no such hook: `transaction/commit.rs`), a handle sends one byte
//! to every *other* handle's socket ([`Peers::wake_all`]). The receiver's
//! watcher thread, which polls the socket itself (`sources.rs`), then looks
//! at `data_version` once and finds the commit: no settle window, and no
//! handle is woken by its own commits.
//!
//! The list of peers is read from the directory and kept with a connected
//! socket per peer; it is read again when the directory changes (inotify
//! on `DIR/wake`, `sources.rs`), or, without inotify, at most once a second.
//! A send that finds its peer gone (`ECONNREFUSED`: the socket was closed,
//! by a clean close or a `kill -9`) drops the peer and removes its file;
//! the scan does the same for the files that no live socket is bound to,
//! so the next handle to open cleans up after a killed process. A full
//! receive queue (`EAGAIN`) means that receiver is already due to wake:
//! the byte is dropped.
//!
//! A writer that sends nothing (the `sqlite3` shell, an older build, a
//! crash between the commit and the send) is still seen by the watcher's
//! safety look (`watch.rs`; every `EmbeddedOptions::safety_look`, 10 s
//! by default).

use std::ffi::OsString;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The subdirectory of the store directory that holds the sockets.
pub(crate) const DIR_NAME: &str = "wake";

const SUFFIX: &str = ".sock";

/// Without inotify on the directory, how often the peer list is read again.
const RESCAN_UNWATCHED: Duration = Duration::from_secs(1);

/// `sun_path` holds 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// The socket this handle receives wake-ups on. Dropping it removes its
/// file before closing it, so no sender takes a closed socket for a dead
/// process's.
pub(crate) struct WakeSocket {
    socket: UnixDatagram,
    path: PathBuf,
}

impl WakeSocket {
    /// Creates `store_dir/wake` if needed and binds a new socket in it
    /// (non-blocking: the watcher thread polls it).
    pub(crate) fn bind(store_dir: &Path) -> io::Result<WakeSocket> {
        WakeSocket::bind_as(store_dir, &WakeSocket::new_name())
    }

    /// A name no other socket has had: this process's id and 64 random
    /// bits.
    pub(crate) fn new_name() -> OsString {
        format!("{}-{:016x}{SUFFIX}", std::process::id(), rand::random::<u64>()).into()
    }

    /// [`WakeSocket::bind`] under `name` (from [`WakeSocket::new_name`]),
    /// so that the handle's peer list can know the name before the file
    /// exists and never take it for another handle's.
    pub(crate) fn bind_as(store_dir: &Path, name: &OsString) -> io::Result<WakeSocket> {
        let dir = store_dir.join(DIR_NAME);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = dir.join(name);
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the socket path {} is longer than {MAX_SOCKET_PATH} bytes", path.display()),
            ));
        }
        let socket = UnixDatagram::bind(&path)?;
        socket.set_nonblocking(true)?;
        Ok(WakeSocket { socket, path })
    }

    pub(crate) fn socket(&self) -> &UnixDatagram {
        &self.socket
    }

    /// The socket's file name in the wake directory.
    pub(crate) fn file_name(&self) -> Option<OsString> {
        self.path.file_name().map(|n| n.to_os_string())
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WakeSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

struct Peer {
    name: OsString,
    socket: UnixDatagram,
}

struct PeerList {
    peers: Vec<Peer>,
    /// When the directory was last read (`None`: never).
    scanned: Option<Instant>,
}

/// Counters of one handle's wake-ups, for tests and the bench.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WakeStats {
    /// This handle's socket is bound: other handles' commits wake it at once.
    pub listening: bool,
    /// Peers known at the last send.
    pub peers: usize,
    /// Bytes sent (one per peer per commit).
    pub sent: u64,
    /// Sends dropped because the receiver's queue was full.
    pub dropped: u64,
    /// Bytes received from other handles.
    pub received: u64,
    /// Socket files of dead handles removed by this one.
    pub cleaned: u64,
}

/// The sending side: the other handles' sockets.
pub(crate) struct Peers {
    dir: PathBuf,
    /// This handle's own socket file, never sent to (a new one after the
    /// watcher binds its socket again, `sources.rs`).
    own: Mutex<Option<OsString>>,
    /// This handle's socket is bound and read by its watcher thread.
    listening: AtomicBool,
    list: Mutex<PeerList>,
    /// The directory changed since the last scan (set by `sources.rs`).
    stale: AtomicBool,
    /// inotify watches the directory: no timed rescans needed.
    watched: AtomicBool,
    sent: AtomicU64,
    dropped: AtomicU64,
    received: AtomicU64,
    cleaned: AtomicU64,
}

impl Peers {
    /// The peers in `store_dir/wake`, excluding `own`.
    pub(crate) fn new(store_dir: &Path, own: Option<OsString>) -> Peers {
        Peers {
            dir: store_dir.join(DIR_NAME),
            own: Mutex::new(own),
            listening: AtomicBool::new(false),
            list: Mutex::new(PeerList { peers: Vec::new(), scanned: None }),
            stale: AtomicBool::new(true),
            watched: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            received: AtomicU64::new(0),
            cleaned: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PeerList> {
        // Plain vector edits: consistent after a panic.
        self.list.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The directory changed: read it again before the next send.
    pub(crate) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// This handle's socket file is now `own` (none: it has none).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn set_own(&self, own: Option<OsString>) {
        *self.own.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = own;
        self.mark_stale();
    }

    /// The watcher thread reads this handle's socket (`true`) or no
    /// longer does.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn set_listening(&self, on: bool) {
        self.listening.store(on, Ordering::Release);
    }

    /// inotify on the directory started (`true`) or stopped.
    pub(crate) fn set_watched(&self, on: bool) {
        self.watched.store(on, Ordering::Release);
    }

    pub(crate) fn count_received(&self, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
    }

    /// One byte to every other handle's socket: called after each commit
    /// of this handle's write connection.
    pub(crate) fn wake_all(&self) {
        crate::stage::mark("commit_visible");
        let mut list = self.lock();
        let due = match list.scanned {
            None => true,
            Some(at) => !self.watched.load(Ordering::Acquire) && at.elapsed() >= RESCAN_UNWATCHED,
        };
        if self.stale.swap(false, Ordering::AcqRel) || due {
            self.scan(&mut list);
        }
        let gone: Vec<usize> = (0..list.peers.len()).filter(|&i| !self.send(&list.peers[i])).collect();
        if gone.is_empty() {
            return;
        }
        for i in gone.into_iter().rev() {
            let peer = list.peers.swap_remove(i);
            self.remove_dead(&peer.name);
        }
        // A peer's socket went: the directory changed, and the handle may
        // have bound a new one (it listens again after its notifications
        // failed) that this list learns of only when this handle's watcher
        // thread reads the inotify event. Read it now, and wake the new
        // ones too.
        let known: Vec<OsString> = list.peers.iter().map(|p| p.name.clone()).collect();
        self.scan(&mut list);
        for peer in list.peers.iter().filter(|p| !known.contains(&p.name)) {
            self.send(peer);
        }
    }

    /// One wake-up to `peer`: `false` when its socket is gone.
    fn send(&self, peer: &Peer) -> bool {
        match peer.socket.send(&[1]) {
            Ok(_) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if peer_gone(&e) => return false,
            // Anything else (ENOBUFS): try again at the next commit.
            Err(_) => {}
        }
        true
    }

    /// Reads the directory: connects to new sockets, forgets removed ones,
    /// removes the files of dead handles.
    fn scan(&self, list: &mut PeerList) {
        list.scanned = Some(Instant::now());
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            list.peers.clear();
            return;
        };
        let own = self.own.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().ends_with(SUFFIX) || own.as_ref() == Some(&name) {
                continue;
            }
            found.push(name);
        }
        list.peers.retain(|p| found.contains(&p.name));
        for name in found {
            if list.peers.iter().any(|p| p.name == name) {
                continue;
            }
            match connect(&self.dir.join(&name)) {
                Ok(socket) => list.peers.push(Peer { name, socket }),
                Err(e) if peer_gone(&e) => self.remove_dead(&name),
                // Not a socket, or not ours to reach: leave it alone.
                Err(_) => {}
            }
        }
    }

    /// A socket file that no live socket is bound to (its handle was
    /// killed before it could remove it). Names are never reused (pid and
    /// 64 random bits), so the file cannot be a newer handle's.
    fn remove_dead(&self, name: &OsString) {
        if std::fs::remove_file(self.dir.join(name)).is_ok() {
            self.cleaned.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn stats(&self) -> WakeStats {
        WakeStats {
            listening: self.listening.load(Ordering::Acquire),
            peers: self.lock().peers.len(),
            sent: self.sent.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            cleaned: self.cleaned.load(Ordering::Relaxed),
        }
    }
}

fn connect(path: &Path) -> io::Result<UnixDatagram> {
    let socket = UnixDatagram::unbound()?;
    socket.connect(path)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The peer's socket is closed (`ECONNREFUSED`) or its file is gone.
fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::NotConnected
            | io::ErrorKind::NotFound
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv_all(s: &WakeSocket) -> usize {
        let mut buf = [0u8; 16];
        let mut n = 0;
        while s.socket().recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }

    #[test]
    fn wakes_the_others_not_itself_and_drops_the_dead() {
        let dir = tempfile::tempdir().expect("temp dir");
        let a = WakeSocket::bind(dir.path()).expect("bind a");
        let b = WakeSocket::bind(dir.path()).expect("bind b");
        let peers = Peers::new(dir.path(), a.file_name());
        peers.wake_all();
        assert_eq!((recv_all(&a), recv_all(&b)), (0, 1), "a wakes b, not itself");
        // b closes cleanly (its file goes first): a forgets it.
        let b_path = b.path().to_path_buf();
        drop(b);
        assert!(!b_path.exists());
        peers.wake_all();
        assert_eq!(peers.stats().peers, 0);
        assert_eq!(peers.stats().cleaned, 0, "nothing left to clean");
        // c is "killed": its socket closes, its file stays.
        let c_path = dir.path().join(DIR_NAME).join("999-dead.sock");
        let c = UnixDatagram::bind(&c_path).expect("bind c");
        peers.mark_stale();
        peers.wake_all();
        assert_eq!(peers.stats().peers, 1);
        drop(c);
        assert!(c_path.exists(), "a killed handle leaves its file");
        peers.wake_all();
        assert!(!c_path.exists(), "the send that found it dead removed it");
        assert_eq!(peers.stats().cleaned, 1);
        assert_eq!(peers.stats().peers, 0);
        // A file left before the scan: the scan removes it.
        let d_path = dir.path().join(DIR_NAME).join("998-dead.sock");
        drop(UnixDatagram::bind(&d_path).expect("bind d"));
        peers.mark_stale();
        peers.wake_all();
        assert!(!d_path.exists(), "the scan removed the dead socket's file");
        assert_eq!(peers.stats().cleaned, 2);
        assert_eq!(recv_all(&a), 0, "a never woke itself");
    }
}
