#!/usr/bin/env python3
"""The table of bench/ab.sh: per workload and figure, the median of each
side's reps and the after/before ratio (> 1 means a larger figure after:
better for jobs/s, worse for times and CPU)."""
import json
import statistics
import sys

FIGURES = {
    "J1": ["jobs_per_s"],
    "J1b": ["jobs_per_s"],
    "J2": ["jobs_per_s", "cpu_us_per_job"],
    "J2n": ["jobs_per_s"],
    "J3": ["p50_ms", "p99_ms"],
    "M2": ["p50_ms", "p99_ms"],
    "M3": ["max_ms"],
}


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| workload | figure | before (median) | after (median) | after / before | reps before / after |")
    print("| --- | --- | --- | --- | --- | --- |")
    for workload, figures in FIGURES.items():
        for figure in figures:
            side = {
                s: [r[figure] for r in rows if r.get("workload") == workload and r["side"] == s and figure in r]
                for s in ("before", "after")
            }
            if not side["before"] or not side["after"]:
                continue
            before, after = statistics.median(side["before"]), statistics.median(side["after"])
            ratio = after / before if before else float("nan")
            print(
                f"| {workload} | {figure} | {before:,.3f} | {after:,.3f} | {ratio:.3f} |"
                f" {len(side['before'])} / {len(side['after'])} |"
            )


if __name__ == "__main__":
    main(sys.argv[1])
