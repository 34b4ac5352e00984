#!/usr/bin/env python3
"""Per-stage split of J3x or M2 from the stage stamps of a NIF built with
the `stage-trace` feature (native/couch_workers_core/src/stage.rs).

    COUCH_WORKERS_FEATURES=stage-trace scripts/build-nif.sh
    mkdir D; CW_STAGE_TRACE=D bench/run --no-build --only J3x
    bench/stages.py D J3x        # or M2

The two files in D are node A's (the watcher's) and node B's (the
writer's), told apart by B's `add_nif` (J3x) / A's `membership_sent` (M2). Each sample
ends at one stamp of the chain's last stage; every earlier stage is the
last stamp of its name at or before the one after it (B's stages in B's
file, A's in A's). Prints p50 / p99 in µs of each step.
"""
import bisect, glob, os, sys

CHAINS = {
    # (file, stage) steps
    "J3x": [("B", "add_nif"), ("B", "add_task_runs"), ("B", "commit_visible"), ("A", "wake_received"),
            ("A", "watcher_reads"), ("A", "watch_fired"), ("A", "dispatcher_woken"),
            ("A", "round_committed"), ("A", "reply_sent")],
    "J3x-B": [("B", "add_nif"), ("B", "add_task_runs"), ("B", "commit_visible"), ("B", "add_committed"), ("B", "reply_sent")],
    "M2": [("B", "commit_visible"), ("A", "wake_received"), ("A", "watcher_reads"), ("A", "watch_fired"),
           ("A", "membership_woken"), ("A", "membership_sent")],
}

def load(path):
    by = {}
    for line in open(path):
        ns, stage = line.split()
        by.setdefault(stage, []).append(int(ns))
    for v in by.values():
        v.sort()
    return by

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]

def main():
    d, which = sys.argv[1], sys.argv[2]
    files = [load(p) for p in glob.glob(os.path.join(d, "*.stages"))]
    # Only B adds jobs (J3x) or registers the timed workers (M2: the
    # collector's subscription is on A).
    b = [f for f in files if ("add_nif" in f) if which.startswith("J3x")] or [f for f in files if "membership_sent" not in f]
    a = [f for f in files if f not in b]
    if len(a) != 1 or len(b) != 1:
        sys.exit("expected one file of node A and one of node B")
    nodes = {"A": a[0], "B": b[0]}
    for chain_name in ([which] if which != "J3x" else ["J3x", "J3x-B"]):
        chain = CHAINS[chain_name]
        steps = {i: [] for i in range(1, len(chain))}
        total = []
        # Backwards from each last stage: every earlier stage is the last
        # stamp of its name at or before the one after it (so commits that
        # woke nobody, a heartbeat's, are never taken for a sample's).
        last_node, last_stage = chain[-1]
        starts = nodes[last_node].get(last_stage, [])
        if chain_name == "J3x":
            # A's replies also answer the worker's job_finish: only those
            # right after a round are accepts.
            rounds = nodes["A"].get("round_committed", [])
            starts = sorted({starts[i] for r in rounds if (i := bisect.bisect_left(starts, r)) < len(starts)})
        for t_end in starts:
            t, ok, ds = t_end, True, []
            for node, stage in reversed(chain[:-1]):
                xs = nodes[node].get(stage, [])
                i = bisect.bisect_right(xs, t)
                # A gap over 5 ms: another sample's stamp, not this one's.
                if i == 0 or t - xs[i - 1] > 5_000_000:
                    ok = False
                    break
                ds.append(t - xs[i - 1])
                t = xs[i - 1]
            if ok:
                for k, dv in enumerate(reversed(ds), 1):
                    steps[k].append(dv)
                total.append(t_end - t)
        print(f"{chain_name}: {len(total)} of {len(starts)} samples chained (µs, p50 / p99)")
        for k in range(1, len(chain)):
            if steps[k]:
                print(f"  {chain[k-1][1]:>18} -> {chain[k][1]:<18} {pct(steps[k],50)/1e3:8.1f} / {pct(steps[k],99)/1e3:8.1f}")
        if total:
            print(f"  {'whole chain':>40} {pct(total,50)/1e3:8.1f} / {pct(total,99)/1e3:8.1f}")

main()
