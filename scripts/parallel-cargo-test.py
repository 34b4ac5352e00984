#!/usr/bin/env python3
"""Runs the test binaries of `cargo test ARGS` several at a time.

    scripts/parallel-cargo-test.py [--jobs N] CARGO_TEST_ARGS... [-- TEST_ARGS...]

cargo runs a package's test binaries one after another, and many of the
core crate's spend their time waiting (liveness timeouts, reapers, a
store's stall): on a 2-core machine three at a time take about half the
wall time. This builds them with `cargo test --no-run`, runs each in its
package's directory as cargo would (longest first, by the durations of the
last run kept in target/), prints each binary's result line as it ends,
then the doc tests through cargo. Fails, printing the whole output of each
failed binary, if any binary fails.
"""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed


def split_args(argv):
    jobs = int(os.environ.get("CW_TEST_JOBS", "3"))
    if argv[:1] == ["--jobs"]:
        jobs, argv = int(argv[1]), argv[2:]
    if "--" in argv:
        i = argv.index("--")
        return jobs, argv[:i], argv[i + 1:]
    return jobs, argv, []


def test_binaries(cargo_args):
    """(name, executable, package dir) of every test binary cargo builds."""
    subprocess.run(["cargo", "test", "--no-run", *cargo_args], check=True)
    out = subprocess.run(
        ["cargo", "test", "--no-run", "--message-format=json", *cargo_args],
        check=True, capture_output=True, text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        name = target["name"] if target["kind"] != ["lib"] else "lib"
        found.append((name, msg["executable"], os.path.dirname(msg["manifest_path"])))
    return found


def durations_file():
    """Where the last run's durations are kept (cargo's target directory)."""
    meta = subprocess.run(["cargo", "metadata", "--format-version=1", "--no-deps"],
                          check=True, capture_output=True, text=True).stdout
    return os.path.join(json.loads(meta)["target_directory"], "parallel-cargo-test-durations.json")


def run_one(name, exe, cwd, test_args):
    start = time.monotonic()
    proc = subprocess.run([exe, *test_args], cwd=cwd, capture_output=True, text=True)
    return name, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def result_line(output):
    lines = [l for l in output.splitlines() if l.startswith("test result: ")]
    return lines[-1] if lines else "no result line"


def main():
    jobs, cargo_args, test_args = split_args(sys.argv[1:])
    binaries = test_binaries(cargo_args)
    if not binaries:
        print("parallel-cargo-test: no test binary", file=sys.stderr)
        return 1
    path = durations_file()
    try:
        with open(path) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    binaries.sort(key=lambda b: -known.get(b[0], 1e9))
    failed = []
    took = {}
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_one, name, exe, cwd, test_args) for name, exe, cwd in binaries]
        for fut in as_completed(futures):
            name, code, output, secs = fut.result()
            took[name] = secs
            print(f"{secs:7.1f}s  {name}: {result_line(output)}", flush=True)
            if code != 0:
                failed.append((name, output))
    with open(path, "w") as f:
        json.dump({**known, **took}, f)
    for name, output in failed:
        print(f"\n==> FAILED: {name}\n{output}", file=sys.stderr)
    print(f"==> {len(binaries)} test binaries, {jobs} at a time, in {time.monotonic() - start:.0f} s; "
          f"{len(failed)} failed")
    if failed:
        return 1
    return subprocess.run(["cargo", "test", "--doc", *cargo_args, "--", *test_args]).returncode


if __name__ == "__main__":
    sys.exit(main())
