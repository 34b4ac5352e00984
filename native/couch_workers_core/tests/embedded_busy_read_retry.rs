//! A look of the watcher thread whose read fails because another process
//! is recovering the WAL (SQLITE_BUSY_RECOVERY: its index in the `-shm`
//! file is being rebuilt under the WAL's write, checkpoint and recovery
//! locks) is tried again soon, not only at the next safety look (an hour
//! here); and while the store stays busy the thread does not spin.
//!
//! The recovering process is this test binary re-executed: it commits a
//! change of the watched key with plain SQLite (no wake-up, as the
//! `sqlite3` shell), then takes the three locks on the `-shm` file (the
//! bytes SQLite's unix VFS locks) and zeroes the index header, as a
//! process that began a recovery does, and holds them until told to exit.
//! The watching handle's next look (a new registration) fails; once the
//! locks go, its retry recovers the index itself and fires the watch.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedStore, FILE_NAME};
use couch_workers_core::store::{Database, TxOptions};

mod late_fire_common;
use late_fire_common::{armed_watch, hour_safety_look, FIRE_LIMIT};

const ROLE: &str = "CW_BUSY_READ_ROLE";
const ROLE_DIR: &str = "CW_BUSY_READ_DIR";
const TEST: &str = "a_look_that_failed_on_a_wal_recovery_is_retried_soon";

/// Where SQLite's unix VFS takes the WAL index's locks in the `-shm` file
/// (`UNIX_SHM_BASE`), and the three a recovery holds: WRITE, CKPT,
/// RECOVER (`wal.c`: `WAL_WRITE_LOCK` 0 .. `WAL_RECOVER_LOCK` 2).
const SHM_LOCKS_AT: i64 = 120;
const RECOVERY_LOCKS: i64 = 3;
/// The two copies of the index header (`WalIndexHdr`, 48 bytes each).
const INDEX_HEADERS: usize = 96;

/// How long after the recovery's locks go the watch must fire: a retry
/// comes within tens of milliseconds; this leaves room for a loaded host.
const AFTER_RELEASE: Duration = Duration::from_secs(1);

/// How long the test keeps the store busy after the first failed look.
const BUSY_FOR: Duration = Duration::from_millis(500);

/// The child: the change, then the recovery's locks, until stdin speaks.
fn recover_in_child(dir: &Path) {
    let conn = rusqlite::Connection::open(dir.join(FILE_NAME)).expect("open with plain SQLite");
    conn.execute(
        "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        rusqlite::params![b"k".to_vec(), b"v".to_vec()],
    )
    .expect("commit the change");
    // Closed first: closing any descriptor of the `-shm` file would drop
    // this process's locks on it.
    drop(conn);
    let shm_path = dir.join(format!("{FILE_NAME}-shm"));
    let shm = std::fs::OpenOptions::new().read(true).write(true).open(&shm_path).expect("open the -shm file");
    // SAFETY: a zeroed flock is a valid argument; its fields are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = SHM_LOCKS_AT;
    lock.l_len = RECOVERY_LOCKS;
    // SAFETY: a descriptor we own and a live flock.
    let r = unsafe { libc::fcntl(shm.as_raw_fd(), libc::F_SETLK, &lock) };
    assert_eq!(r, 0, "take the recovery's locks: {}", std::io::Error::last_os_error());
    shm.write_all_at(&[0u8; INDEX_HEADERS], 0).expect("zero the index headers");
    println!("RECOVERING");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    // Exiting drops the locks.
}

#[tokio::test(flavor = "multi_thread")]
async fn a_look_that_failed_on_a_wal_recovery_is_retried_soon() {
    if std::env::var(ROLE).as_deref() == Ok("recovering") {
        recover_in_child(Path::new(&std::env::var(ROLE_DIR).expect("dir")));
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let opts = hour_safety_look(dir.path());
    let db = EmbeddedStore::open(opts).expect("open");
    // Armed once the watcher thread has read `k` since (`armed_watch`).
    let w = armed_watch(&*db, b"k").await;

    // The registration that makes the thread look: its transaction reads
    // (takes its snapshot) before the recovery starts, and commits while
    // it runs (a read-only commit takes no lock).
    let trigger = db.create_transaction(&TxOptions::read()).await.expect("tx");
    assert_eq!(trigger.get(b"trigger", false).await.expect("read"), None);

    let mut cmd = std::process::Command::new(std::env::current_exe().expect("current exe"));
    cmd.args(["--exact", TEST, "--nocapture", "--test-threads=1"]).env(ROLE, "recovering").env(ROLE_DIR, dir.path());
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let said = tokio::task::spawn_blocking(move || {
        let found = lines.by_ref().map_while(Result::ok).any(|l| l.contains("RECOVERING"));
        (found, lines)
    });
    let (found, lines) = tokio::time::timeout(FIRE_LIMIT, said).await.expect("the child speaks").expect("reader");
    assert!(found, "the child took the recovery's locks");

    let failed_before = db.watch_read_failures();
    let _seen = trigger.watch(b"trigger");
    trigger.commit().await.expect("arm the trigger's watch");
    let armed = Instant::now();
    let first_failure = loop {
        if db.watch_read_failures() > failed_before {
            break Instant::now();
        }
        assert!(armed.elapsed() < FIRE_LIMIT, "the registration's look did not fail while the store was busy");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    tokio::time::sleep(BUSY_FOR).await;
    let failures = db.watch_read_failures() - failed_before;
    let busy = first_failure.elapsed();
    eprintln!("failed looks while busy for {busy:?}: {failures}");

    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "release").expect("tell the child");
    drop(stdin);
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("join").expect("the child exits");
    assert!(status.success(), "child: {status:?}");
    drop(lines);
    let released = Instant::now();
    tokio::time::timeout(FIRE_LIMIT, w)
        .await
        .expect("the watch fires once the store is readable again, not at the safety look")
        .expect("fired");
    let late = released.elapsed();
    eprintln!("fired {late:?} after the recovery's locks went");
    assert!(late <= AFTER_RELEASE, "fired {late:?} after the store was readable again");
    // Retried, but not in a loop: a look every millisecond would be 500.
    assert!(failures >= 2, "the failed look was retried while busy: {failures} failed looks in {busy:?}");
    assert!(failures <= 100, "the watcher spun while the store was busy: {failures} failed looks in {busy:?}");
    db.close();
}
