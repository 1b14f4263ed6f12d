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


def test_one_shift_per_trace_and_conversation():
    """Each trial was shifted on its own to end at 'now': two runs of one trace (and a nested run
    inside the first) all ended at the same instant — an outcome posted for the nested run went
    to the second run — and a conversation's three turns came out as turn 1, 3, 2. One shift for
    every trial linked by a trace or a conversation keeps their order and gaps (breaker round 2)."""
    import dataclasses

    from live_traffic import make_trial
    from relyscope.trajectory.clock import place_on_clock

    rng = __import__("random").Random(3)
    now, day = 2_000_000_000 * 10**9, 86_400 * 10**9

    def t(i, trace, start_s, end_s, conv=None, status="complete"):
        base = make_trial(rng, i, task="t", end_ns=now + day + int(end_s * 1e9))
        return dataclasses.replace(base, trace_id=trace, start_ns=now + day + int(start_s * 1e9),
                                   conversation_id=conv, status=status)

    r1, r2, c1 = t(1, "A", 0, 100), t(2, "A", 200, 250), t(3, "A", 10, 20, status="superseded")
    turns = [t(4, "B", 0, 30, "conv"), t(5, "C", 40, 50, "conv"), t(6, "D", 60, 80, "conv")]
    near = t(7, "E", 0, 1)
    near = dataclasses.replace(near, start_ns=now - 10**9, end_ns=now + 30 * 10**9)  # within 60 s: kept
    out, n = place_on_clock([r1, r2, c1, *turns, near], now, 60.0)
    o = {x.trial_id: x for x in out}
    shift = r2.end_ns - now  # the latest end of trace A lands on now
    for x in (r1, r2, c1):
        assert (o[x.trial_id].start_ns, o[x.trial_id].end_ns) == (x.start_ns - shift, x.end_ns - shift)
    assert o[c1.trial_id].start_ns >= o[r1.trial_id].start_ns and o[c1.trial_id].end_ns <= o[r1.trial_id].end_ns
    ends = [o[x.trial_id].end_ns for x in turns]
    assert ends == sorted(ends) and ends[-1] == now and ends[1] - ends[0] == 20 * 10**9
    assert o[near.trial_id] is near
    assert n == 5  # r1, r2 and the three turns; the tombstone is shifted but not counted
