"""Pure parts of shadow replays: the sandbox's matching ladder, side-effect blocking, the sampler,
the plan, the replay protocol and side-effect equivalence — values worked out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from relyscope.instrumentation.replay import PROTOCOL, ReplayProtocolError, ReplayRequest
from relyscope.model import Op, Step, Trial
from relyscope.scorers.replay_outcome import equivalence_outcome, side_effect_signature
from relyscope.shadow.faults import FaultInjector
from relyscope.shadow.plan import plan_replays
from relyscope.shadow.proxy import SandboxSession, recorded_calls, replayable
from relyscope.shadow.sampler import Sampler, sample_fraction


def step(i, name, args, result=None, error=None, se=None):
    return Step(span_id=f"{i:016x}", parent_span_id="", action=name, op=Op.TOOL, name=f"execute_tool {name}",
                start_ns=i, end_ns=i + 1, tool_name=name, arguments=args, result=result, error=error, side_effect=se)


def trial(steps, *, tid="t1", outcome="success", end_ns=10**18, run_kind="production", task_input="refund ORD-1",
          shadow_of=None, version="1.0"):
    return Trial(trial_id=tid, trace_id="a" * 32, root_span_id="b" * 16, task_id="task", task_id_source="attribute",
                 agent_name="agent", agent_version=version, run_kind=run_kind, outcome=outcome, outcome_source=None,
                 outcome_score=None, claimed_success=None, confidence=None, conversation_id=None, start_ns=0,
                 end_ns=end_ns, steps=tuple(steps), shadow_of=shadow_of, task_input=task_input)


PROD = trial([
    step(1, "get_order", {"id": 1}, {"total": 30}, se="read"),
    step(2, "get_order", {"id": 2}, {"total": 50}, se="read"),
    step(3, "issue_refund", {"id": 1, "amount": 30}, {"ok": True}, se="irreversible"),
])


def session(**kw):
    return SandboxSession("r1", recorded_calls(PROD), **kw)


def test_ladder_exact_then_position_then_miss():
    s = session()
    a = s.answer({"name": "get_order", "arguments": {"id": 2}})
    assert a.envelope["outcome"] == "result" and a.envelope["match"] == "exact" and a.envelope["result"] == {"total": 50}
    # different arguments: the 2nd get_order call of the replay gets the 2nd recorded get_order
    b = s.answer({"name": "get_order", "arguments": {"id": 9}})
    assert b.envelope["match"] == "position" and b.envelope["result"] == {"total": 50}
    # a 3rd get_order with unknown arguments: no 3rd recording -> miss, never approximated
    c = s.answer({"name": "get_order", "arguments": {"id": 7}})
    assert c.envelope["outcome"] == "sandbox_miss" and c.status == 404
    # a retry of an exact call reuses its recording
    d = s.answer({"name": "get_order", "arguments": {"id": 1}})
    assert d.envelope["match"] == "exact" and d.envelope["result"] == {"total": 30}
    assert s.summary()["misses"] == 1 and s.summary()["exact"] == 2 and s.summary()["position"] == 1


def test_side_effects_recorded_never_live_even_if_allowed():
    s = session(live_tools=["*"])
    a = s.answer({"name": "issue_refund", "arguments": {"id": 1, "amount": 30}, "side_effect": "irreversible"})
    assert a.envelope["outcome"] == "result" and a.envelope["recorded"] is True
    # a side-effecting tool production never called: a miss, not live, although live_tools = *
    b = s.answer({"name": "delete_account", "arguments": {}, "side_effect": "write"})
    assert b.envelope["outcome"] == "sandbox_miss"
    # a tool nobody declares is treated as side-effecting unless listed live
    c = SandboxSession("r2", [], live_tools=[]).answer({"name": "mystery", "arguments": {}})
    assert c.envelope["outcome"] == "sandbox_miss"
    # a read-only tool the operator allows: live
    d = SandboxSession("r3", [], live_tools=["get_*"]).answer({"name": "get_weather", "arguments": {}, "side_effect": "read"})
    assert d.envelope["outcome"] == "live"
    # the policy's side_effects table wins over a call that says "read"
    e = SandboxSession("r4", [], live_tools=["*"], policy_side_effects={"wire_*": "irreversible"}).answer(
        {"name": "wire_money", "arguments": {}, "side_effect": "read"})
    assert e.envelope["outcome"] == "sandbox_miss"
    assert [c["name"] for c in s.summary()["side_effect_calls"]] == ["issue_refund", "delete_account"]


def test_fault_family_uses_injector_and_timeout_really_waits():
    inj = FaultInjector(1.0, {"timeout": 1.0}, timeout_s=0.25)
    a = session(family="fault", injector=inj).answer({"name": "get_order", "arguments": {"id": 1}})
    assert a.envelope["outcome"] == "fault" and a.envelope["fault"]["type"] == "timeout"
    assert a.delay_s == 0.25 and a.status == 504
    inj = FaultInjector(1.0, {"rate_limit": 1.0}, retry_after_s=2.0)
    b = session(family="fault", injector=inj).answer({"name": "get_order", "arguments": {"id": 1}})
    assert b.status == 429 and b.headers["retry-after"] == "2"
    # the injector is ignored outside the fault family
    c = session(family="nominal", injector=inj).answer({"name": "get_order", "arguments": {"id": 1}})
    assert c.envelope["outcome"] == "result"


def test_recorded_error_replays_as_error_not_injected_fault():
    prod = trial([step(1, "get_order", {"id": 1}, None, error="timeout", se="read"),
                  step(2, "get_order", {"id": 1}, {"total": 30}, se="read")])
    s = SandboxSession("r", recorded_calls(prod))
    a = s.answer({"name": "get_order", "arguments": {"id": 1}})
    b = s.answer({"name": "get_order", "arguments": {"id": 1}})
    assert a.envelope["outcome"] == "error" and a.envelope["error"]["type"] == "timeout"
    assert b.envelope["outcome"] == "result" and b.envelope["result"] == {"total": 30}


def test_replayable_needs_every_tool_result():
    assert replayable(PROD) == (True, None)
    ok, why = replayable(trial([step(1, "get_order", {"id": 1})]))
    assert not ok and "no tool result recorded at all" in why
    ok, why = replayable(trial([step(1, "lookup", {"id": 1}, {"a": 1}, se="read"), step(2, "get_order", {"id": 1})]))
    assert not ok and "get_order" in why
    # a procedure (side-effecting, returned nothing) is replayable: answered with null
    assert replayable(trial([step(1, "get_order", {"id": 1}, {"a": 1}, se="read"),
                             step(2, "send_mail", {"to": "x"}, None, se="write")])) == (True, None)
    ok, why = replayable(trial(PROD.steps, task_input=None))
    assert not ok and "task input" in why


def test_sampler_is_deterministic_and_capped():
    s = Sampler(rate=0.5, cap_per_hour=2, quiet_s=60)
    assert sample_fraction("abc") == sample_fraction("abc") and 0 <= sample_fraction("abc") < 1
    ids = [f"trial-{i}" for i in range(2000)]
    inside = [i for i in ids if sample_fraction(i) < 0.5]
    assert 900 < len(inside) < 1100  # ~Binomial(2000, 0.5): 4.5 sigma = 100
    counts: dict[str, int] = {}
    out = []
    for i in inside[:5]:
        d = s.decide(trial([], tid=i), counts)
        out.append(d.decision)
        if d.decision == "sampled":
            counts["agent"] = counts.get("agent", 0) + 1
    assert out == ["sampled", "sampled", "over_cap", "over_cap", "over_cap"]
    outside = next(i for i in ids if sample_fraction(i) >= 0.5)
    assert s.decide(trial([], tid=outside), {}).decision == "sampled_out"
    assert s.decide(trial([step(1, "x", {})], tid=inside[0]), {}).decision == "not_replayable"
    # eligibility: production, complete, not a replay, quiet period over
    t = trial([], end_ns=10**18)
    assert s.eligible(t, 10**18 + 60 * 10**9) and not s.eligible(t, 10**18 + 59 * 10**9)
    assert not s.eligible(trial([], run_kind="shadow"), 10**19)
    with pytest.raises(ValueError, match="rate"):
        Sampler(rate=1.5)


def test_plan_counts_seeds_and_ids_are_stable():
    rw = lambda text, seed, strength: [f"{text} v{i}" for i in range(5)]  # noqa: E731
    specs, notes = plan_replays(PROD, ["1.0", "2.0"], k=5, j=5, rewrite=rw)
    assert notes == []
    per_target = [s for s in specs if s.target_version == "1.0"]
    fams = [s.family for s in per_target]
    assert fams.count("nominal") == 5 and fams.count("fault") == 5 and fams.count("env") == 5 and fams.count("prompt") == 5
    assert len(specs) == 40 and len({s.replay_id for s in specs}) == 40
    again, _ = plan_replays(PROD, ["1.0", "2.0"], k=5, j=5, rewrite=rw)
    assert [s.replay_id for s in again] == [s.replay_id for s in specs]
    # paired: both targets get the same seed and input for the same (family, index)
    by = {(s.target_version, s.family, s.index): s for s in specs}
    assert by[("1.0", "fault", 3)].seed == by[("2.0", "fault", 3)].seed
    assert by[("1.0", "prompt", 2)].input == by[("2.0", "prompt", 2)].input == "refund ORD-1 v2"
    _, notes = plan_replays(trial([], task_input=None), ["1.0"], rewrite=rw)
    assert notes and "no recorded task input" in notes[0]


def test_replay_request_validation_names_the_field():
    good = {"protocol": PROTOCOL, "replay_id": "r", "shadow_of": "t", "task": {"task_id": "x", "input": "hi"},
            "perturbation": {"family": "fault", "seed": 3}, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
            "tool_proxy": {"url": "http://127.0.0.1:1/x"}}
    req = ReplayRequest.from_json(good)
    assert req.family == "fault" and req.seed == 3
    assert ReplayRequest.from_json(json.loads(json.dumps(req.to_json()))) == req
    for patch, field in ((("perturbation", {"family": "chaos"}), "perturbation.family"),
                         (("traceparent", "00-zz"), "traceparent"), (("task", {"input": "x"}), "task.task_id"),
                         (("run_kind", "production"), "run_kind"), (("protocol", "v0"), "protocol"),
                         (("tool_proxy", {"url": "ftp://x"}), "tool_proxy.url")):
        with pytest.raises(ReplayProtocolError, match=field.replace(".", r"\.")):
            ReplayRequest.from_json({**good, patch[0]: patch[1]})


def test_side_effect_equivalence():
    replay_same = trial(PROD.steps, tid="r1", outcome="unknown", run_kind="shadow", shadow_of="t1")
    replay_other = trial([step(3, "issue_refund", {"amount": 15, "id": 1}, {"ok": True}, se="irreversible")],
                         tid="r2", outcome="unknown", run_kind="shadow", shadow_of="t1")
    # argument order does not matter; a faulted (errored) side effect did not happen
    assert side_effect_signature(trial([step(3, "issue_refund", {"amount": 30, "id": 1}, {}, se="irreversible")])) \
        == side_effect_signature(PROD)
    assert side_effect_signature(trial([step(3, "issue_refund", {"id": 1, "amount": 30}, None, error="http_500",
                                              se="irreversible")])) == {}
    assert equivalence_outcome(replay_same, PROD) == "success"
    assert equivalence_outcome(replay_other, PROD) == "failure"
    failed_prod = trial(PROD.steps, outcome="failure")
    assert equivalence_outcome(replay_same, failed_prod) == "failure"
    assert equivalence_outcome(replay_other, failed_prod) is None
    assert equivalence_outcome(replay_same, trial(PROD.steps, outcome="unknown")) is None
    # the policy can make a tool side-effecting that the span did not mark
    plain = trial([step(1, "wire", {"to": "x"}, {"ok": True})])
    assert side_effect_signature(plain) == {}
    assert side_effect_signature(plain, {"wi*": "write"}) == {("wire", '{"to":"x"}'): 1}


def test_harness_check_expects_the_agents_own_inconsistency():
    from relyscope.shadow.grading import harness_check, production_success_rates

    p_ok = trial(PROD.steps, tid="p1", outcome="success")
    p_bad = trial(PROD.steps, tid="p2", outcome="failure")
    prods = {"p1": p_ok, "p2": p_bad}
    # task success rate 0.6 in production (3 of 5 known)
    rates = production_success_rates([trial([], tid=f"x{i}", outcome=o) for i, o in
                                      enumerate(["success"] * 3 + ["failure"] * 2 + ["unknown"])])
    assert rates == {"task": 0.6}
    reps = [trial([], tid="r1", outcome="success", run_kind="shadow", shadow_of="p1"),
            trial([], tid="r2", outcome="failure", run_kind="shadow", shadow_of="p1"),
            trial([], tid="r3", outcome="failure", run_kind="shadow", shadow_of="p2"),
            trial([], tid="r4", outcome="unknown", run_kind="shadow", shadow_of="p2"),   # not known: skipped
            trial([], tid="r5", outcome="success", run_kind="shadow", shadow_of="p1", version="2.0")]  # not incumbent
    hc = harness_check(reps, prods, rates)
    # r1 agrees, r2 not, r3 agrees; expected = 0.6 + 0.6 + 1
    assert (hc.replays, hc.agreeing) == (3, 2) and abs(hc.expected - 2.2) < 1e-12


def test_harness_noise_is_not_drift_but_a_broken_sandbox_is():
    from relyscope.scorers.gate import HarnessStats

    # 64 replays, agreement probability 0.9 each: expected 57.6, variance 64·0.09 = 5.76 (sd 2.4)
    noisy = HarnessStats(replays=64, agreeing=50, expected=57.6, variance=5.76)
    assert abs(noisy.relative_agreement - 50 / 57.6) < 1e-12          # 0.868: below 0.9 by itself
    assert abs(noisy.relative_agreement_upper - (50 + 1.645 * 2.4) / 57.6) < 1e-12  # 0.937: noise
    broken = HarnessStats(replays=64, agreeing=40, expected=57.6, variance=5.76)
    assert broken.relative_agreement_upper < 0.9                        # 0.763: drift
    assert HarnessStats(replays=10, agreeing=9).relative_agreement_upper == 0.9  # deterministic: exact


def test_retry_of_a_position_matched_call_keeps_its_answer():
    """Bug: an agent retrying (same arguments) after a fault on a position-matched call got a
    sandbox miss: the retry counted as the tool's next call, beyond the recordings."""
    s = session()
    first = s.answer({"name": "issue_refund", "arguments": {"id": 1, "amount": 15}})
    retry = s.answer({"name": "issue_refund", "arguments": {"id": 1, "amount": 15}})
    assert first.envelope["match"] == retry.envelope["match"] == "position"
    assert retry.envelope["outcome"] == "result" and s.summary()["misses"] == 0
    # a different second call is still the tool's next distinct call: no recording left
    assert s.answer({"name": "issue_refund", "arguments": {"id": 2, "amount": 9}}).envelope["outcome"] == "sandbox_miss"


