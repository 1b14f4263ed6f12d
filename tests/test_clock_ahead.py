"""Trials stamped after the sidecar's clock (an agent host whose clock runs ahead, a bogus year
2100): every live window ends now with no upper bound, so such a trial counted in the 5m and 1h
gauges until its stamped end — 75 years for 2100. A trial ending more than
``RELYSCOPE_MAX_CLOCK_AHEAD_S`` after the wall clock at assembly is now placed at that time
(start, end and steps shifted back alike, flag ``clock_ahead``, counted); its spans keep their
times. A trial ahead by less is left alone."""

from __future__ import annotations

import json
import time

import pytest

from prometheus_client import generate_latest

from relyscope.config import Settings
from relyscope.exporter.prom import build_registry
from relyscope.pipeline import Pipeline
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.store import Store

YEAR_2100_NS = 4_102_444_800 * 10**9
G = ("skewed", "1.0", "production")


def _run(tid: str, task: str, end_ns: int) -> list[dict]:
    """A root agent span of 10 s and one model call from +2 s to +5 s, ending at ``end_ns``."""
    start = end_ns - 10 * 10**9

    def span(sid, parent, name, t0, t1, attrs):
        return {"traceId": tid, "spanId": sid, "parentSpanId": parent, "name": name,
                "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t1),
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]}

    return [span("a" * 16, "", "invoke_agent skewed", start, end_ns,
                 {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": G[0], "gen_ai.agent.version": G[1],
                  "relyscope.task.id": task, "relyscope.outcome": "success"}),
            span("b" * 16, "a" * 16, "chat m", start + 2 * 10**9, start + 5 * 10**9,
                 {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    d = tmp_path_factory.mktemp("ahead")
    now_ns = time.time_ns()
    runs = {"far": YEAR_2100_NS, "hour": now_ns + 3600 * 10**9, "near": now_ns + 20 * 10**9,
            "past": now_ns - 60 * 10**9}
    spans = [s for i, (task, end) in enumerate(runs.items()) for s in _run(f"{i + 1:032x}", task, end)]
    store = Store(f"chdb://{d}/data", database="ahead")
    st = Settings(store=store.dsn, spool_dir=str(d / "spool"), grace_period_s=0.0)
    p = Pipeline(st, store, clock=lambda: 1_000.0)
    try:
        p.accept(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode(), "application/json")
        deadline = time.monotonic() + 30
        while p.stats.trials_finalized < len(runs) and time.monotonic() < deadline:
            p._work_once()
            time.sleep(0.1)
        done_ns = time.time_ns()
        yield p, store, runs, now_ns, done_ns
    finally:
        p.spool.close()
        store.close()


def _trials(store):
    return {t.task_id: t for t in store.load_trials()}


@pytest.mark.parametrize("task", ["far", "hour"])
def test_trial_ahead_is_placed_at_its_assembly(sidecar, task):
    _, store, runs, now_ns, done_ns = sidecar
    t = _trials(store)[task]
    assert now_ns <= t.end_ns <= done_ns  # ended when assembled, not in 2100 / in an hour
    assert t.end_ns - t.start_ns == 10 * 10**9  # the duration (C_res, wall-time budgets) unchanged
    (step,) = t.steps
    assert (step.start_ns - t.start_ns, step.end_ns - t.start_ns) == (2 * 10**9, 5 * 10**9)
    assert "clock_ahead" in t.flags
    # the spans keep the times they were sent with
    spans = store.load_spans([t.trace_id])
    assert max(s.end_ns for s in spans) == runs[task]


@pytest.mark.parametrize("task", ["near", "past"])
def test_trial_within_the_tolerance_keeps_its_times(sidecar, task):
    _, store, runs, _, _ = sidecar
    t = _trials(store)[task]
    assert (t.start_ns, t.end_ns) == (runs[task] - 10 * 10**9, runs[task])
    assert "clock_ahead" not in t.flags


def test_counted_on_metrics(sidecar):
    p = sidecar[0]
    text = generate_latest(build_registry(p)).decode()
    assert "\nrelyscope_trials_clock_ahead_total 2.0\n" in text


def test_a_trial_ahead_leaves_the_5m_window(sidecar):
    """In the 5m window now, out of it seven minutes later (it stayed until 2100; a window starts
    at a whole minute, up to one earlier)."""
    _, store, _, now_ns, _ = sidecar
    ru = Rollup(store, None)
    ru.sync()
    now = now_ns / 1e9
    inside = ru.window_stats(G, window_start(now + 1, 300), 300, trajectories=False).task_ids
    later = ru.window_stats(G, window_start(now + 420, 300), 300, trajectories=False).task_ids
    assert sorted(inside) == ["far", "hour", "near", "past"]
    assert list(later) == []
