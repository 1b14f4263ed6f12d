"""Backlog replay after a restart vs live ingest, stored spans/s (issue 10 item 10).

A real sidecar is started with the store "down" (``RELYSCOPE_FAULT_STORE_DOWN_FILE``), takes a
backlog of ``--requests`` OTLP/JSON requests (``--traces`` whole 5-span agent runs each) into its
spool, and is stopped; the fault is removed and the sidecar restarted: the time until the spool is
drained gives the replay rate. Then the same number of fresh spans is posted to the running
sidecar and the time until all are stored gives the live rate (same process, same store size).

First ``--populate`` requests are stored (a populated store). Run:
``.venv/bin/python bench/bench_replay.py [--requests 60 --traces 40 --populate 150]`` (~1 minute).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from test_durability import make_trace, otlp_json, trace_id_of  # noqa: E402

from relyscope.testing import start_sidecar  # noqa: E402


def _metric(sc, name: str) -> float:
    for line in sc.get("/metrics").text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def _bodies(tag: int, n_req: int, n_traces: int) -> list[bytes]:
    out = []
    for r in range(n_req):
        spans = []
        for t in range(n_traces):
            spans += make_trace(trace_id_of(tag, r, t), task=f"t{t % 10}")
        out.append(otlp_json(spans))
    return out


def _post_all(sc, bodies: list[bytes]) -> None:
    with httpx.Client() as c:
        for b in bodies:
            r = c.post(sc.otlp_http + "/v1/traces", content=b, headers={"content-type": "application/json"}, timeout=60)
            assert r.status_code == 200, r.text


def _stored(sc) -> int:
    return sc.get("/api/v1/spans").json()["spans"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--traces", type=int, default=40)
    ap.add_argument("--populate", type=int, default=150, help="requests stored before the backlog")
    a = ap.parse_args()
    n_spans = a.requests * a.traces * 5
    d = Path(tempfile.mkdtemp(prefix="relyscope-replay-"))
    down = d / "down"
    env = {"RELYSCOPE_FAULT_STORE_DOWN_FILE": str(down), "RELYSCOPE_SCORE_INTERVAL_S": "3600"}
    sc = start_sidecar(d, extra_env=env)
    _post_all(sc, _bodies(50, a.populate, a.traces))  # a populated store
    while _stored(sc) < a.populate * a.traces * 5:
        time.sleep(0.1)
    populated = _stored(sc)
    down.touch()
    _post_all(sc, _bodies(100, a.requests, a.traces))
    sc.kill(signal.SIGTERM)
    down.unlink()
    t_start = time.monotonic()
    sc = start_sidecar(d, extra_env=env)
    t0 = time.monotonic()
    left = _metric(sc, "relyscope_spool_pending_records") / a.requests * n_spans  # still to replay
    try:
        while _metric(sc, "relyscope_spool_pending_records") > 0:
            time.sleep(0.05)
        replay_s = time.monotonic() - t0
        base = _stored(sc)
        bodies = _bodies(200, a.requests, a.traces)
        t1 = time.monotonic()
        _post_all(sc, bodies)
        while _stored(sc) < base + n_spans:
            time.sleep(0.05)
        live_s = time.monotonic() - t1
    finally:
        sc.kill(signal.SIGTERM)
    print(f"store of {populated} spans, backlog of {n_spans} spans; start took {t0 - t_start:.1f} s, {left:.0f} spans were left to replay "
          f"once listening: {left / replay_s:,.0f} spans/s; live, {n_spans} spans: {n_spans / live_s:,.0f} spans/s")


if __name__ == "__main__":
    main()
