"""Sidecar memory (RSS) against traffic, in-flight traces and stored trials (issue 10, item 6).

A real ``relyscope serve`` process (embedded chDB, pinned to core 0); this client on core 1.
Three curves, each starting from the idle RSS of the same process (the baseline of the run):

1. **traffic**: complete traces (roots included; ``bench_ingest_decode.build_request``, 512 spans
   = 32 traces per request) posted at a fixed request rate for ``--seconds``; RSS sampled every
   second — memory while spans flow in and trials are finalized, stored, evicted from the
   finalized-trace cache;
2. **stored trials**: after each traffic step the store holds more trials; RSS after the
   scoring cycles settle, per stored-trial count — scoring cost must not grow with history;
3. **in-flight traces**: children of ``--open`` traces whose roots never arrive (held until the
   root timeout): RSS per open trace.

Each ``--variant`` is a fresh sidecar with extra environment, run one after the other in the same
run (default: the defaults, then ``untuned`` = no glibc tuning: ``RELYSCOPE_MALLOC_ARENA_MAX=0``,
``RELYSCOPE_MALLOC_TRIM_INTERVAL_S=0``); each has its own idle baseline.

Command: ``.venv/bin/python bench/bench_memory.py`` (``--rate 20 --seconds 20 --steps 6
--open 5000``; about 10 minutes per variant on the shared 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import MARK, SPANS, Sidecar, load, template, wait_stored  # noqa: E402


def sample_rss(sc: Sidecar, stop: threading.Event, out: list) -> None:
    while not stop.wait(1.0):
        try:
            out.append(sc.status()["VmRSS"])
        except OSError:
            return


def paced(sc: Sidecar, tmpl: bytes, start_k: int, rate: float, seconds: float) -> int:
    """Post ``rate`` requests/s for ``seconds``; returns the next request number."""
    k = start_k
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        load(sc.http, tmpl, k, None, 1, max_requests=1)
        k += 1
        ahead = (k - start_k) / rate - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)
    return k


def pack_cost(n_req: int = 20) -> tuple[float, float, float]:
    """In this process: CPU µs per span of packing finalized traces (the builder's ``_pack``) and of
    ``decode_http`` (what the worker runs for every span) on the same requests; packed B/span."""
    from relyscope.collector.normalize import normalize
    from relyscope.collector.otlp import Limits, decode_http
    from relyscope.trajectory import TrajectoryBuilder
    from relyscope.trajectory import builder as tb

    tmpl = template()
    b = TrajectoryBuilder(grace_s=0, retain_s=1e9)
    n = 0
    t_dec = 0.0
    for k in range(n_req):
        body = tmpl.replace(MARK, k.to_bytes(4, "big"))
        t = time.process_time()
        res = decode_http(body, "application/x-protobuf", None, Limits())
        t_dec += time.process_time() - t
        n += len(res.spans)
        b.add(((s, normalize(s)) for s in res.spans), 0.0)
    b.poll(1.0)
    blobs = [tr.packed for tr in b._traces.values()]
    decoded = [tb._unpack(x) for x in blobs]
    t = time.process_time()
    for spans, emitted in decoded:
        tb._pack(spans, emitted)
    t_pack = time.process_time() - t
    return t_pack / n * 1e6, t_dec / n * 1e6, sum(map(len, blobs)) / n


def run_variant(root: Path, name: str, env: dict, a) -> list:
    """One sidecar with ``env``: idle, ``a.steps`` traffic steps, then in-flight traces. Rows of
    (phase, spans sent, trials stored, peak RSS KiB, RSS after KiB, cache bytes, evicted)."""
    sc = Sidecar(root / name, {"RELYSCOPE_ROOT_TIMEOUT_S": "1000000", "RELYSCOPE_N_BOOT": "2000",
                               "RELYSCOPE_SCORE_INTERVAL_S": "5", **env})
    rows = []
    try:
        time.sleep(3.0)
        idle = sc.status()["VmRSS"]
        rows.append(("idle", 0, 0, idle, idle, 0, 0))
        full = template()
        k = 0
        for step in range(a.steps):
            samples: list[int] = []
            stop = threading.Event()
            th = threading.Thread(target=sample_rss, args=(sc, stop, samples), daemon=True)
            th.start()
            k = paced(sc, full, k, a.rate, a.seconds)
            stop.set()
            th.join()
            wait_stored(sc, k * SPANS, 600)
            sc.sc.flush()
            time.sleep(max(6.0, a.settle))  # scoring cycles over the grown store
            after = sc.status()["VmRSS"]  # before asking anything more of the sidecar
            # a counter, not GET /api/v1/trials: listing every trial costs the measured process
            # memory that grows with the history (no late spans here: no trial is re-finalized)
            trials = int(sc.metric("relyscope_trials_finalized_total"))
            rows.append((f"traffic step {step + 1}", k * SPANS, trials, max(samples or [after]), after,
                         sc.metric("relyscope_finalized_cache_bytes"),
                         sc.metric("relyscope_finalized_traces_evicted_total")))
            print(name, rows[-1], flush=True)
        if a.open:
            kids = template(drop_roots=True)
            per_req = SPANS // 16
            n_req = -(-a.open // per_req)
            load(sc.http, kids, 10_000_000, None, 2, max_requests=n_req)
            deadline = time.monotonic() + 120
            while sc.metric("relyscope_open_traces") < n_req * per_req and time.monotonic() < deadline:
                time.sleep(1.0)
            open_tr = sc.metric("relyscope_open_traces")
            rss = sc.status()["VmRSS"]
            rows.append((f"+ {open_tr:.0f} in-flight traces", None, None, rss, rss, None, None))
    finally:
        sc.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=20, help="requests/s of 512 spans (32 traces each)")
    ap.add_argument("--seconds", type=float, default=20, help="traffic per step")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--settle", type=float, default=6.0, help="seconds after each step before RSS is read")
    ap.add_argument("--open", type=int, default=5000, help="in-flight traces (roots never sent; 0: skip)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME or NAME:KEY=VAL,KEY=VAL — a sidecar with that extra environment, run one after "
                         "the other in this run (default: 'defaults' and 'untuned' = no glibc tuning)")
    a = ap.parse_args()
    variants = a.variant or ["defaults", "untuned:RELYSCOPE_MALLOC_ARENA_MAX=0,RELYSCOPE_MALLOC_TRIM_INTERVAL_S=0"]
    pk, dec, per = pack_cost()
    print(f"packing finalized traces: {pk:.1f} us/span CPU vs decode_http {dec:.1f} us/span (ratio {pk / dec:.2f}); "
          f"{per:.0f} B/span packed", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    results = []
    for v in variants:
        name, _, kv = v.partition(":")
        env = dict(x.split("=", 1) for x in kv.split(",") if x)
        results.append((name, env, run_variant(root, name, env, a)))
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average at the end; 2 cores)")
    for name, env, rows in results:
        idle = rows[0][4]
        print(f"\n== {name} {env or ''}")
        print(f"{'phase':<28} {'spans sent':>11} {'trials stored':>14} {'peak RSS MiB':>13} {'RSS after MiB':>14} "
              f"{'over idle MiB':>14} {'cache MiB':>10} {'evicted':>9}")
        for ph, spans, trials, peak, after, cache, ev in rows:
            print(f"{ph:<28} {'' if spans is None else spans:>11} {'' if trials is None else trials:>14} "
                  f"{peak / 1024:>13.0f} {after / 1024:>14.0f} {(after - idle) / 1024:>14.0f} "
                  f"{'' if cache is None else f'{cache / 2**20:.1f}':>10} {'' if ev is None else f'{ev:.0f}':>9}")
        steps = [r for r in rows if r[0].startswith("traffic")]
        if len(steps) >= 3:
            half = steps[len(steps) // 2 - 1]
            last = steps[-1]
            per = (last[4] - half[4]) / max(1, last[2] - half[2]) * 1000
            print(f"RSS growth over the second half of the steps: {per / 1024:.1f} MiB per 1 000 stored trials")


if __name__ == "__main__":
    main()
