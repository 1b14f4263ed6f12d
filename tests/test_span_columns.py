"""``SpanColumns`` built in one pass (``add_all``, the hot path since issue 13) holds exactly the
rows of ``add`` per span, and attribute values keep their stored text: the reference for JSON
values is the stdlib's ``json.dumps`` with the options the store always used."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from relyscope.model import CanonicalSpan, SpanEvent
from relyscope.store.clickhouse import SpanColumns, _attr_str, _json_default


def _reference_json(v) -> str:
    return json.dumps(v, default=_json_default, ensure_ascii=False)


def _spans() -> list[CanonicalSpan]:
    res_a = {"service.name": "svc", "n": 3, "ok": True}
    res_b = {"service.version": "2"}  # no service.name: stored ""
    return [
        CanonicalSpan("a" * 32, "1" * 16, "", "root", 1, 100, 200, 1, "", {"k": "v", "i": 7, "f": 0.5},
                      res_a, "scope", "1.0", (), (), "ts", frozenset({"missing_kind", "empty_attribute"}), None, 0),
        CanonicalSpan("a" * 32, "2" * 16, "1" * 16, "chat", 3, 110, 150, 2, "boom",
                      {"l": ["stop"], "d": {"x": [1, None]}, "b": b"\x01\xff"}, res_a, "scope", "1.0",
                      (SpanEvent("e1", 120, {"s": 0.9}), SpanEvent("e2", 130, {})),
                      (("b" * 32, "3" * 16), ("c" * 32, "4" * 16)), "", frozenset(), 170, 2),
        CanonicalSpan("d" * 32, "5" * 16, "", "other", 9, 0, 0, 5, "", {}, res_b, "", "", (), (), "",
                      frozenset({"missing_start"}), -1, 0),
        CanonicalSpan("d" * 32, "6" * 16, "", "copy", 2, 5, 6, 0, "", {"k": None}, dict(res_a), "s2", "",
                      (SpanEvent("e3", 6, {"k": [1, "a"]}),), (), "", frozenset(), 0, 0),
    ]


def test_add_all_equals_add_per_span():
    spans = _spans()
    one = SpanColumns()
    for s in spans:
        one.add(s)
    batch = SpanColumns()
    batch.add_all(spans)
    assert batch == one
    # by hand, a few cells: kinds and statuses by name, service from the resource, flags sorted
    assert batch.kind == ["Internal", "Client", "Unspecified", "Server"]
    assert batch.status == ["Ok", "Error", "Unset", "Unset"]
    assert batch.service == ["svc", "svc", "", "svc"]
    assert batch.flags == ["empty_attribute", "missing_kind", "missing_start"]
    assert batch.flag_n == [2, 0, 1, 0]
    assert batch.raw_end == [None, 170, None, 0]
    assert batch.res_v[:3] == ["svc", "3", "true"]
    assert batch.attr_v == ["v", "7", "0.5", '["stop"]', '{"x": [1, null]}', "01ff", ""]
    assert batch.ev_n == [0, 2, 0, 1] and batch.ev_attr_v == ["0.9", '[1, "a"]']
    # appending to a non-empty one keeps the earlier rows
    batch.add_all(spans[:1])
    one.add(spans[0])
    assert batch == one


def test_attribute_text_of_lists_and_maps_is_the_stdlib_json():
    cases = [["stop"], ["tool_calls", "length"], [], ['say "hi"'], ["a\\b"], ["line\nbreak"], ["tab\t"],
             ["é ✓ 中"], ["\x7f"], ["\u2028"], ["a\ud800"], [1, "a"], ["a", None], [["x"]], [True],
             {"k": ["v"]}, {"n": {"m": 1.5}}, [b"\x00"], [frozenset({"b", "a"})]]
    for v in cases:
        assert _attr_str(v) == _reference_json(v), v


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(), max_size=6))
def test_string_lists_fuzz(v):
    assert _attr_str(v) == _reference_json(v)


def test_scalars():
    assert [_attr_str(v) for v in ("s", True, False, 0, -3, 2 ** 70, 1.0, 1e16, float("nan"), b"\x0a", None)] == [
        "s", "true", "false", "0", "-3", "1180591620717411303424", "1.0", "1e+16", "nan", "0a", ""]

    class Flag(int):
        pass

    assert _attr_str(Flag(4)) == "4"
