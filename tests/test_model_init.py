"""The model's frozen dataclasses keep the dataclass contract under their faster ``__init__``
(relyscope.model._fast_init): the expected values below are what the stdlib's own generated
``__init__`` gives — a reference dataclass built from the same fields, never this module's output."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from relyscope.model import CanonicalSpan, Evaluation, Op, SpanEvent, SpanSemantics, Step, Trial

CLASSES = (SpanEvent, CanonicalSpan, Evaluation, SpanSemantics, Step, Trial)


def _reference(cls: type) -> type:
    """A stdlib frozen slotted dataclass with the same fields (the generated ``__init__``)."""
    spec = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            spec.append((f.name, f.type, dataclasses.field(default=f.default)))
        elif f.default_factory is not dataclasses.MISSING:
            spec.append((f.name, f.type, dataclasses.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, f.type))
    return dataclasses.make_dataclass("Ref" + cls.__name__, spec, frozen=True, slots=True)


def _fields(obj) -> tuple:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_init_is_fast_and_signature_unchanged(cls):
    ref = _reference(cls)
    assert "_osa" in cls.__init__.__code__.co_names  # the fast __init__ is installed
    got = inspect.signature(cls)
    want = inspect.signature(ref)
    assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == [
        (p.name, p.kind, p.default) for p in want.parameters.values()]


def test_values_defaults_and_factories_as_the_stdlib_init():
    args = ("a" * 32, "b" * 16, "", "chat", 3, 10, 20)
    got, want = CanonicalSpan(*args), _reference(CanonicalSpan)(*args)
    assert type(got) is CanonicalSpan
    assert _fields(got) == _fields(want) == args + (0, "", {}, {}, "", "", (), (), "", frozenset(), None, 0)
    # a default factory gives a fresh object per instance
    assert got.attributes is not CanonicalSpan(*args).attributes
    kw = dict(op=Op.TOOL, tool_name="t", input_tokens=7, finish_reasons=("stop",))
    assert _fields(SpanSemantics(**kw)) == _fields(_reference(SpanSemantics)(**kw))
    attrs = {"k": 1}
    assert SpanEvent("e", 5, attrs).attributes is attrs
    assert SpanEvent(name="e", time_ns=5) == SpanEvent("e", 5, {})


def test_frozen_hash_eq_replace_pickle_kept():
    s = SpanSemantics(op=Op.LLM, model="m", input_tokens=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.model = "x"  # type: ignore[misc]
    same = SpanSemantics(op=Op.LLM, model="m", input_tokens=1)
    assert s == same and hash(s) == hash(same) and s is not same
    assert s != SpanSemantics(op=Op.LLM, model="m")
    r = dataclasses.replace(s, model="n")
    assert type(r) is SpanSemantics and r.model == "n" and r.input_tokens == 1
    assert pickle.loads(pickle.dumps(s)) == s
    assert repr(s).startswith("SpanSemantics(op=<Op.LLM: 'llm'>, convention='unknown'")


def test_wrong_arguments_raise_type_error_as_before():
    with pytest.raises(TypeError):
        CanonicalSpan("a", "b")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        SpanSemantics(nope=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Evaluation("n", 0.5, "l", "e", "extra")  # type: ignore[call-arg]