def test_a_crashed_replay_is_a_failure_and_equivalence_outranks_the_replays_own_verifier():
    """Bugs: (1) a replay whose agent raised, on a read-only task, had the same (empty) side effects
    as production and was graded success; (2) an agent's own verifier, checking a world the sandbox
    never changed, decided its replays' outcomes."""
    from relyscope.scorers.replay_outcome import apply_replay_outcomes

    read_only = trial([step(1, "get_order", {"id": 1}, {"total": 30}, se="read")], tid="p", outcome="success")
    crashed = dataclasses.replace(trial(read_only.steps, tid="r", outcome="unknown", run_kind="shadow", shadow_of="p"),
                                  flags=frozenset({"root_error"}))
    assert equivalence_outcome(crashed, read_only) == "failure"
    self_judged = trial([], tid="r2", outcome="success", run_kind="shadow", shadow_of="t1")
    self_judged = dataclasses.replace(self_judged, outcome_source="db_state")
    posted = dataclasses.replace(self_judged, trial_id="r3", outcome_source="posted:user_feedback")
    out = {t.trial_id: t for t in apply_replay_outcomes([self_judged, posted], {"t1": PROD})}
    assert out["r2"].outcome == "failure" and out["r2"].outcome_source == "side_effect_equivalence"
    assert out["r3"].outcome == "success"  # posted for the replay itself: kept


