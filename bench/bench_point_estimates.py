"""Benchmark: the point estimates of one scoring cycle, alone (issue 9).

On a copy of a store seeded by ``bench_live_scoring.py --seed-only`` (10⁶ trials, 10 groups,
10 000 tasks), one :class:`relyscope.scoring.stage.ScoreStage` loads every window (the first
cycle), then ``--reps`` times: ~100 tasks of every (group, window) are marked changed (their
C_res and C_traj are recomputed, as after a cycle's 1 000 new trials), and the point estimates of
all 50 windows are made as a cycle makes them (``LiveStats.stats(points_only=True)``, then
``score_stats(n_boot=0)``). Prints the seconds of the 50, median and min over the reps. Run it
at two commits on the same seed to compare (the reps' random picks are seeded: same work)::

    .venv/bin/python bench/bench_live_scoring.py --stored 1000000 --seed-only /tmp/seed1m
    .venv/bin/python bench/bench_point_estimates.py --data /tmp/seed1m
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from relyscope.config import Settings  # noqa: E402
from relyscope.scoring.stage import ScoreStage  # noqa: E402
from relyscope.scoring.stats import score_stats  # noqa: E402
from relyscope.store import Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="a directory seeded by bench_live_scoring.py --seed-only")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--changed", type=int, default=100, help="tasks per window marked changed before each rep")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-points-")
    try:
        shutil.copytree(args.data, f"{tmp}/s", symlinks=True)  # chDB's metadata links stay links
        dsn = f"chdb://{tmp}/s/data"
        store = Store(dsn)
        stage = ScoreStage(Settings(store=dsn, score_ci_background=False), store, None)
        t0 = time.perf_counter()
        stage.rescore(all_groups=True)
        print(f"first cycle (load every window, every CI) {time.perf_counter() - t0:.1f} s", flush=True)
        live = stage.live()
        keys = [(g, n) for g in sorted(live.groups()) for n, _ in live._windows_of(g)]
        rng = random.Random(3)
        times = []
        for _ in range(args.reps):
            for g, n in keys:
                ws = live.window(g, n)
                _, rows = ws.live_rows()
                pick = np.array(sorted(rng.sample(range(len(rows)), min(args.changed, len(rows)))), dtype=np.int64)
                ws.cres_ok[rows[pick]] = False
                ws.tj_ok[rows[pick]] = False
            t0 = time.perf_counter()
            for g, n in keys:
                st = live.stats(g, n, trajectories=False, points_only=True)
                score_stats(st, safety_measured=False, n_boot=0, seed=0, max_k=stage.settings.max_k)
            times.append(time.perf_counter() - t0)
        print(f"{len(keys)} point estimates: median {statistics.median(times):.3f} s, min {min(times):.3f} s "
              f"({', '.join(f'{x:.3f}' for x in times)})")
        stage.close()
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
