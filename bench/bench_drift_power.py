"""Benchmark: detection power and false-alarm rate of the drift test (metrics.md §10), by simulation.

Traffic: ``--tasks`` tasks whose success probabilities p_t are drawn from Beta(7, 3) (mean 0.70);
each trial picks a task uniformly. The reference window holds 24 h of traffic at ``rate`` trials
per hour, the current window 1 h. *Stable*: the current hour has the same p_t; *drop*: every p_t
lowered by ``--drop`` (0.10, clipped at 0). Each replication runs
:func:`relyscope.scoring.drift.drift` (the sidecar's code) on the two windows' per-task statistics
and records whether ``success_rate`` is flagged (CI excludes 0 and |Δ| > threshold).

Prints, per hourly rate, the flag rate under stable traffic (false alarms per evaluation) and
under the drop (power), with the number of trials in the current window, and a markdown table.

Usage: ``python bench/bench_drift_power.py [--reps 200] [--n-boot 500] [--rates 50,100,200,400]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from relyscope.scoring.drift import drift  # noqa: E402
from relyscope.scoring.stats import SUM_COLUMNS, TaskStats  # noqa: E402

_IDX = {name: i for i, (name, _) in enumerate(SUM_COLUMNS)}


def window(rng: np.random.Generator, p: np.ndarray, n_trials: int) -> TaskStats:
    """Per-task statistics of ``n_trials`` nominal valid trials (success only; the other sums 0)."""
    task = rng.integers(0, p.size, n_trials)
    y = rng.random(n_trials) < p[task]
    n = np.bincount(task, minlength=p.size)
    c = np.bincount(task, weights=y, minlength=p.size).astype(np.int64)
    keep = np.flatnonzero(n > 0)
    sums = np.zeros((keep.size, len(SUM_COLUMNS)), dtype=object)
    for col, vals in (("n_all", n), ("n", n), ("n_nom", n), ("c", c)):
        sums[:, _IDX[col]] = vals[keep].astype(object)
    return TaskStats([f"t{i:04d}" for i in keep], sums, [], [[] for _ in keep])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=500)
    ap.add_argument("--drop", type=float, default=0.10)
    ap.add_argument("--threshold", type=float, default=0.05)
    ap.add_argument("--rates", default="50,100,200,400")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    rows = []
    t0 = time.perf_counter()
    for rate in (int(r) for r in args.rates.split(",")):
        flags = {"stable": 0, "drop": 0}
        for rep in range(args.reps):
            p = rng.beta(7, 3, args.tasks)
            ref = window(rng, p, 24 * rate)
            for case, pc in (("stable", p), ("drop", np.clip(p - args.drop, 0, 1))):
                cur = window(rng, pc, rate)
                d = drift(cur, ref, safety_measured=False, threshold=args.threshold, n_boot=args.n_boot,
                          seed=rep, max_k=1)
                flags[case] += d["success_rate"].flagged
        fa, power = flags["stable"] / args.reps, flags["drop"] / args.reps
        rows.append((rate, fa, power))
        print(f"{rate} trials/h: false alarms {fa:.3f} per evaluation, power {power:.3f} "
              f"({args.reps} replications, B={args.n_boot})", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    print("| trials in the current hour | false-alarm rate (stable) | power (10-point drop) |")
    print("|---|---|---|")
    for rate, fa, power in rows:
        print(f"| {rate} | {fa:.3f} | {power:.3f} |")


if __name__ == "__main__":
    main()
