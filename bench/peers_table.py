"""Medians of one alternating run of bench/peers.sh, as a Markdown table.

Reads the peers' JSON lines and couch_workers' (bench/run) lines of the same
run and prints, per workload and per store of couch_workers (embedded, fdb:
the "store" field of bench/run's lines; embedded when absent), couch_workers'
median, each peer's median and the ratio in the direction where more than 1
means couch_workers is ahead, and the ratio to the fastest peer.
"""

import json
import statistics
import sys

# workload -> (figure, higher_is_better, unit)
FIGURES = {
    "J1": ("jobs_per_s", True, "jobs/s"),
    "J1b": ("jobs_per_s", True, "jobs/s"),
    "J2": ("jobs_per_s", True, "jobs/s"),
    "J2n": ("jobs_per_s", True, "jobs/s"),
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
    couch_rows = read_lines(couch_path)
    couch = medians(couch_rows, lambda r: r.get("store", "embedded"))
    stores = [s for s in STORES if any(k[0] == s for k in couch)]
    stores += sorted({k[0] for k in couch} - set(stores))
    peer_names = sorted({name for name, _ in peers})
    print(f"Run {run_id}: medians of the reps (n = reps counted); ratio > 1 means couch_workers is ahead; "
          "best peer: the ratio to the fastest peer of the row's workload.\n")
    head = ["workload", "store", "couch_workers"] + [c for p in peer_names for c in (p, "ratio")] + ["best peer"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for workload, (figure, higher, unit) in FIGURES.items():
        theirs_all = [peers[(p, workload)][0] for p in peer_names if (p, workload) in peers]
        best = (max if higher else min)(theirs_all) if theirs_all else None
        for store in stores:
            ours = couch.get((store, workload))
            if ours is None:
                continue
            cells = [f"{fmt(ours[0])} {unit} (n={ours[1]})"]
            for peer in peer_names:
                theirs = peers.get((peer, workload))
                if theirs is None:
                    cells += ["", ""]
                    continue
                cells += [f"{fmt(theirs[0])} (n={theirs[1]})", f"{ratio(ours[0], theirs[0], higher):.2f}×"]
            cells.append("" if best is None else f"{ratio(ours[0], best, higher):.2f}×")
            print(f"| {workload} | {store} | " + " | ".join(cells) + " |")
    j2x_table(couch_rows)
    j2_bound([r for r in couch_rows if r.get("store", "embedded") == "embedded"], peers)


# Stores in this order first (any other after them).
STORES = ["embedded", "fdb"]


def ratio(ours, theirs, higher):
    if higher:
        return ours / theirs if theirs else float("inf")
    return theirs / ours if ours else float("inf")


def j2x_table(couch_rows):
    """J2x (bench/run): per store and node count, the medians of jobs/s
    and of the store's conflicts per accepted job."""
    by = {}
    for r in couch_rows:
        if r.get("workload") != "J2x" or "rows" not in r:
            continue
        for row in r["rows"]:
            by.setdefault((r.get("store", "embedded"), row["nodes"]), []).append(row)
    if not by:
        return
    print("\nJ2x: one queue drained by 1, 2, 4 nodes (medians; conflicts, retries and transactions "
          "per accepted job, every node's store counters summed).\n")
    print("| store | nodes | workers | jobs/s | conflicts/job | retries/job | transactions/job | failed tx | not_found while pending | n |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (store, nodes), rows in sorted(by.items()):
        med = lambda k: statistics.median(x[k] for x in rows)
        print(f"| {store} | {nodes} | {rows[0]['workers']} | {fmt(med('jobs_per_s'))} | {med('conflicts_per_job'):.3f} | "
              f"{med('retries_per_job'):.3f} | {med('transactions_per_job'):.2f} | {med('failures'):g} | "
              f"{statistics.median(sum(x.get('not_found_while_pending_by_node', [0])) for x in rows):g} | {len(rows)} |")


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
