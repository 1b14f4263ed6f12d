"""The ``steps`` / ``evaluations`` JSON of stored trials (orjson since issue 13): every value a
step can hold round-trips through a real chDB store, the text is the JSON the stdlib writes for
the same objects (``json.loads`` of both equal), and what orjson refuses still stores. Expected
values are written out by hand or come from the stdlib ``json`` module."""

from __future__ import annotations

import json
import math

from relyscope.model import Evaluation, Op, Step, Trial
from relyscope.store.clickhouse import Store, _evaluations_json, _json_default, _step_to_dict, _steps_json


def _trial(tid: str, steps: tuple[Step, ...], evaluations=()) -> Trial:
    return Trial(trial_id=tid, trace_id="t" * 32, root_span_id="r" * 16, task_id="task", task_id_source="attribute",
                 agent_name="a", agent_version="1", run_kind="production", outcome="success",
                 outcome_source="attribute", outcome_score=None, claimed_success=None, confidence=None,
                 conversation_id=None, start_ns=1, end_ns=2, steps=steps, evaluations=tuple(evaluations))


def _step(**kw) -> Step:
    base = dict(span_id="s" * 16, parent_span_id="p" * 16, action="lookup", op=Op.TOOL, name="execute_tool lookup",
                start_ns=10, end_ns=20)
    base.update(kw)
    return Step(**base)


PLAIN = _step(tool_name="lookup", tool_call_id="call_1", arguments={"order_id": "#W0001", "n": [1, 2.5, None]},
              result={"status": "livré ✓", "ok": True}, flags=frozenset({"reattached", "client_side"}),
              cost_usd=0.0125, input_tokens=7, depth=2, side_effect="read")


def test_steps_text_is_the_stdlib_json_of_the_same_steps():
    steps = (PLAIN, _step(op=Op.LLM, action="llm", model="gpt-4o", result=b"\x00\xff", arguments=("a", 1)))
    want = json.loads(json.dumps([_step_to_dict(s) for s in steps], default=_json_default, ensure_ascii=False))
    got = json.loads(_steps_json(steps))
    assert got == want
    # by hand, for the first step: field order of Step, op as its value, flags sorted, bytes as hex
    assert list(got[0]) == ["span_id", "parent_span_id", "action", "op", "name", "start_ns", "end_ns", "depth",
                            "tool_name", "tool_call_id", "arguments", "result", "error", "decision", "side_effect",
                            "model", "input_tokens", "output_tokens", "cost_usd", "flags", "fault_type"]
    assert got[0]["op"] == "tool" and got[0]["flags"] == ["client_side", "reattached"]
    assert got[1]["result"] == "00ff" and got[1]["arguments"] == ["a", 1]
    assert _steps_json(()) == "[]"


def test_values_orjson_refuses_fall_back_to_the_stdlib():
    big = _step(arguments={"id": 2 ** 70})  # beyond 64 bits: orjson refuses, json writes it
    assert json.loads(_steps_json((big,)))[0]["arguments"] == {"id": 1180591620717411303424}
    keys = _step(arguments={1: "x", "k": {2: "y"}})  # non-string keys: json turns them into strings
    assert json.loads(_steps_json((keys,)))[0]["arguments"] == {"1": "x", "k": {"2": "y"}}
    lone = _step(result="a\ud800b")  # a lone surrogate: json keeps it (the insert repairs it)
    assert "a\ud800b" in _steps_json((lone,))


def test_non_finite_floats_are_null_not_a_json_extension():
    steps = (_step(arguments={"x": math.nan, "y": math.inf, "z": -math.inf, "w": 1.0}),)
    text = _steps_json(steps)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)[0]["arguments"] == {"x": None, "y": None, "z": None, "w": 1.0}


def test_evaluations_text():
    evs = (Evaluation("relevance", 0.9, "pertinent é", None), Evaluation("tone"))
    assert json.loads(_evaluations_json(evs)) == [
        {"name": "relevance", "score": 0.9, "label": "pertinent é", "explanation": None},
        {"name": "tone", "score": None, "label": None, "explanation": None}]
    assert _evaluations_json(()) == "[]"


def test_trials_round_trip_through_the_store(tmp_path):
    st = Store(f"chdb://{tmp_path / 'data'}")
    try:
        evs = (Evaluation("relevance", 0.9, "ok", "fine"),)
        st.insert_trials([
            _trial("plain", (PLAIN,), evs),
            _trial("big", (_step(arguments={"id": 2 ** 70}),)),
            _trial("lone", (_step(result="a\ud800b"),)),
            _trial("empty", ()),
        ])
        got = {t.trial_id: t for t in st.load_trials()}
        assert got["plain"].steps == (PLAIN,)
        assert got["plain"].evaluations == evs
        assert got["big"].steps[0].arguments == {"id": 1180591620717411303424}
        assert got["lone"].steps[0].result == "a\ufffdb"  # repaired to U+FFFD by the insert
        assert got["empty"].steps == () and got["empty"].evaluations == ()
    finally:
        st.close()


def test_reading_steps_written_by_orjson_does_not_use_the_stdlib(monkeypatch):
    """The scorer reads every new trial's steps: what orjson wrote is read back by orjson (the
    stdlib parser took ~2.5x as long); the values are the steps written."""
    from relyscope.store import clickhouse

    text = _steps_json((PLAIN, _step(op=Op.LLM, action="llm", start_ns=1_760_000_000_001_000_000,
                                     end_ns=2 ** 64 - 1, input_tokens=2 ** 63 - 1)))

    def refuse(*a, **k):
        raise AssertionError("json.loads used")

    monkeypatch.setattr(clickhouse.json, "loads", refuse)
    got = clickhouse._steps_from_json(text)
    assert got[0] == PLAIN
    assert (got[1].start_ns, got[1].end_ns, got[1].input_tokens) == (1760000000001000000, 18446744073709551615,
                                                                     9223372036854775807)
    assert got[1].op is Op.LLM and got[1].flags == frozenset()


def test_steps_written_by_the_stdlib_read_exactly():
    """Rows written by json.dumps (the fallback, and every version before orjson): integers beyond
    64 bits stay ints (orjson would read 2**70 as a float), NaN / Infinity literals are read, and
    objects with keys in another order or keys Step does not have still give the same Step."""
    from relyscope.store.clickhouse import _steps_from_json

    wide = _step(arguments={"id": 2 ** 70, "neg": -(2 ** 63) - 1})
    text = _steps_json((wide,))  # orjson refuses these ints: written by json.dumps
    assert not text.startswith('[{"span_id":"')
    got = _steps_from_json(text)[0].arguments
    assert got == {"id": 1180591620717411303424, "neg": -9223372036854775809}
    assert type(got["id"]) is int and type(got["neg"]) is int
    old = ('[{"op": "tool", "name": "execute_tool lookup", "span_id": "ss", "parent_span_id": "pp", '
           '"action": "lookup", "start_ns": 10, "end_ns": 20, "arguments": {"x": NaN, "y": -Infinity}, '
           '"flags": ["reattached"], "retired_field": 1}]')
    step = _steps_from_json(old)[0]
    assert (step.span_id, step.parent_span_id, step.op, step.start_ns, step.end_ns, step.depth) == (
        "ss", "pp", Op.TOOL, 10, 20, 1)
    assert math.isnan(step.arguments["x"]) and step.arguments["y"] == -math.inf
    assert step.flags == frozenset({"reattached"}) and step.cost_usd is None
