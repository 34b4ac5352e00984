"""Medians of one alternating run of bench/peers.sh, as a Markdown table.

Reads the peers' JSON lines and couch_workers' (bench/run) lines of the same
run and prints, per workload, couch_workers' median, each peer's median and
the ratio in the direction where more than 1 means couch_workers is ahead.
"""

import json
import statistics
import sys

# workload -> (figure, higher_is_better, unit)
FIGURES = {
    "J1": ("jobs_per_s", True, "jobs/s"),
    "J1b": ("jobs_per_s", True, "jobs/s"),
    "J2": ("jobs_per_s", True, "jobs/s"),
    "J3": ("p99_ms", False, "ms p99"),
    "M2": ("p99_ms", False, "ms p99"),
    "M3": ("max_ms", False, "ms max"),
}


def read_lines(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    except FileNotFoundError:
        pass
    return rows


def medians(rows, key_of):
    by = {}
    for row in rows:
        workload = row.get("workload")
        if workload not in FIGURES:
            continue
        figure = FIGURES[workload][0]
        if not isinstance(row.get(figure), (int, float)):
            continue
        by.setdefault((key_of(row), workload), []).append(row[figure])
    return {k: (statistics.median(v), len(v)) for k, v in by.items()}


def fmt(value):
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def main(peers_path, couch_path, run_id):
    peers = medians(read_lines(peers_path), lambda r: r.get("peer", "?"))
    couch = medians(read_lines(couch_path), lambda r: "couch_workers")
    peer_names = sorted({name for name, _ in peers})
    print(f"Run {run_id}: medians of the reps (n = reps counted); ratio > 1 means couch_workers is ahead.\n")
    print("| workload | couch_workers | " + " | ".join(f"{p} | ratio" for p in peer_names) + " |")
    print("| --- | --- | " + " | ".join("--- | ---" for _ in peer_names) + " |")
    for workload, (figure, higher, unit) in FIGURES.items():
        ours = couch.get(("couch_workers", workload))
        if ours is None:
            continue
        cells = [f"{fmt(ours[0])} {unit} (n={ours[1]})"]
        for peer in peer_names:
            theirs = peers.get((peer, workload))
            if theirs is None:
                cells += ["", ""]
                continue
            ratio = ours[0] / theirs[0] if higher else theirs[0] / ours[0]
            cells += [f"{fmt(theirs[0])} (n={theirs[1]})", f"{ratio:.2f}×"]
        print(f"| {workload} | " + " | ".join(cells) + " |")
    j2_bound(read_lines(couch_path), peers)


def j2_bound(couch_rows, peers):
    """What bounds J2, from the same run: our CPU per job, SQLite's own
    time for J2's writes (J2sqlite: bench/sqlite_replay.sh) and the rate
    that 2x the fastest peer's J2 asks for."""
    best = max((v[0] for (peer, w), v in peers.items() if w == "J2"), default=None)
    cpu = [r["cpu_us_per_job"] for r in couch_rows if r.get("workload") == "J2" and "cpu_us_per_job" in r]
    replay = {}
    for r in couch_rows:
        if r.get("workload") == "sqlite_replay":
            replay.setdefault(r.get("variant"), []).append(r)
    if best is None or not (cpu or replay):
        return
    print(f"\nJ2's bound in this run: 2x the fastest peer's J2 is {fmt(2 * best)} jobs/s, "
          f"{2e6 / (2 * best):.1f} us of CPU per job with both cores busy.")
    if cpu:
        print(f"- couch_workers' J2 used {statistics.median(cpu):.0f} us of CPU per job (whole VM, n={len(cpu)}).")
    for variant, rows in sorted(replay.items()):
        us = statistics.median(r["sqlite_us_per_job"] for r in rows)
        ceiling = statistics.median(r["ceiling_jobs_per_s"] for r in rows)
        commits = statistics.median(r["commits_per_job"] for r in rows)
        print(f"- SQLite alone, J2's writes replayed ({variant}, {commits:.3f} commits per job): "
              f"{us:.1f} us per job, at most {fmt(ceiling)} jobs/s ({ceiling / best:.2f}x the fastest peer; n={len(rows)}).")


if __name__ == "__main__":
    main(*sys.argv[1:4])
