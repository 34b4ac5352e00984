//! Child processes of the multi-process tests: the test binary itself,
//! re-executed to run one test, told its role through its environment.

use std::ffi::OsStr;
use std::process::{Child, Command, Stdio};

/// Starts this binary running only `test`, with `env` set.
pub fn spawn(test: &str, env: &[(&str, &OsStr)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn child process")
}

/// Waits for `child` and fails unless it succeeded having run exactly
/// its one test (a filter that matched nothing also exits 0).
// Not every test binary that includes this module waits this way.
#[allow(dead_code)]
pub fn wait(child: Child, what: &str) {
    let out = child.wait_with_output().expect("child output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed: {:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{what} ran no test:\n{stdout}");
}
