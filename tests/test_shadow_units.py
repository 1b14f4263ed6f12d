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
    # a side-effecting tool production never called: not live although live_tools = *;
    # acknowledged with null, recorded, never executed (graded by side-effect equivalence)
    b = s.answer({"name": "delete_account", "arguments": {}, "side_effect": "write"})
    assert b.envelope["outcome"] == "result" and b.envelope["match"] == "unrecorded"
    assert b.envelope["result"] is None and b.envelope["recorded"] is True
    # a tool nobody declares is treated as side-effecting unless listed live
    c = SandboxSession("r2", [], live_tools=[]).answer({"name": "mystery", "arguments": {}})
    assert c.envelope["outcome"] == "sandbox_miss"
    # a read-only tool the operator allows: live
    d = SandboxSession("r3", [], live_tools=["get_*"]).answer({"name": "get_weather", "arguments": {}, "side_effect": "read"})
    assert d.envelope["outcome"] == "live"
    # the policy's side_effects table wins over a call that says "read"
    e = SandboxSession("r4", [], live_tools=["*"], policy_side_effects={"wire_*": "irreversible"}).answer(
        {"name": "wire_money", "arguments": {}, "side_effect": "read"})
    assert e.envelope["outcome"] == "result" and e.envelope["match"] == "unrecorded"
    assert [c["name"] for c in s.summary()["side_effect_calls"]] == ["issue_refund", "delete_account"]
    assert s.summary()["misses"] == 0 and s.summary()["unrecorded_side_effects"] == 1
    assert not any(c["executed"] for c in s.calls)


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


def _on(t, task):
    return dataclasses.replace(t, task_id=task)


def test_harness_check_leaves_the_replayed_run_out_of_its_own_rate():
    """Bug: the replayed production run fed its own task's rate, pulling the expected agreement of
    a production success toward 1 (false harness drift). Task A: 5 production runs, 3 successes."""
    from relyscope.shadow.grading import harness_check

    runs = [_on(trial([], tid=i, outcome=o), "A") for i, o in
            [("pa1", "success"), ("pa2", "failure"), ("x1", "success"), ("x2", "success"), ("x3", "failure"),
             ("x4", "unknown")]]                                    # unknown: not counted
    prods = {t.trial_id: t for t in runs[:2]}

    def rep(tid, of, outcome, source="side_effect_equivalence", **kw):
        t = trial([], tid=tid, outcome=outcome, run_kind="shadow", shadow_of=of, **kw)
        return _on(dataclasses.replace(t, outcome_source=source), "A")

    reps = [rep("r1", "pa1", "success"), rep("r2", "pa1", "failure"),
            rep("r3", "pa2", "failure"),                            # repeated the failure: agrees surely
            rep("r4", "pa2", "success", "posted:user"),             # posted: an independent run, disagrees
            rep("r5", "pa2", "unknown", None),                      # not known: skipped
            rep("r6", "pa1", "success", version="2.0"),              # not the incumbent
            dataclasses.replace(rep("r7", "pa1", "failure"), perturbation_family="fault")]
    hc = harness_check(reps, prods, runs)
    # r1, r2: the other runs of A are 2 successes of 4 -> q = 0.5 each; r3: q = 1;
    # r4: the other runs of pa2 are 3 of 4 successes -> fails with q = 0.25
    assert (hc.replays, hc.agreeing, hc.conservative) == (4, 2, 0)
    assert abs(hc.expected - 2.25) < 1e-12
    # one task: the clustered sum has no degrees of freedom, the Bernoulli floor is
    # 0.25 + 0.25 + 0 + 0.25·0.75
    assert abs(hc.variance - 0.6875) < 1e-12


def test_leave_one_out_is_unbiased_and_the_pooled_rate_conservative_by_enumeration():
    """Exact expectations over every production outcome, the replays of production successes all
    agreeing: (a) one task with n runs of success probability p, every run replayed: E[expected]
    = n·p² (each replay agrees with probability p; hand: n = 3, p = 0.3 -> 0.27), where the former
    (c + 2p̄)/(n + 2) was not; (b) single-run tasks of p = 0.2, 0.5, 0.9: the truth is
    Σ p² = 1.10; the leave-one-out pooled rate gives Σ_j p_j·(Σ_{i≠j} p_i)/2 =
    (0.2·1.4 + 0.5·1.1 + 0.9·0.7)/2 = 0.73 ≤ 1.10 (conservative)."""
    import itertools

    from relyscope.shadow.grading import ReplayRecord, expected_agreement

    def mean_expected(ps, tasks):
        total = 0.0
        for ys in itertools.product([True, False], repeat=len(ps)):
            w = 1.0
            for y, p in zip(ys, ps):
                w *= p if y else 1 - p
            runs, recs = {}, []
            for j, (y, task) in enumerate(zip(ys, tasks)):
                runs.setdefault(("1", task), {})[f"p{j}"] = y
                recs.append(ReplayRecord("1", task, f"p{j}", y, True if y else None, certain=not y))
            total += w * expected_agreement(recs, runs).expected
        return total

    assert abs(mean_expected([0.3] * 3, ["t"] * 3) - 0.27) < 1e-12
    assert abs(mean_expected([0.2, 0.5, 0.9], ["a", "b", "c"]) - 0.73) < 1e-12


