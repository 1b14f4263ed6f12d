"""CPU of one incremental scoring cycle per new trial, beside the worker's per span (issue 13).

The scorer shares the sidecar's core with the worker: in ``bench_ingest.py --phases worker`` the
stored rate with the scorer every 5 s was about half the rate with it idle. This measures the
cycle alone, in process: a ``Pipeline`` on embedded chDB (no receivers, no scorer thread),
``--rounds`` rounds of ``--requests`` × 512 spans of ``bench_ingest.template()`` (32 traces of 16
spans per request: 32 trials) spooled, stored and finalized by the worker loop, then one
``ScoreStage.rescore()`` — the cycle the scorer thread runs, folding the new trials into the
rollups. Printed per round: the worker's process CPU per span, the cycle's wall time and its
process CPU per new trial (chDB's threads included). Round 0 pays one-off costs (imports, the
first sync of an empty store): read rounds 1 on. ``--base DIR``: an older checkout of the package
(``git archive <rev> relyscope | tar -x -C DIR``); ``--profile``: cProfile of the last cycle.

Run: ``.venv/bin/python bench/bench_scoring_cycle.py [--requests 32] [--rounds 4] [--base DIR]``
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--base" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--base") + 1])
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import SPANS, template, variant  # noqa: E402

import relyscope  # noqa: E402
from relyscope.config import Settings  # noqa: E402
from relyscope.pipeline import Pipeline  # noqa: E402
from relyscope.store import Store  # noqa: E402

TRIALS_PER_REQUEST = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32, help="requests of 512 spans per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--base", help="directory holding an older relyscope package")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rs-cycle-"))
    store = Store(f"chdb://{root}/data", database="bench")
    st = Settings(store=store.dsn, spool_dir=str(root / "spool"), grace_period_s=0.0, score_interval_s=3600)
    p = Pipeline(st, store)
    tmpl, k = template(), 0
    per_trial: list[float] = []
    try:
        for r in range(args.rounds):
            for _ in range(args.requests):
                p.accept(variant(tmpl, k), "application/x-protobuf")
                k += 1
            c0 = time.process_time()
            while not p._queue_empty():
                p._work_batch()
            p._finalize_all()
            n = args.requests * SPANS
            worker = (time.process_time() - c0) / n * 1e6
            trials = args.requests * TRIALS_PER_REQUEST
            prof = cProfile.Profile() if args.profile and r == args.rounds - 1 else None
            t0, c0 = time.perf_counter(), time.process_time()
            if prof:
                prof.enable()
            p.scoring.rescore()
            if prof:
                prof.disable()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if r:
                per_trial.append(cpu / trials * 1e3)
            print(f"round {r}: worker {worker:.1f} us/span CPU; cycle {wall:.2f} s wall, {cpu / trials * 1e3:.3f} ms "
                  f"CPU per new trial ({cpu / n * 1e6:.1f} us per stored span)")
            if prof:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        if per_trial:
            print(f"{Path(relyscope.__file__).parent}: cycle CPU per new trial, median of rounds 1+: "
                  f"{statistics.median(per_trial):.3f} ms")
    finally:
        p.shutdown()
        store.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