def test_partial_gate_policy_changes_only_the_keys_it_names():
    from relyscope.scorers.gate import parse_gate_policy

    p = parse_gate_policy({"metrics": {"success_rate": {"max_regression": 0.1}, "C_out": None}})
    assert p.metrics["success_rate"].max_regression == 0.1
    assert "S_comp" in p.metrics and "C_out" not in p.metrics and "R_fault" in p.metrics


def test_equivalence_by_value_and_by_either_sides_labels():
    """Bugs: amount 30.0 vs 30 counted as different calls; a candidate that newly labels a tool
    irreversible, making the identical call, was graded failure."""
    replay = trial([step(3, "issue_refund", {"id": 1, "amount": 30.0}, {"ok": True}, se="irreversible")],
                   tid="r", outcome="unknown", run_kind="shadow", shadow_of="t1")
    assert equivalence_outcome(replay, PROD) == "success"
    unlabeled_prod = trial([step(3, "issue_refund", {"id": 1, "amount": 30}, {"ok": True})], outcome="success")
    assert equivalence_outcome(replay, unlabeled_prod) == "success"


def test_sandbox_fault_tools_take_globs():
    inj = FaultInjector(1.0, {"http_500": 1.0})
    s = SandboxSession("r", recorded_calls(PROD), family="fault", injector=inj, fault_tools=["get_*"])
    assert s.answer({"name": "get_order", "arguments": {"id": 1}}).envelope["outcome"] == "fault"
    assert s.answer({"name": "issue_refund", "arguments": {"id": 1, "amount": 30}}).envelope["outcome"] == "result"


