"""Fault injection of shadow replays (metrics.md §4 [R26 App. F.3]): rate and mix over many draws,
determinism, the edges p = 0 / p = 1, what each fault looks like, and argument validation."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from scipy.stats import binom

from relyscope.shadow.faults import FAULT_MIX, Fault, FaultInjector

N = 10_000
# The mix as published in metrics.md §4 / R26 App. F.3, typed in here (not read from the module).
PUBLISHED_MIX = {"timeout": 0.30, "http_500": 0.25, "rate_limit": 0.20, "network_error": 0.15,
                 "partial_response": 0.05, "invalid_response": 0.03, "empty_response": 0.02}

ORDER = {"order_id": "ORD-1042", "status": "shipped", "total": 1234.5, "items": [
    {"sku": "A-1", "qty": 2, "price": 19.99}, {"sku": "B-7", "qty": 1, "price": 1194.52}],
    "customer": {"name": "Zoë Martin", "email": "zoe@example.com"}, "gift": False, "note": None}


def _within_binomial(observed: int, n: int, p: float, z: float = 4.5) -> bool:
    dist = binom(n, p)
    return abs(observed - dist.mean()) <= z * dist.std()


def test_published_mix() -> None:
    assert dict(FAULT_MIX) == PUBLISHED_MIX
    assert math.isclose(sum(PUBLISHED_MIX.values()), 1.0)


def test_rate_and_mix_over_10000_draws() -> None:
    inj = FaultInjector()  # p_fault 0.2, the default of metrics.md §4
    faults = [inj.draw(7, i, "lookup_order", ORDER) for i in range(N)]
    hits = [f for f in faults if f is not None]
    assert _within_binomial(len(hits), N, 0.2)
    counts = Counter(f.type for f in hits)
    assert set(counts) <= set(PUBLISHED_MIX)
    for t, w in PUBLISHED_MIX.items():
        # unconditionally over all calls: Binomial(N, p * w); conditionally over faults: Binomial(n_hits, w)
        assert _within_binomial(counts[t], N, 0.2 * w), (t, counts[t])
        assert _within_binomial(counts[t], len(hits), w), (t, counts[t])


def test_mix_at_p_one_across_seeds_and_tools() -> None:
    inj = FaultInjector(p_fault=1.0)
    counts = Counter(inj.draw(s, s % 13, f"tool_{s % 3}", ORDER).type for s in range(N))
    for t, w in PUBLISHED_MIX.items():
        assert _within_binomial(counts[t], N, w), (t, counts[t])


def test_custom_mix_and_rate() -> None:
    inj = FaultInjector(0.5, {"timeout": 0.5, "http_500": 0.5})
    hits = [f.type for i in range(N) if (f := inj.draw(3, i, "search", "x")) is not None]
    assert _within_binomial(len(hits), N, 0.5)
    assert set(hits) == {"timeout", "http_500"}
    assert _within_binomial(hits.count("timeout"), len(hits), 0.5)


def test_deterministic_and_independent_of_instance() -> None:
    a, b = FaultInjector(0.3), FaultInjector(0.3)
    draws_a = [a.draw(11, i, "search", ORDER) for i in range(500)]
    assert draws_a == [b.draw(11, i, "search", ORDER) for i in range(500)]
    assert draws_a == [a.draw(11, i, "search", ORDER) for i in range(500)]
    # a different seed or tool name gives a different pattern of faulted calls
    pattern = [f is not None for f in draws_a]
    assert pattern != [a.draw(12, i, "search", ORDER) is not None for i in range(500)]
    assert pattern != [a.draw(11, i, "lookup", ORDER) is not None for i in range(500)]


def test_same_draw_in_a_fresh_interpreter() -> None:
    """Stable across processes (no use of the per-process randomized ``hash()``)."""
    import subprocess
    import sys

    code = ("from relyscope.shadow.faults import FaultInjector as F; i = F(0.5); "
            "print([None if (f := i.draw(5, k, 'search', {'a': 1})) is None else f.type for k in range(40)])")
    here = [None if (f := FaultInjector(0.5).draw(5, k, "search", {"a": 1})) is None else f.type for k in range(40)]
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(h)}).stdout.strip() for h in (1, 2)}
    assert outs == {str(here)}


def test_p_zero_never_and_p_one_always() -> None:
    zero, one = FaultInjector(0.0), FaultInjector(1.0)
    assert all(zero.draw(1, i, "t", ORDER) is None for i in range(2000))
    assert all(isinstance(one.draw(1, i, "t", ORDER), Fault) for i in range(2000))


def test_p_one_single_type() -> None:
    inj = FaultInjector(1.0, {"rate_limit": 1.0}, retry_after_s=2.5)
    faults = {inj.draw(s, 0, "t", ORDER) for s in range(200)}
    assert len(faults) == 1
    (f,) = faults
    assert (f.type, f.status, f.retry_after_s, f.delay_s, f.body) == ("rate_limit", 429, 2.5, 0.0, None)
    assert f.retry_after_header == "3" and "Retry-After: 3" in f.message


def test_only_listed_tools_are_faulted() -> None:
    inj = FaultInjector(1.0, tools={"refund"})
    assert all(inj.draw(0, i, "lookup_order", ORDER) is None for i in range(100))
    assert all(inj.draw(0, i, "refund", ORDER) is not None for i in range(100))
    assert all(FaultInjector(1.0, tools=()).draw(0, i, "refund", ORDER) is None for i in range(10))


def test_each_fault_looks_like_the_real_thing() -> None:
    inj = FaultInjector(timeout_s=3.0, retry_after_s=1.2)
    t = inj.force("timeout", ORDER)
    assert (t.status, t.delay_s, t.body, t.retry_after_s) == (None, 3.0, None, None)
    assert "timed out" in t.message.lower()
    e = inj.force("http_500", ORDER)
    assert (e.status, e.delay_s, e.body) == (500, 0.0, None) and "500" in e.message
    r = inj.force("rate_limit", ORDER)
    assert (r.status, r.retry_after_s, r.retry_after_header) == (429, 1.2, "2")  # delta-seconds, rounded up
    assert "429" in r.message
    n = inj.force("network_error", ORDER)
    assert (n.status, n.delay_s, n.body) == (None, 0.0, None) and "refused" in n.message.lower()
    em = inj.force("empty_response", ORDER)
    assert (em.status, em.body) == (200, "")
    for f in (t, e, n, em):
        assert f.retry_after_header is None


@pytest.mark.parametrize("result", [
    ORDER,
    [ORDER, ORDER],
    {"results": [], "count": 0},
    "plain text answer: the order shipped yesterday",
    '{"already": "a JSON body", "n": 12345}',
    12345,
    None,
    True,
    "12",
])
def test_partial_is_an_unparseable_strict_prefix(result: object) -> None:
    full = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    inj = FaultInjector()
    for seed in range(40):
        f = inj.force("partial_response", result, seed=seed)
        assert f.status == 200
        assert len(f.body) < len(full) and full.startswith(f.body)
        with pytest.raises(ValueError):
            json.loads(f.body)
        assert f"expected {len(full.encode())})" in f.message


@pytest.mark.parametrize("result", [ORDER, [1, 2, 3], "plain text", '{"a": [1, 2]}', 7, None, {}])
def test_invalid_is_unparseable(result: object) -> None:
    inj = FaultInjector()
    variants = set()
    for seed in range(40):
        f = inj.force("invalid_response", result, seed=seed)
        assert f.status == 200 and f.body
        with pytest.raises(ValueError):
            json.loads(f.body)
        assert f.message.startswith("JSONDecodeError")
        variants.add(f.body)
    assert len(variants) >= 2  # more than one kind of broken body


def test_partial_of_a_large_result_is_cut_somewhere_in_the_middle() -> None:
    big = {"orders": [dict(ORDER, order_id=f"ORD-{i}") for i in range(50)]}
    full = json.dumps(big, ensure_ascii=False)
    cuts = {len(FaultInjector().force("partial_response", big, seed=s).body) for s in range(30)}
    assert len(cuts) > 10
    assert min(cuts) >= 0.2 * len(full) and max(cuts) <= 0.9 * len(full)


def test_drawn_body_faults_are_built_from_the_result() -> None:
    inj = FaultInjector(1.0, {"partial_response": 1.0})
    full = json.dumps(ORDER, ensure_ascii=False)
    for i in range(50):
        f = inj.draw(99, i, "lookup_order", ORDER)
        assert full.startswith(f.body) and f.body != full


@pytest.mark.parametrize("kwargs, match", [
    ({"p_fault": -0.01}, "p_fault"),
    ({"p_fault": 1.5}, "p_fault"),
    ({"p_fault": float("nan")}, "p_fault"),
    ({"mix": {"timeout": 0.5, "http_500": 0.4}}, "sum to 1"),
    ({"mix": {"timeout": 0.5, "http_500": 0.5, "rate_limit": 1e-8}}, "sum to 1"),
    ({"mix": {"timeout": 1.0, "gremlins": 0.0}}, "unknown fault type"),
    ({"mix": {"timeout": 1.2, "http_500": -0.2}}, ">= 0"),
    ({"mix": {"timeout": float("inf")}}, "finite"),
    ({"mix": {}}, "non-empty"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": float("inf")}, "timeout_s"),
    ({"retry_after_s": -1}, "retry_after_s"),
])
def test_validation_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FaultInjector(**kwargs)


def test_mix_within_tolerance_is_accepted() -> None:
    FaultInjector(mix={"timeout": 0.1, "http_500": 0.2, "rate_limit": 0.7 + 1e-12})


def test_type_errors_and_bad_draw_arguments() -> None:
    with pytest.raises(TypeError, match="single string"):
        FaultInjector(tools="refund")
    inj = FaultInjector()
    with pytest.raises(ValueError, match="call_index"):
        inj.draw(0, -1, "t", None)
    with pytest.raises(TypeError, match="seed"):
        inj.draw("0", 0, "t", None)
    with pytest.raises(ValueError, match="unknown fault type"):
        inj.force("gremlins", None)
