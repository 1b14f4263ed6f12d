"""Trials tied across traces by span links (issue 11: D03 handoff in a new trace, D21 evaluation
on a linked evaluator span), whatever order the traces arrive in. The builder is driven directly
(its clock is injected) with the spans of the shared case files, decoded and normalized as the
sidecar does."""

from __future__ import annotations

import json
import random

import pytest

from conftest import DATA
from relyscope.collector.normalize import normalize
from relyscope.collector.otlp import decode_json
from relyscope.trajectory.builder import SUPERSEDED, TrajectoryBuilder

CASES = DATA / "bugcases"


def _spans(name: str):
    body = json.loads(next(CASES.glob(f"{name}_*.json")).read_text())["requests"][0]["body"]
    return [(s, normalize(s)) for s in decode_json(json.dumps(body).encode()).spans]


def _live(trials):
    """Latest version of each trial key, tombstones dropped."""
    out = {}
    for t in trials:
        out[(t.trial_id, t.agent_name)] = t
    return [t for t in out.values() if t.status != SUPERSEDED]


@pytest.mark.parametrize("order", ["case", "continuation_first", "children_first", "shuffled"])
def test_d03_continuation_is_one_trial_in_any_arrival_order(order):
    items = _spans("D03")
    triage = [x for x in items if x[0].trace_id.startswith("0301")]
    billing = [x for x in items if x[0].trace_id.startswith("0302")]
    if order == "continuation_first":
        batches = [billing, triage]
    elif order == "children_first":  # the continuation's root (which holds the link) comes last
        batches = [billing[1:], triage, billing[:1]]
    elif order == "shuffled":
        xs = list(items)
        random.Random(3).shuffle(xs)
        batches = [[x] for x in xs]
    else:
        batches = [items]
    b = TrajectoryBuilder(grace_s=1, root_timeout_s=10, retain_s=100)
    out, now = [], 0.0
    for batch in batches:
        b.add(batch, now)
        now += 2  # past the grace period: provisional trials are finalized in between
        out += b.poll(now)
    out += b.flush(now)
    live = _live(out)
    assert len(live) == 1
    [t] = live
    assert t.trace_id.startswith("0301") and t.agent_name == "triage-agent" and t.task_id == "billing-42"
    assert t.actions[0] == "llm" and t.actions[2:] == ("llm", "issue_refund", "llm")
    assert t.outcome == "success" and "linked_continuation" in t.flags
    assert (t.input_tokens, t.output_tokens) == (1500, 120)


def test_d21_evaluation_arriving_after_the_run_was_finalized_regrades_it():
    items = _spans("D21")
    evaluator = [x for x in items if x[0].trace_id.startswith("2102")]
    runs = [x for x in items if not x[0].trace_id.startswith("2102")]
    b = TrajectoryBuilder(grace_s=1, root_timeout_s=10, retain_s=100)
    first = b.add(runs, 0.0) and b.poll(2.0)
    [t1] = [t for t in first if t.trace_id.startswith("2101")]
    assert t1.evaluations == () and t1.revision == 1
    b.add(evaluator, 3.0)
    again = b.poll(5.0)
    [t1b] = [t for t in again if t.trace_id.startswith("2101")]
    assert t1b.trial_id == t1.trial_id and t1b.revision == 2
    assert [(e.name, e.score) for e in t1b.evaluations] == [("task_success", 0.0)]
    assert "linked_evaluation" in t1b.flags
    assert not [t for t in again if t.trace_id.startswith("2102")]  # the evaluator is no trial