def test_prompt_variants_equal_to_the_input_are_not_replayed():
    specs, notes = plan_replays(PROD, ["1.0"], k=1, j=3, rewrite=lambda text, seed, st: [text, text + "!", text])
    assert [s.input for s in specs if s.family == "prompt"] == ["refund ORD-1!"]
    assert any("unchanged" in n for n in notes)


def test_harness_rates_shrink_toward_the_pooled_rate():
    from relyscope.shadow.grading import production_success_rates

    trials = [trial([], tid=f"a{i}", outcome="success") for i in range(4)] + [trial([], tid="b", outcome="failure")]
    trials = [dataclasses.replace(t, task_id="A" if t.trial_id.startswith("a") else "B") for t in trials]
    r = production_success_rates(trials)
    # pooled 4/5 = 0.8; A: (4 + 2·0.8)/(4 + 2) = 0.9333; B: (0 + 1.6)/(1 + 2) = 0.5333
    assert abs(r["A"] - 5.6 / 6) < 1e-12 and abs(r["B"] - 1.6 / 3) < 1e-12


@pytest.mark.parametrize("value, expected", [
    ("2h", 1_800_000_000 - 7200), ("90m", 1_800_000_000 - 5400), ("1d", 1_800_000_000 - 86400),
    ("1700000000", 1_700_000_000), (1_700_000_000, 1_700_000_000),
    ("2026-12-01T10:00:00Z", 1_796_119_200), ("2026-12-01T10:00:00", 1_796_119_200),  # no zone: UTC
    ("2026-12-01T11:00:00+01:00", 1_796_119_200), (None, None)])
def test_parse_since_forms(value, expected):
    from relyscope.shadow.gating import parse_since

    assert parse_since(value, now=1_800_000_000) == expected


@pytest.mark.parametrize("value, says", [
    ("nan", "between 1970"), ("inf", "between 1970"), ("-inf", "between 1970"), ("1e400", "between 1970"),
    (float("nan"), "between 1970"), ("99999999999", "between 1970"), ("-5", "between 1970"),
    ("0s", "more than 0"), ("0m", "more than 0"), ("yesterday", "duration back from now"),
    ("100000000d", "between 1970")])
def test_parse_since_refuses_what_the_store_cannot_compare(value, says):
    """Bug: NaN / infinite / far-future values passed the check and the server answered 500
    (int(nan)) or 503 'store unreachable' (a DateTime64 overflow in the query)."""
    from relyscope.shadow.gating import parse_since

    with pytest.raises(ValueError, match=says):
        parse_since(value, now=1_800_000_000)
