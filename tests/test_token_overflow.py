"""Token counts too large to be counts: the store's ``Nullable(UInt64)`` trial columns refused a
trial whose token sum passed 2^64 − 1 (three model calls of 2^63 − 1 tokens, or one of a 30-digit
decimal string), and after its strikes the whole trial was dropped as unstorable — its spans
acknowledged and stored, its run gone from every metric. A count past ``MAX_COUNT`` (2^53 − 1,
the largest integer a float64 holds exactly) is now unknown, per span and for a trial's sum (flag
``token_count_overflow``); the trial is stored."""

from __future__ import annotations

import json
import time

import pytest

from relyscope.collector.normalize._values import as_int
from relyscope.config import Settings
from relyscope.model import MAX_COUNT
from relyscope.pipeline import Pipeline
from relyscope.store import Store

T0 = 1_764_000_000_000_000_000


def _span(tid: str, sid: str, parent: str, name: str, attrs: dict) -> dict:
    return {"traceId": tid, "spanId": sid, "parentSpanId": parent, "name": name,
            "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 10**9),
            "attributes": [{"key": k, "value": v} for k, v in attrs.items()]}


def _run(tid: str, agent: str, inputs: list[dict]) -> list[dict]:
    root = _span(tid, "a" * 16, "", f"invoke_agent {agent}", {
        "gen_ai.operation.name": {"stringValue": "invoke_agent"}, "gen_ai.agent.name": {"stringValue": agent},
        "relyscope.task.id": {"stringValue": agent}, "relyscope.outcome": {"stringValue": "success"}})
    chats = [_span(tid, f"{i + 1:016x}", "a" * 16, "chat m", {
        "gen_ai.operation.name": {"stringValue": "chat"}, "gen_ai.request.model": {"stringValue": "m"},
        "gen_ai.usage.input_tokens": v, "gen_ai.usage.output_tokens": {"intValue": "5"}})
        for i, v in enumerate(inputs)]
    return [root, *chats]


RUNS = {  # agent: (input_tokens values of its model calls, expected (input, output, total), flagged)
    "int64-max": ([{"intValue": str(2**63 - 1)}] * 3, (None, 15, None), False),
    "digits": ([{"stringValue": "9" * 30}], (None, 5, None), False),
    "sum-past": ([{"intValue": str(2**52)}] * 2, (None, 10, None), True),  # 2^53 > 2^53 - 1
    "at-max": ([{"intValue": str(2**53 - 6)}], (2**53 - 6, 5, 2**53 - 1), False),
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    spans = [s for i, (agent, (inputs, _, _)) in enumerate(RUNS.items())
             for s in _run(f"{i + 1:032x}", agent, inputs)]
    store = Store(f"chdb://{d}/data", database="tok")
    st = Settings(store=store.dsn, spool_dir=str(d / "spool"), grace_period_s=0.0, quarantine_after_s=0)
    p = Pipeline(st, store, clock=lambda: 1_000.0)
    try:
        p.accept(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode(), "application/json")
        deadline = time.monotonic() + 30
        while (p.stats.trials_finalized + p.stats.rejected["trials_unstorable"] < len(RUNS)
               and time.monotonic() < deadline):
            p._work_once()
            time.sleep(0.2)
        yield p.stats, {t.agent_name: t for t in store.load_trials()}
    finally:
        p.spool.close()
        store.close()


def test_every_trial_is_stored(stored):
    stats, trials = stored
    assert stats.rejected["trials_unstorable"] == 0
    assert sorted(trials) == sorted(RUNS)


@pytest.mark.parametrize("agent", RUNS)
def test_token_sums_unknown_past_max_count(stored, agent):
    _, trials = stored
    t = trials[agent]
    _, expected, flagged = RUNS[agent]
    assert (t.input_tokens, t.output_tokens, t.total_tokens) == expected
    assert ("token_count_overflow" in t.flags) is flagged


@pytest.mark.parametrize("value, expected", [
    (2**53 - 1, 2**53 - 1), (2**53, None), (-1, None), (float(2**53), None), (float(2**52), 2**52),
    ("9007199254740991", 2**53 - 1), ("9007199254740992", None), (" 12 ", 12), ("0" * 40 + "1", 1), ("1" + "0" * 16, None),
])
def test_as_int_bounds(value, expected):
    assert MAX_COUNT == 9_007_199_254_740_991  # 2^53 - 1
    assert as_int(value) == expected