def test_harness_check_pools_tasks_that_ran_once_as_a_lower_bound():
    """Tasks B1–B4 ran once each (b1, b2, b4 successes, b3 a failure); b1 is replayed twice. A
    replay's rate is the production outcome of the other such replays (those of other runs):
    b1's replays 2 of 3 -> 2/3; b2's and b4's 3 of 4 -> 0.75; b3's repeated failure: 1."""
    from relyscope.shadow.grading import harness_check

    prods = {f"b{i}": _on(trial([], tid=f"b{i}", outcome=o), f"B{i}")
             for i, o in [(1, "success"), (2, "success"), (3, "failure"), (4, "success")]}

    def rep(tid, of, outcome):
        t = trial([], tid=tid, outcome=outcome, run_kind="shadow", shadow_of=of)
        return _on(dataclasses.replace(t, outcome_source="side_effect_equivalence"), prods[of].task_id)

    reps = [rep("r1a", "b1", "success"), rep("r1b", "b1", "success"), rep("r2", "b2", "failure"),
            rep("r3", "b3", "failure"), rep("r4", "b4", "success")]
    hc = harness_check(reps, prods, list(prods.values()))
    assert (hc.replays, hc.agreeing, hc.conservative) == (5, 4, 5)
    assert abs(hc.expected - (2 / 3 + 2 / 3 + 0.75 + 1 + 0.75)) < 1e-12
    # the variance is at least the replays' Bernoulli noise 2·(2/9) + 2·0.1875
    assert hc.variance >= 4 / 9 + 0.375 - 1e-12


def test_harness_lower_bound_is_said_in_the_gate_reason():
    from relyscope.scorers.gate import GatePolicy, GateSide, HarnessStats, evaluate_gate

    t = [trial([], tid="c1", outcome="success", run_kind="shadow")]
    hs = HarnessStats(replays=72, agreeing=40, expected=60.0, variance=9.0, conservative=72)
    r = evaluate_gate(GateSide(t), GateSide(t), GatePolicy(), harness=hs)
    msg = next(x.message for x in r.reasons if x.name == "harness_agreement")
    assert "for 72 of the replays the expectation is a lower bound" in msg
    with pytest.raises(ValueError):
        HarnessStats(replays=3, agreeing=1, conservative=4)


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
    # a different second call is still the tool's next distinct call: no recording left, and the
    # recording shows issue_refund irreversible, so it is acknowledged (null), not a miss
    extra = s.answer({"name": "issue_refund", "arguments": {"id": 2, "amount": 9}})
    assert extra.envelope["match"] == "unrecorded" and extra.envelope["result"] is None
    # a read with no recording left stays a miss: never approximated
    assert s.answer({"name": "get_order", "arguments": {"id": 9}}).envelope["outcome"] == "result"  # position 1
    assert s.answer({"name": "get_order", "arguments": {"id": 8}}).envelope["outcome"] == "result"  # position 2
    assert s.answer({"name": "get_order", "arguments": {"id": 7}}).envelope["outcome"] == "sandbox_miss"


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


_NR = "harness not refuted (below min, too few replays to tell)"


@pytest.mark.parametrize("upper, reasons, line", [
    (0.995, [], f"{_NR}: agreement 49/72 vs ≈54.6 expected (89.8% of expected); its 95% upper bound 99.5% of expected ≥ min 90%"),
    (0.85, [{"kind": "experiment", "name": "harness_agreement", "verdict": "error", "message": "drift"}],
     "harness FAILED: agreement 49/72 vs ≈54.6 expected (89.8% of expected); its 95% upper bound 85.0% of expected < min 90%"),
    (0.995, [], f"{_NR}: agreement 49/72 vs ≈54.6 expected (89.8% of expected); its 95% upper bound 99.5% of expected ≥ min 90% "
                "(expected is a lower bound for 72 of the replays: their tasks ran once in production, so the check "
                "is lenient there)"),
])
def test_gate_render_says_the_harness_upper_bound_is_what_is_compared(upper, reasons, line):
    """Bug: `harness agreement 49 of 72 vs ≈54.6 expected (relative 89.8%, upper bound 99.5%, min
    90%)` next to PASS read as a failed check (89.8% < 90%); only the code showed the upper bound
    is compared. 49 / 54.6 = 89.7…% → 89.8% as the gate rounds it (0.898). Then "harness ok" for an
    agreement below min (64 % of expected, upper bound 90.5 %) read as a lenient pass: an agreement
    below min whose bound still reaches it is "not refuted", and "ok" is kept for one at or above."""
    from rich.console import Console

    from relyscope.cli.shadow import render_gate

    res = {"verdict": "error" if reasons else "pass", "agent": "a", "baseline": "1", "candidate": "2",
           "mode": "shadow", "shared_tasks": 24, "reasons": reasons, "deltas": {},
           "experiment": {"harness": {"replays": 72, "agreeing": 49, "expected": 54.6, "relative_agreement": 0.898,
                                      "upper_bound": upper, "min": 0.9}}}
    if "lower bound" in line:  # tasks that ran once in production: said, not hidden
        res["experiment"]["harness"]["conservative_replays"] = 72
    con = Console(record=True, width=400)
    render_gate(res, con)
    assert line in con.export_text()
    res["experiment"]["harness"].update(agreeing=53, relative_agreement=0.971)  # 53 / 54.6, at or above min
    con = Console(record=True, width=400)
    render_gate(res, con)
    assert ("harness FAILED" if reasons else "harness ok: agreement 53/72") in con.export_text()


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
    ("100000000d", "at most 100 years")])
def test_parse_since_refuses_what_the_store_cannot_compare(value, says):
    """Bug: NaN / infinite / far-future values passed the check and the server answered 500
    (int(nan)) or 503 'store unreachable' (a DateTime64 overflow in the query)."""
    from relyscope.shadow.gating import parse_since

    with pytest.raises(ValueError, match=says):
        parse_since(value, now=1_800_000_000)
