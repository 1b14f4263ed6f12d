"""The sidecar worker's stored rate, in process: spool record → decode → redact → store → assemble.

Builds a :class:`relyscope.pipeline.Pipeline` on an embedded chDB store in a temporary directory
(no receivers, no scorer thread), spools ``--requests`` requests of 512 GenAI-like spans
(``bench_ingest.template``, unique trace ids per request) through ``Pipeline.accept`` (not timed),
then times the worker's own loop (``Pipeline._work_once`` until the queue is empty, then finalizing
every trace and storing the trials) — the same code the worker thread runs. Reports stored spans/s
and the raw upb parse rate of the same payload in the same run (ratio), for the decode path given
by ``--decoder`` (``fast``: the columnar hot path, ``legacy``: decode_http + normalize, the oracle).
``--profile`` prints the top of a cProfile of the timed loop instead.

Both rates are reported: per wall second and per CPU second of this process (chDB's own threads
included), the best of ``--reps`` alternating runs each — on a shared machine the CPU figure is
the steadier one.

``--compare-base DIR`` also measures an older checkout of the package (``git archive <rev>
relyscope | tar -x -C DIR``) in a subprocess per rep, alternating with this checkout's runs.

Run: ``.venv/bin/python bench/bench_worker.py [--requests 40] [--reps 3] [--decoder fast|legacy|both]
[--compare-base DIR] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if "--base" in sys.argv:  # run an older checkout of the package (git archive <rev> relyscope | tar -x -C DIR)
    sys.path.insert(0, sys.argv[sys.argv.index("--base") + 1])
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import SPANS, template, upb_rate, variant  # noqa: E402

from relyscope.config import Settings  # noqa: E402
from relyscope.pipeline import Pipeline  # noqa: E402
from relyscope.store import Store  # noqa: E402

PB = "application/x-protobuf"


def run(root: Path, decoder: str, n_req: int, profile: bool, rep: int = 0) -> tuple[float, float]:
    """(stored spans per wall second, per CPU second of this process) of the worker loop with
    ``decoder`` (one database per run: chDB opens one data directory per process)."""
    store = Store(f"chdb://{root}/data", database=f"bench_{decoder}_{rep}")
    try:
        kw = {"ingest_decoder": decoder} if "ingest_decoder" in Settings.model_fields else {}
        st = Settings(store=store.dsn, spool_dir=str(root / f"spool-{decoder}-{rep}"), grace_period_s=0.0,
                      score_interval_s=3600, **kw)
        p = Pipeline(st, store)
        tmpl = template()
        for k in range(n_req):
            p.accept(variant(tmpl, k), PB)
        prof = cProfile.Profile() if profile else None
        c0 = time.process_time()
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        while not p._queue_empty():
            p._work_batch() if hasattr(p, "_work_batch") else p._work_once()
        p._finalize_all()
        if prof:
            prof.disable()
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        n = store.count_spans()
        assert n == n_req * SPANS, (n, n_req * SPANS)
        if prof:
            ps = pstats.Stats(prof)
            ps.sort_stats("tottime").print_stats(30)
            ps.sort_stats("cumulative").print_stats(45)
            ps.print_callers("builtins.any|iterencode")
        p.spool.close()
        return n / dt, n / cpu
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--decoder", default="both", help="fast, legacy or both")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reps", type=int, default=3, help="alternating runs per decoder; the best counts")
    ap.add_argument("--base", help="directory holding an older relyscope package: measure it instead")
    ap.add_argument("--compare-base", help="also measure the package in this directory (a subprocess per "
                    "rep, alternating with this checkout's runs)")
    args = ap.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    body = variant(template(), 0)
    raw1 = upb_rate(body, SPANS, 2.0)
    names = ["legacy", "fast"] if args.decoder == "both" else [args.decoder]
    if args.base:  # an older checkout: the decoder it is asked for (ignored by code before issue 13)
        names = [args.decoder if args.decoder != "both" else "legacy"]
    rates: dict[str, tuple[float, float]] = {}
    root = Path(tempfile.mkdtemp(prefix="relyscope-bw-"))
    # relyscope before 89b555d imported pandas on its first insert (clickhouse-connect, pyarrow;
    # a one-off, not per-span cost): imported here, outside the timing, so --base times the same work
    import pandas  # noqa: F401
    try:
        for rep in range(1 if args.profile else args.reps):
            if args.compare_base:
                # the base runs the default hot path (code before issue 13 has one path: same thing)
                out = subprocess.run([sys.executable, __file__, "--base", args.compare_base, "--reps", "1",
                                      "--requests", str(args.requests), "--decoder", "fast"],
                                     capture_output=True, text=True, check=True).stdout
                line = next(x for x in out.splitlines() if x.startswith("worker stored"))
                w, c = (float(x.replace(",", "")) for x in re.findall(r"([\d,]+) spans(?:/s| per)", line))
                best = rates.get("base", (0.0, 0.0))
                rates["base"] = (max(best[0], w), max(best[1], c))
            for name in names:
                wall, cpu = run(root, name, args.requests, args.profile, rep)
                best = rates.get(name, (0.0, 0.0))
                rates[name] = (max(best[0], wall), max(best[1], cpu))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw2 = upb_rate(body, SPANS, 2.0)
    raw = (raw1 + raw2) / 2
    print(f"raw upb FromString: {raw1:,.0f} / {raw2:,.0f} spans/s (before/after; mean {raw:,.0f}); "
          f"{args.requests} requests x {SPANS} spans; load avg {os.getloadavg()[0]:.2f}")
    for name, (w, c) in rates.items():
        print(f"worker stored, decoder {name:<6}: {w:10,.0f} spans/s wall (ratio to raw parse {w / raw:.4f}), "
              f"{c:10,.0f} spans per CPU second (ratio {c / raw:.4f})")
    for ref in ("legacy", "base"):
        if "fast" in rates and ref in rates:
            print(f"fast / {ref}: {rates['fast'][0] / rates[ref][0]:.2f}x wall, "
                  f"{rates['fast'][1] / rates[ref][1]:.2f}x CPU")


if __name__ == "__main__":
    main()
