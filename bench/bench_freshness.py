"""Benchmark: freshness of the live gauges — span end → the trial counted on ``/metrics`` (issue 9).

Starts a real ``relyscope serve`` subprocess (embedded chDB store in a temporary directory,
loopback ports, ``--interval`` score interval, ``--grace`` grace period, B = ``--n-boot``), posts
``--rate`` root spans per second (one trace each, one agent, ``--tasks`` tasks, OTLP/HTTP JSON in
requests of ``--batch`` spans, span end = the moment of the post) for ``--seconds``, and polls
``/metrics`` every ``--poll`` s. The trial count of the agent's ``window="all"`` group
(``relyscope_group_trials``, valid + invalid + incomplete) tells how many trials are visible: the
freshness of the i-th span is the first poll at which at least i trials show, minus its end time
(trials are finalized in about the order their roots ended; this count-based matching is exact
when they are). Prints p50 / p90 / p99 / max and the load.

    .venv/bin/python bench/bench_freshness.py --rate 50 --seconds 60

What it includes: the grace period (a root is finalized ``grace`` s after it ends, to absorb late
spans), the worker's store write, the wait for the next scoring cycle, the cycle itself, and the
poll granularity. ``--stored N`` first seeds N historical trials (10 groups) by SQL, as
bench_live_scoring.py does, so the cycles run against a history.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relyscope.testing import start_sidecar  # noqa: E402


def _span(i: int, end_ns: int, tasks: int) -> dict:
    return {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "invoke_agent fresh", "kind": 1,
            "startTimeUnixNano": str(end_ns - 200_000_000), "endTimeUnixNano": str(end_ns),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "gen_ai.agent.name", "value": {"stringValue": "fresh"}},
                           {"key": "relyscope.task.id", "value": {"stringValue": f"t{i % tasks}"}},
                           {"key": "relyscope.outcome", "value": {"stringValue": "success" if i % 4 else "failure"}}]}


def _visible(text: str) -> int:
    n = 0
    for line in text.splitlines():
        if line.startswith("relyscope_group_trials{") and 'agent="fresh"' in line and 'window="all"' in line:
            n += int(float(line.rsplit(" ", 1)[1]))
    return n


def _seed(data_dir: Path, stored: int) -> None:
    from bench_live_scoring import seed_sql

    from relyscope.scoring.rollup import Rollup
    from relyscope.store import Store

    store = Store(f"chdb://{data_dir}/data")
    Rollup(store)
    now = int(time.time())
    for sql in seed_sql(stored, 10, 10_000, now):
        with store._lock:
            store._ready_client().command(sql.replace("{db}", store.db))
    wm = (now - 9 * 86400) * 10**9 + (stored - 1) * (8 * 86400 * 10**9 // stored)
    store._insert("scoring_state", [["trials_wm", wm, 1], ["outcomes_wm", 0, 1], ["judge_wm", 0, 1]],
                  ["name", "value", "updated_ns"])


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50.0, help="root spans (trials) per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--batch", type=int, default=10, help="spans per OTLP request")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--interval", type=float, default=10.0, help="RELYSCOPE_SCORE_INTERVAL_S")
    ap.add_argument("--grace", type=float, default=5.0, help="RELYSCOPE_GRACE_PERIOD_S")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--poll", type=float, default=0.2)
    ap.add_argument("--stored", type=int, default=0, help="historical trials seeded first (10 groups)")
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-fresh-"))
    if args.stored:
        t0 = time.perf_counter()
        _seed(data, args.stored)
        print(f"seeded {args.stored} trials in {time.perf_counter() - t0:.1f} s", flush=True)
    sc = start_sidecar(data, extra_env={"RELYSCOPE_SCORE_INTERVAL_S": str(args.interval),
                                        "RELYSCOPE_GRACE_PERIOD_S": str(args.grace),
                                        "RELYSCOPE_N_BOOT": str(args.n_boot)}, timeout_s=300)
    if args.stored:  # wait for the first cycle (every window of the history loaded and scored)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 600 and 'agent="agent0"' not in sc.get("/metrics").text:
            time.sleep(1)
        print(f"first cycle done after {time.monotonic() - t0:.0f} s", flush=True)
    ends: list[int] = []
    seen: list[tuple[float, int]] = []  # (poll time ns, trials visible)
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                try:
                    n = _visible(c.get(sc.api + "/metrics").text)
                except httpx.HTTPError:
                    n = -1
                if n >= 0:
                    seen.append((time.time_ns(), n))
                stop.wait(args.poll)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        total = int(args.rate * args.seconds)
        t_start = time.monotonic()
        with httpx.Client(timeout=30) as c:
            i = 0
            while i < total:
                due = t_start + i / args.rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                now = time.time_ns()
                spans = [_span(i + j, now, args.tasks) for j in range(min(args.batch, total - i))]
                r = c.post(sc.otlp_http + "/v1/traces", content=json.dumps(
                    {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}),
                    headers={"Content-Type": "application/json"})
                if r.status_code != 200:
                    raise RuntimeError(f"OTLP post {r.status_code}: {r.text[:200]}")
                ends += [now] * len(spans)
                i += len(spans)
        deadline = time.monotonic() + 3 * args.interval + args.grace + 60
        while time.monotonic() < deadline and (not seen or seen[-1][1] < len(ends)):
            time.sleep(0.5)
    finally:
        stop.set()
        poller.join(10)
        rss = _rss_kib(sc.proc.pid)
        sc.kill()
    fresh = []
    k = 0
    for i, end in enumerate(ends):
        while k < len(seen) and seen[k][1] < i + 1:
            k += 1
        if k == len(seen):
            break
        fresh.append((seen[k][0] - end) / 1e9)
    print(f"load: {args.rate:g} trials/s for {args.seconds:g} s ({len(ends)} trials, {args.batch} per request, "
          f"{args.tasks} tasks), score interval {args.interval:g} s, grace {args.grace:g} s, B = {args.n_boot}, "
          f"stored history {args.stored}; visible {len(fresh)}/{len(ends)}; sidecar RSS at the end "
          f"{rss / 1024:.0f} MiB")
    print(f"freshness span end → counted on /metrics: p50 {pct(fresh, 50):.2f} s, p90 {pct(fresh, 90):.2f} s, "
          f"p99 {pct(fresh, 99):.2f} s, max {max(fresh, default=float('nan')):.2f} s")
    print(f"| {args.rate:g}/s | {args.interval:g} s | {args.grace:g} s | {args.stored:,} | {pct(fresh, 50):.2f} s | "
          f"{pct(fresh, 99):.2f} s | {max(fresh, default=float('nan')):.2f} s |")


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    main()
