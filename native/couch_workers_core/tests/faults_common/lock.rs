//! Another OS process holding the store's SQLite write lock: the test
//! binary re-executes itself, running one test (the *entry*) in the
//! holder's role. That test must begin with
//! `if lock::serve_if_holder() { return; }`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::FILE_NAME;

pub const ROLE: &str = "CW_FAULTS_ROLE";
pub const ROLE_DIR: &str = "CW_FAULTS_DIR";
pub const ROLE_MODE: &str = "CW_FAULTS_MODE";
pub const ROLE_TAG: &str = "CW_FAULTS_TAG";

/// Another OS process (this test binary, re-executed) that opens the
/// store's file with plain SQLite, takes its write lock (`BEGIN
/// IMMEDIATE`, or the whole file with `locking_mode=EXCLUSIVE`), writes
/// `locker/<tag>`, says `LOCKED`, and holds the lock until told `commit`
/// or `rollback` on its standard input, or until it is killed.
pub struct LockHolder {
    child: Child,
    /// The child's standard output, line by line (read by a thread, so
    /// that a silent child cannot hang the test).
    lines: std::sync::mpsc::Receiver<String>,
}

/// The command that runs `entry` of this binary as a lock holder.
pub fn holder_command(entry: &str, dir: &Path, mode: &str, tag: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env(ROLE, "lock-holder")
        .env(ROLE_DIR, dir)
        .env(ROLE_MODE, mode)
        .env(ROLE_TAG, tag);
    cmd
}

impl LockHolder {
    /// Starts a holder through the test `entry`; returns once it holds the
    /// lock.
    pub fn spawn(entry: &str, dir: &Path, mode: &str, tag: &str) -> LockHolder {
        let mut child = holder_command(entry, dir, mode, tag)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the lock holder");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let holder = LockHolder { child, lines };
        // libtest prints `test <name> ... ` first, on the same line.
        let line = holder.wait_line(&["LOCKED", "LOCK-FAILED"]);
        assert!(line.ends_with("LOCKED"), "the lock holder could not take the lock: {line}");
        holder
    }

    /// The next line that contains one of `marks`, within 10 s.
    pub fn wait_line(&self, marks: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if marks.iter().any(|m| line.contains(m)) => return line,
                Ok(_) => continue,
                Err(e) => panic!("the lock holder said none of {marks:?} within 10 s ({e})"),
            }
        }
    }

    /// Tells it to end its transaction and exit; waits for the exit.
    pub fn release(mut self, how: &str) {
        let mut stdin = self.child.stdin.take().expect("stdin");
        writeln!(stdin, "{how}").expect("tell the lock holder");
        drop(stdin);
        self.wait_line(&["RELEASED"]);
        let status = self.child.wait().expect("the lock holder exits");
        assert!(status.success(), "lock holder: {status:?}");
    }

    /// `kill -9` while it holds the lock.
    pub fn kill(mut self) {
        self.child.kill().expect("kill -9 the lock holder");
        let _ = self.child.wait();
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        // Never leave a lock holder behind (a failed assertion).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In the entry test: when this process is a lock holder, holds the lock
/// (see [`LockHolder`]) and returns true; the test then returns at once.
pub fn serve_if_holder() -> bool {
    if std::env::var(ROLE).as_deref() != Ok("lock-holder") {
        return false;
    }
    hold_lock();
    true
}

/// The child's side of [`LockHolder`].
fn hold_lock() {
    let dir = std::env::var(ROLE_DIR).expect("dir");
    let mode = std::env::var(ROLE_MODE).expect("mode");
    let tag = std::env::var(ROLE_TAG).expect("tag");
    let take = || -> rusqlite::Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open(Path::new(&dir).join(FILE_NAME))?;
        conn.busy_timeout(if mode == "exclusive" { Duration::from_millis(300) } else { Duration::from_secs(5) })?;
        if mode == "exclusive" {
            conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        }
        conn.execute_batch("BEGIN IMMEDIATE")?;
        conn.execute(
            "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            rusqlite::params![format!("locker/{tag}").into_bytes(), b"1".to_vec()],
        )?;
        if mode == "exclusive" {
            // In exclusive mode the file lock is taken for good at the
            // first write; make sure of it before saying so.
            conn.query_row("SELECT count(*) FROM kv", [], |r| r.get::<_, i64>(0))?;
        }
        Ok(conn)
    };
    let conn = match take() {
        Ok(conn) => conn,
        Err(e) => {
            println!("LOCK-FAILED {e}");
            return;
        }
    };
    println!("LOCKED");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let end = if line.trim() == "commit" { "COMMIT" } else { "ROLLBACK" };
    conn.execute_batch(end).expect("end the transaction");
    drop(conn);
    println!("RELEASED");
}
