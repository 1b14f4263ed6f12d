"""Where the worker loop's time goes per stored span (cProfile, in process; scorer not running).

Spools ``--requests`` batches of 512 spans (``bench_ingest.template``/``variant``: 32 whole traces
per request) into a fresh embedded-chDB pipeline, then runs ``Pipeline._work_once`` in this thread
under cProfile until everything is stored and every trace finalized, pinned to core 0. Prints
stored spans/s of the loop and the top functions by cumulative time, in µs per span.

Run: ``.venv/bin/python bench/bench_worker_profile.py [--requests 40] [--top 25]``
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import SPANS, template, variant  # noqa: E402

from relyscope.config import Settings  # noqa: E402
from relyscope.pipeline import Pipeline  # noqa: E402
from relyscope.store import Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    root = Path(tempfile.mkdtemp(prefix="relyscope-prof-"))
    try:
        dsn = f"chdb://{root}/data"
        store = Store(dsn)
        p = Pipeline(Settings(store=dsn, spool_dir=str(root / "spool"), grace_period_s=0), store)
        tmpl = template()
        for k in range(args.requests):
            p.accept(variant(tmpl, k), "application/x-protobuf")
        n = args.requests * SPANS
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        while not p._queue_empty():
            p._work_once()
        p._finalize_all()
        prof.disable()
        wall = time.perf_counter() - t0
        print(f"{n} spans stored and assembled in {wall:.2f} s under cProfile: {n / wall:,.0f} spans/s "
              f"({wall / n * 1e6:.0f} us/span; profiling overhead included), load avg {os.getloadavg()[0]:.1f}")
        st = pstats.Stats(prof)
        rows = []
        for (file, line, fn), (cc, nc, tt, ct, callers) in st.stats.items():
            rows.append((ct, tt, nc, f"{Path(file).name}:{line} {fn}"))
        rows.sort(reverse=True)
        print(f"{'cumulative us/span':>18} {'own us/span':>12} {'calls':>9}  function")
        for ct, tt, nc, name in rows[:args.top]:
            print(f"{ct / n * 1e6:18.1f} {tt / n * 1e6:12.1f} {nc:9d}  {name}")
        p.spool.close()
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
