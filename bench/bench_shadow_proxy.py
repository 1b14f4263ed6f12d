"""Shadow replays: tool-proxy latency per tool call and replay scheduling overhead per trial.

A real ``relyscope serve`` process (embedded chDB) with this script as its replay target: a
``ReplayApp`` served by uvicorn in a thread of this process, whose agent makes ``--calls`` tool
calls through the ``tool_call`` wrapper and times each. The production run it replays made the
same calls for real, so every replayed call is answered by an exact match (nominal family: no
injected delay).

Figures, each with its baseline measured in the same run:

- per tool call: the direct call (the decorated tool outside a replay, OTel SDK span included)
  vs the same call answered by the sidecar's proxy over loopback HTTP (p50 / p99);
- per replay: the wall time the sidecar needs to plan, dispatch and record one replay minus the
  time the agent spent inside it (scheduling overhead), vs the agent's own time.

Command: ``.venv/bin/python bench/bench_shadow_proxy.py`` (``--calls 400 --replays 40``; ~1 min).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relyscope.instrumentation import agent_run, configure, tool_call  # noqa: E402
from relyscope.instrumentation.replay import ReplayApp  # noqa: E402
from relyscope.testing import start_sidecar, wait_for_replays  # noqa: E402

LAT: list[float] = []
AGENT_S: list[float] = []


@tool_call("lookup", side_effect="read")
def lookup(i: int) -> dict:
    return {"i": i, "value": i * 2}


def agent_body(n: int, record: bool) -> None:
    t_run = time.perf_counter()
    with agent_run("bench-agent", task_id="bench-task", version="1.0", input="look things up"):
        for i in range(n):
            t0 = time.perf_counter()
            lookup(i)
            if record:
                LAT.append(time.perf_counter() - t0)
    if record:
        AGENT_S.append(time.perf_counter() - t_run)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400, help="tool calls per run")
    ap.add_argument("--replays", type=int, default=40, help="replays timed for the scheduling overhead")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    sc = start_sidecar(tmp, extra_env={
        "RELYSCOPE_SHADOW_TARGETS": json.dumps({"1.0": f"http://127.0.0.1:{port}/relyscope/replay"}),
        "RELYSCOPE_SHADOW_RATE": "0", "RELYSCOPE_SHADOW_FAMILIES": '["nominal"]', "RELYSCOPE_SHADOW_K": "1",
        "RELYSCOPE_SHADOW_CONCURRENCY": "1", "RELYSCOPE_SHADOW_INTERVAL_S": "0.2"})
    tp = configure(sc.otlp_grpc, service_name="bench", set_global=True)
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(ReplayApp(lambda task: agent_body(a.calls, True), tracer_provider=tp),
                                           host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        # baseline: the direct call, wrapper and span included
        direct = []
        for _ in range(3):
            with agent_run("bench-agent", task_id="bench-task", version="1.0", input="look things up"):
                for i in range(a.calls):
                    t0 = time.perf_counter()
                    lookup(i)
                    direct.append(time.perf_counter() - t0)
        # production runs to replay: the calls above were real
        tp.force_flush()
        sc.flush()
        prod = [t["trial_id"] for t in sc.trials(run_kind="production")]
        # proxy latency: one replay of one production run
        r = sc.post("/api/v1/shadow/replays", json={"trial_ids": prod[:1]}).json()
        wait(sc, r["replay_ids"])
        proxied = list(LAT)
        # scheduling overhead: replays of short runs (1 call each)
        LAT.clear()
        AGENT_S.clear()
        a.calls = 1
        with agent_run("bench-agent", task_id="short", version="1.0", input="short"):
            pass
        for _ in range(a.replays):
            agent_body(1, False)
        tp.force_flush()
        sc.flush()
        short = [t["trial_id"] for t in sc.trials(run_kind="production") if t["trial_id"] not in prod][:a.replays]
        t0 = time.perf_counter()
        r = sc.post("/api/v1/shadow/replays", json={"trial_ids": short}).json()
        wait(sc, r["replay_ids"])
        wall = time.perf_counter() - t0
        n = len(r["replay_ids"])
        agent_total = sum(AGENT_S)
        print(json.dumps({
            "tool_call_direct_us": {"p50": pct(direct, 0.5) * 1e6, "p99": pct(direct, 0.99) * 1e6, "n": len(direct)},
            "tool_call_proxied_us": {"p50": pct(proxied, 0.5) * 1e6, "p99": pct(proxied, 0.99) * 1e6,
                                     "n": len(proxied)},
            "proxy_added_p50_us": (pct(proxied, 0.5) - pct(direct, 0.5)) * 1e6,
            "replays": n, "replay_wall_ms_per_trial": wall / n * 1e3,
            "agent_ms_per_replay": agent_total / max(1, len(AGENT_S)) * 1e3,
            "scheduling_overhead_ms_per_trial": (wall - agent_total) / n * 1e3,
            "mean_direct_us": statistics.mean(direct) * 1e6,
        }, indent=2))
    finally:
        server.should_exit = True
        th.join(10)
        tp.shutdown()
        sc.kill()


def wait(sc, ids: list[str], timeout_s: float = 300) -> None:
    wait_for_replays(sc, ids, timeout_s, poll_s=0.05)


if __name__ == "__main__":
    main()
