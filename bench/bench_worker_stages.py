"""Per-stage CPU of the worker loop per stored span, without a profiler's distortion.

Same setup as ``bench_worker.py`` (a ``Pipeline`` on embedded chDB, ``--requests`` × 512 spans
spooled through ``accept``, then ``_work_batch`` until everything is stored and finalized; core
0), with thin ``time.thread_time`` / ``time.process_time`` wrappers around the worker's stages
(``_take`` = decode + normalize + columns, the inserts, the builder's ``add`` / ``poll``) and a
``gc.callbacks`` timer. ``process`` includes chDB's own threads while the stage ran. The wrappers
cost ~0.1 µs per call (a few calls per batch: negligible).

``--workers N`` (N > 1) decodes in N processes as ``RELYSCOPE_DECODE_WORKERS`` does, with the
process on every core; ``wall`` then shows where the worker thread waits (its ``_take`` waits for
decoded results, the inserts for chDB) and the decode processes' CPU is reported beside it.

Run: ``.venv/bin/python bench/bench_worker_stages.py [--requests 40] [--workers 1] [--base DIR]``
(``--base``: an older checkout of the package, ``git archive <rev> relyscope | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import shutil
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


def _stat_cpu(path: str) -> tuple[str, float]:
    """(name, CPU seconds: utime + stime) of a ``/proc/.../stat`` file (fields 2, 14 and 15)."""
    with open(path) as f:
        raw = f.read()
    fields = raw.rsplit(")", 1)[1].split()
    return raw[raw.index("(") + 1:raw.rindex(")")], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu() -> collections.Counter:
    """CPU seconds so far of this process's threads by name (``/proc/self/task/*/stat``: chDB names
    its threads — MergeMutate, ThreadPool, …; Python's are ``python`` unless named)."""
    out: collections.Counter = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            name, cpu = _stat_cpu(f"/proc/self/task/{tid}/stat")
        except OSError:
            continue
        out["main thread" if int(tid) == os.getpid() else name] += cpu
    return out


def _warm(fn) -> None:
    """Warm-up task for a decode process: unpickling ``fn`` imports its modules; then hold the
    process so the next warm-up task goes to another one."""
    time.sleep(3.0)


def _children_cpu(p) -> float:
    """CPU seconds used so far by the pipeline's decode processes (utime + stime in /proc)."""
    if p._prefetch is None:
        return 0.0
    return sum(_stat_cpu(f"/proc/{pid}/stat")[1] for pid in p._prefetch.pool.pids())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--workers", type=int, default=1, help="decode processes (1: decode in the worker thread)")
    ap.add_argument("--base", help="directory holding an older relyscope package")
    args = ap.parse_args()
    if (os.cpu_count() or 1) > 1 and args.workers <= 1:
        os.sched_setaffinity(0, {0})
    # relyscope before 89b555d imported pandas on its first insert (clickhouse-connect, pyarrow;
    # a one-off, not per-span cost): imported here, outside the timing, so --base times the same work
    import pandas  # noqa: F401

    thread: collections.Counter = collections.Counter()
    proc: collections.Counter = collections.Counter()
    wall: collections.Counter = collections.Counter()

    def wrap(obj, name: str, label: str) -> None:
        f = getattr(obj, name)

        def timed(*a, **k):
            c, pc, w = time.thread_time(), time.process_time(), time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                thread[label] += time.thread_time() - c
                proc[label] += time.process_time() - pc
                wall[label] += time.perf_counter() - w

        setattr(obj, name, timed)

    gc_s = [0.0, 0.0]

    def on_gc(phase, info) -> None:
        if phase == "start":
            gc_s[1] = time.thread_time()
        else:
            gc_s[0] += time.thread_time() - gc_s[1]

    root = Path(tempfile.mkdtemp(prefix="relyscope-stages-"))
    try:
        store = Store(f"chdb://{root}/data", database="stages")
        p = Pipeline(Settings(store=store.dsn, spool_dir=str(root / "spool"), grace_period_s=0.0,
                              score_interval_s=3600, decode_workers=args.workers,
                              decode_timeout_s=60.0), store)
        tmpl = template()
        for k in range(args.requests):
            p.accept(variant(tmpl, k), "application/x-protobuf")
        for name in ("_take", "_rehydrate", "_commit_spool"):
            wrap(p, name, name)
        for name in ("insert_span_columns", "insert_spans", "insert_trials"):
            if hasattr(p.store, name):
                wrap(p.store, name, name)
        wrap(p.builder, "add", "builder.add")
        wrap(p.builder, "poll", "builder.poll")
        if args.workers > 1:  # as Pipeline.start() does, without starting its threads
            p._start_decoding()
            pool = p._prefetch.pool
            # warm, before the timing: every process spawned and its modules imported (~1 s of CPU
            # each: counted, it would add ~16 us/span to a 60 000-span run); a task that holds its
            # process 3 s makes each of the N tasks land in a different process
            for f in [pool._ex.submit(_warm, pool.fn) for _ in range(args.workers)]:
                f.result(timeout=120)
        gc.callbacks.append(on_gc)
        kids0 = _children_cpu(p)
        thr0 = _threads_cpu()
        c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
        while not p._queue_empty():
            p._work_batch() if hasattr(p, "_work_batch") else p._work_once()
        p._finalize_all()
        tot, ptot, wtot = time.thread_time() - c0, time.process_time() - p0, time.perf_counter() - w0
        kids = _children_cpu(p) - kids0
        thr = _threads_cpu()
        thr.subtract(thr0)
        gc.callbacks.remove(on_gc)
        n = args.requests * SPANS
        assert store.count_spans() == n
        print(f"{relyscope.__file__}: {n} spans, {args.workers} decode worker(s); {n / wtot:,.0f} spans/s "
              f"stored (wall {wtot / n * 1e6:.1f} us/span); worker thread {tot / n * 1e6:.1f} us/span, "
              f"process {ptot / n * 1e6:.1f} us/span ({n / ptot:,.0f} spans per CPU second); load avg "
              f"{os.getloadavg()[0]:.2f}")
        if args.workers > 1:
            print(f"  decode processes: {kids / n * 1e6:.1f} us/span of CPU (all {args.workers} together)")
            p._prefetch.pool.close()
        print(f"  {'stage':24s} {'thread us/span':>14s} {'process us/span':>16s} {'wall us/span':>13s}")
        for k, v in thread.most_common():
            print(f"  {k:24s} {v / n * 1e6:14.1f} {proc[k] / n * 1e6:16.1f} {wall[k] / n * 1e6:13.1f}")
        print(f"  {'cyclic GC':24s} {gc_s[0] / n * 1e6:14.1f}")
        print("  threads of the process, CPU us/span (clock ticks: ~0.16 us/span at this size):",
              ", ".join(f"{k} {v / n * 1e6:.1f}" for k, v in thr.most_common() if v > 0))
        print(f"  {'rest of the loop':24s} {(tot - sum(thread.values())) / n * 1e6:14.1f} {'':16s} "
              f"{(wtot - sum(wall.values())) / n * 1e6:13.1f}")
        p.spool.close()
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
