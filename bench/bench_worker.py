"""The sidecar worker's stored rate, in process: spool record → decode → redact → store → assemble.

Builds a :class:`relyscope.pipeline.Pipeline` on an embedded chDB store in a temporary directory
(no receivers, no scorer thread), spools ``--requests`` requests of 512 GenAI-like spans
(``bench_ingest.template``, unique trace ids per request) through ``Pipeline.accept`` (not timed),
then times the worker's own loop (``Pipeline._work_once`` until the queue is empty, then finalizing
every trace and storing the trials) — the same code the worker thread runs. Reports stored spans/s
and the raw upb parse rate of the same payload in the same run (ratio), for the decode path given
by ``--decoder`` (``fast``: the columnar hot path, ``legacy``: decode_http + normalize, the oracle).
``--profile`` prints the top of a cProfile of the timed loop instead.

Run: ``.venv/bin/python bench/bench_worker.py [--requests 40] [--decoder fast|legacy|both] [--profile]``
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
from bench_ingest import SPANS, template, upb_rate, variant  # noqa: E402

from relyscope.config import Settings  # noqa: E402
from relyscope.pipeline import Pipeline  # noqa: E402
from relyscope.store import Store  # noqa: E402

PB = "application/x-protobuf"


def run(root: Path, decoder: str, n_req: int, profile: bool) -> float:
    """Stored spans/s of the worker loop with ``decoder`` (one database per run: chDB opens one
    data directory per process)."""
    store = Store(f"chdb://{root}/data", database=f"bench_{decoder}")
    try:
        kw = {"ingest_decoder": decoder} if "ingest_decoder" in Settings.model_fields else {}
        st = Settings(store=store.dsn, spool_dir=str(root / f"spool-{decoder}"), grace_period_s=0.0,
                      score_interval_s=3600, **kw)
        p = Pipeline(st, store)
        tmpl = template()
        for k in range(n_req):
            p.accept(variant(tmpl, k), PB)
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        while not p._queue_empty():
            p._work_once()
        p._finalize_all()
        if prof:
            prof.disable()
        dt = time.perf_counter() - t0
        n = store.count_spans()
        assert n == n_req * SPANS, (n, n_req * SPANS)
        if prof:
            ps = pstats.Stats(prof)
            ps.sort_stats("tottime").print_stats(30)
            ps.sort_stats("cumulative").print_stats(45)
            ps.print_callers("builtins.any|iterencode")
        p.spool.close()
        return n / dt
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--decoder", default="both", help="fast, legacy or both")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    body = variant(template(), 0)
    raw1 = upb_rate(body, SPANS, 2.0)
    names = ["legacy", "fast"] if args.decoder == "both" else [args.decoder]
    rates = {}
    root = Path(tempfile.mkdtemp(prefix="relyscope-bw-"))
    try:
        for name in names:
            rates[name] = run(root, name, args.requests, args.profile)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw2 = upb_rate(body, SPANS, 2.0)
    raw = (raw1 + raw2) / 2
    print(f"raw upb FromString: {raw1:,.0f} / {raw2:,.0f} spans/s (before/after; mean {raw:,.0f}); "
          f"{args.requests} requests x {SPANS} spans; load avg {os.getloadavg()[0]:.2f}")
    for name, r in rates.items():
        print(f"worker stored, decoder {name:<6}: {r:10,.0f} spans/s  (ratio to raw parse {r / raw:.4f})")
    if len(rates) == 2:
        print(f"fast / legacy: {rates['fast'] / rates['legacy']:.2f}x")


if __name__ == "__main__":
    main()
