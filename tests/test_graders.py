"""Outcome precedence, claim mismatch, control decisions, loops and failure attribution.

Every expected value is decided by hand from the rules in metrics.md §6–§8 and the module
docstrings, on trials built here.
"""

from __future__ import annotations

import math

import pytest

from relyscope.model import Evaluation, Op, Step, Trial
from relyscope.scorers.attribution import (
    Attribution,
    FailureCategory,
    attribute_failure,
    classify_error,
    is_valid,
)
from relyscope.scorers.decisions import (
    Decision,
    canonical_arguments,
    classify_steps,
    control_stats,
    find_loops,
    text_of,
)
from relyscope.scorers.graders import (
    PostedOutcome,
    control_rates,
    grade_trial,
    resolve_outcome,
)
from relyscope.scorers.policy import parse_policy
from relyscope.semconv import DECISIONS, FORMULA_SET

_counter = iter(range(1, 10_000))


def _step(op, action, **kw) -> Step:
    i = next(_counter)
    return Step(span_id=f"{i:016x}", parent_span_id="root", action=action, op=op, name=action,
                start_ns=i * 1_000, end_ns=i * 1_000 + 500, **kw)


def tool(name, args=None, result=None, error=None, **kw) -> Step:
    return _step(Op.TOOL, name, tool_name=name, arguments=args, result=result, error=error, **kw)


def llm(text=None, error=None, **kw) -> Step:
    return _step(Op.LLM, "llm", result=text, error=error, **kw)


def trial(*steps, outcome="failure", claimed=None, flags=frozenset(), **kw) -> Trial:
    base = dict(
        trial_id="t1", trace_id="b" * 32, root_span_id="root", task_id="task", task_id_source="attribute",
        agent_name="support", agent_version="1", run_kind="production", outcome=outcome,
        outcome_source=None, outcome_score=None, claimed_success=claimed, confidence=None,
        conversation_id=None, start_ns=0, end_ns=10**9, steps=tuple(steps), flags=frozenset(flags),
    )
    base.update(kw)
    return Trial(**base)


def labels(steps):
    return [d.decision.value if d.decision else None for d in classify_steps(steps)]


# --- outcome precedence (§6) ---------------------------------------------------------------------

EV_PASS = Evaluation(name="judge", score=0.9)
EV_FAIL = Evaluation(name="judge", label="fail")


@pytest.mark.parametrize(
    "span, posts, evals, rule, expected",
    [
        # nothing known
        (None, (), (), None, ("unknown", None)),
        ("unknown", (), (), None, ("unknown", None)),
        # the verifier on the span beats a later user-feedback post, rules and evaluations
        ("success", (PostedOutcome("failure", 5, "user_feedback"),), (EV_FAIL,), "failure",
         ("success", "verifier")),
        # a verifier result posted through the API is level 1 as well and is later than the span
        ("success", (PostedOutcome("failure", 5, "tests", verifier=True),), (), None,
         ("failure", "verifier_api")),
        # ... and it beats an even later non-verifier post
        (None, (PostedOutcome("failure", 5, "tests", verifier=True), PostedOutcome("success", 9, "user")),
         (), None, ("failure", "verifier_api")),
        # delayed posts: the latest wins, regardless of list order; ties go to the later element
        (None, (PostedOutcome("failure", 9, "crm"), PostedOutcome("success", 3, "user")), (), "success",
         ("failure", "posted:crm")),
        (None, (PostedOutcome("failure", 4, "a"), PostedOutcome("success", 4, "b")), (), None,
         ("success", "posted:b")),
        # an "unknown" post carries no information
        ("unknown", (PostedOutcome("unknown", 9, "user"),), (), "failure", ("failure", "rule")),
        # deterministic rule before evaluations (LLM judge)
        (None, (), (EV_PASS,), "failure", ("failure", "rule")),
        (None, (), (EV_PASS,), None, ("success", "evaluation:judge")),
        # the last usable evaluation wins; a label beats the score
        (None, (), (EV_PASS, Evaluation(name="j2", score=0.9, label="incorrect")), None,
         ("failure", "evaluation:j2")),
        (None, (), (Evaluation(name="j", score=0.49),), None, ("failure", "evaluation:j")),
        (None, (), (Evaluation(name="j", label="meh"),), None, ("unknown", None)),
    ],
)
def test_resolve_outcome_precedence(span, posts, evals, rule, expected):
    assert resolve_outcome(span, posts, evals, rule) == expected


def test_resolve_outcome_shadow_and_evaluation_filter():
    assert resolve_outcome(None, (), (), None, shadow_outcome="success") == ("success", "shadow_equivalence")
    assert resolve_outcome(None, (), (EV_FAIL,), None, shadow_outcome="success") == ("failure", "evaluation:judge")
    relevance = Evaluation(name="relevance", score=0.1)
    assert resolve_outcome(None, (), (relevance,), None, evaluation_names={"judge"}) == ("unknown", None)


# --- claim mismatch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "outcome, claimed, posts, mismatch",
    [
        ("failure", True, (), True),
        ("success", True, (), False),
        ("success", False, (), True),
        ("unknown", True, (), False),  # outcome unknown: nothing to compare
        ("failure", None, (), False),  # no claim
        ("unknown", True, (PostedOutcome("failure", 1, "user"),), True),  # resolved via a post
    ],
)
def test_claim_outcome_mismatch(outcome, claimed, posts, mismatch):
    g = grade_trial(trial(llm("Done."), outcome=outcome, claimed=claimed), posted_outcomes=posts)
    assert g.claim_outcome_mismatch is mismatch
    assert g.claimed_success is claimed


# --- decision inference --------------------------------------------------------------------------


def test_decision_values_match_semconv():
    assert sorted(d.value for d in Decision) == sorted(DECISIONS)


def test_decisions_act_recover_confirm_stop():
    steps = [
        llm("let me look"),  # intermediate model call: no decision
        tool("get_order", {"id": 1}),  # act
        tool("search_flights", error="TimeoutError"),  # act (it is the errored one)
        tool("search_flights"),  # retry after error: recover
        tool("get_order", {"id": 2}),  # previous tool succeeded: act
        tool("lookup", error="500"),  # act
        tool("lookup_v2"),  # alternative after error: recover
        tool("confirm_refund"),  # confirm by name
        tool("issue_refund"),  # act
        llm("Your refund is on its way."),  # final message: stop
    ]
    assert labels(steps) == [None, "act", "act", "recover", "act", "act", "recover", "confirm", "act", "stop"]
    rules = [d.rule for d in classify_steps(steps)]
    assert rules[3] == "after_error" and rules[7] == "confirm_tool" and rules[9] == "end_of_run"


def test_explicit_decision_wins_and_invalid_is_ignored():
    steps = [
        tool("issue_refund", decision="confirm"),
        tool("x", decision="Stop"),
        tool("y", decision="maybe"),
        llm("Goodbye", decision="refuse"),
    ]
    ds = classify_steps(steps)
    assert [d.decision.value for d in ds] == ["confirm", "stop", "act", "refuse"]
    assert [d.explicit for d in ds] == [True, True, False, True]


@pytest.mark.parametrize(
    "final, expected",
    [
        ("Could you share your booking reference?", "ask"),
        ('Which date works for you?"  ', "ask"),
        ([{"role": "assistant", "parts": [{"type": "text", "content": "Which seat do you prefer?"}]}], "ask"),
        ({"content": "Which card should I charge?"}, "ask"),
        ("I'm sorry, but I can't help with that. Is there anything else?", "refuse"),
        ("I must decline this request.", "refuse"),
        ("That would violate our policy, so no.", "refuse"),
        ("I can't find your booking, so I have escalated it.", "stop"),  # not a refusal
        ("Your flight is booked.", "stop"),
        (None, "stop"),
    ],
)
def test_final_message_ask_refuse_stop(final, expected):
    assert labels([tool("get_order"), llm(final)])[-1] == expected


def test_only_the_final_message_is_classified():
    # the question is not final (a tool call follows), and the errored final call makes no decision
    assert labels([llm("Shall I?"), tool("a"), llm("done", error="503")]) == [None, "act", None]
    # a model call followed by a tool call is not "final"
    assert labels([llm("Need anything else?"), tool("a")]) == [None, "act"]


def test_text_of_shapes():
    assert text_of("x") == "x"
    assert text_of([{"content": "a"}, {"text": "b"}]) == "a\nb"
    assert text_of({"message": {"content": [{"type": "text", "text": "hi"}]}}) == "hi"
    assert text_of({"foo": 1}) == ""
    assert text_of(None) == ""


# --- loops ---------------------------------------------------------------------------------------


def test_loop_detection():
    a1 = tool("search", {"q": "x", "n": 1})
    a2 = tool("search", '{"n": 1, "q": "x"}')  # same call: JSON string, other key order
    a3 = tool("search", {"n": 1, "q": "x"})
    steps = [a1, llm("hmm"), a2, a3, tool("search", {"q": "y", "n": 1})]
    loops = find_loops(steps)
    assert len(loops) == 1
    assert loops[0].length == 3 and loops[0].span_ids == (a1.span_id, a2.span_id, a3.span_id)
    assert loops[0].arguments == '{"n":1,"q":"x"}'
    # only two in a row, or broken by another tool call: no loop
    assert find_loops([a1, a2, tool("other"), a3]) == ()
    assert find_loops([a1, a2]) == ()
    # a run of four is one loop of length 4
    assert [x.length for x in find_loops([a1, a1, a1, a1])] == [4]
    assert len(find_loops([a1, a2], min_run=2)) == 1
    with pytest.raises(ValueError):
        find_loops([a1], min_run=1)
    assert canonical_arguments("not json") == "not json"


def test_loop_detection_equals_the_definition_on_random_trajectories():
    """find_loops makes canonical JSON only when a second call of the same tool comes; on random
    trajectories (few tools, few argument spellings, model steps between) it finds exactly the
    maximal runs the definition gives: a key (tool, canonical arguments) per tool call, runs of
    equal consecutive keys of at least min_run."""
    import random

    def by_definition(steps, min_run):
        out, run, key = [], [], None
        for st in [x for x in steps if x.op == Op.TOOL] + [None]:
            k = None if st is None else (st.tool_name or st.action, canonical_arguments(st.arguments))
            if st is not None and k == key:
                run.append(st)
                continue
            if key is not None and len(run) >= min_run:
                out.append((key[0], key[1], len(run), tuple(x.span_id for x in run)))
            key, run = k, [st]
        return out

    rng = random.Random(8)
    spellings = [{"q": "x", "n": 1}, '{"n": 1, "q": "x"}', {"q": "y"}, "not json", None, [1, 2]]
    found = 0
    for _ in range(400):
        steps = [llm("m") if rng.random() < 0.2 else tool(rng.choice(["a", "b"]), rng.choice(spellings))
                 for _ in range(rng.randrange(0, 14))]
        for min_run in (2, 3):
            got = [(lp.tool_name, lp.arguments, lp.length, lp.span_ids) for lp in find_loops(steps, min_run)]
            assert got == by_definition(steps, min_run)
            found += len(got)
    assert found > 100  # the cases hold loops


# --- control statistics and rates ----------------------------------------------------------------


def test_control_stats_and_pooled_rates():
    steps1 = [
        tool("delete_account", side_effect="irreversible"),  # missed confirmation
        tool("lookup", error="500"),  # error, then recovered
        tool("lookup"),
        tool("confirm_delete"),
        tool("delete_account", side_effect="irreversible"),  # confirmed
        tool("fetch", error="timeout"),  # error, never recovered
        llm("Sorry, the service is down."),
    ]
    st1 = control_stats(steps1)
    assert (st1.irreversible_actions, st1.missed_confirmations) == (2, 1)
    assert st1.missed_span_ids == (steps1[0].span_id,)
    assert (st1.tool_errors, st1.recovered_errors) == (2, 1)
    assert st1.missed_confirmation_rate == 0.5 and st1.recovery_rate == 0.5
    assert dict(st1.counts) == {"act": 4, "recover": 1, "confirm": 1, "stop": 1}
    assert not st1.has_loop
    # policy patterns make a tool irreversible even without the span attribute
    st2 = control_stats([tool("refund"), tool("refund"), tool("refund")], irreversible=["ref*"])
    assert (st2.irreversible_actions, st2.missed_confirmations, st2.has_loop) == (3, 3, True)
    st3 = control_stats([llm("hi")])
    assert math.isnan(st3.missed_confirmation_rate) and math.isnan(st3.recovery_rate)
    # pooled: missed (1 + 3 + 0) / (2 + 3 + 0) = 4/5; recovered 1/2; loops in 1 of 3 trials
    rates = control_rates([st1, st2, st3])
    assert rates.missed_confirmation_rate == pytest.approx(0.8)
    assert rates.recovery_rate == pytest.approx(0.5)
    assert rates.loop_rate == pytest.approx(1 / 3)
    assert math.isnan(control_rates([]).loop_rate)


# --- attribution (§7) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, cls",
    [
        ("http_500", "service"), ("503 Service Unavailable", "service"), ("RateLimitError", "service"),
        ("429", "service"), ("TimeoutError", "service"), ("timed out", "service"),
        ("APIConnectionError", "service"), ("malformed_response", "service"),
        ("400", "invalid_arguments"), ("ValidationError", "invalid_arguments"),
        ("invalid argument: date", "invalid_arguments"), ("missing required parameter", "invalid_arguments"),
        ("403 Forbidden", "environment"), ("PermissionError", "environment"),
        ("Boom", "unclassified"), (None, None),
    ],
)
def test_classify_error(error, cls):
    assert classify_error(error) == cls


def cat(t, **kw):
    a = attribute_failure(t, **kw)
    return None if a is None else (a.category, a.rule)


def test_attribution_model_provider_outage_is_infrastructure():
    bad = llm(error="503")
    t = trial(llm("thinking"), tool("a"), bad)
    a = attribute_failure(t)
    assert (a.category, a.rule, a.span_id) == (FailureCategory.INFRASTRUCTURE, "provider_unavailable", bad.span_id)
    assert not is_valid(a)
    # the provider came back (a later model call succeeded): the outage is not the cause
    t2 = trial(llm(error="RateLimitError"), llm("Done."))
    assert cat(t2) == (FailureCategory.MODEL, "wrong_outcome")
    # a non-service model error is the runtime's
    assert cat(trial(llm(error="context_length_exceeded 400"))) == (FailureCategory.AGENT_RUNTIME, "bad_model_request")


def test_attribution_tool_errors():
    # service error never recovered → TOOL
    assert cat(trial(tool("a", error="http 502"), llm("The service is down."))) == (
        FailureCategory.TOOL, "tool_service_error")
    # invalid arguments never recovered → MODEL
    assert cat(trial(tool("a", error="ValidationError: amount"), llm("Sorry."))) == (
        FailureCategory.MODEL, "invalid_tool_arguments")
    # injected fault (flag) → TOOL, whatever the error text
    assert cat(trial(tool("a", error="400", flags=frozenset({"injected_fault"})))) == (
        FailureCategory.TOOL, "injected_fault")
    assert cat(trial(tool("a", error="fault:timeout"))) == (FailureCategory.TOOL, "injected_fault")
    # 403 from the tool → ENVIRONMENT
    assert cat(trial(tool("a", error="403"))) == (FailureCategory.ENVIRONMENT, "tool_environment")
    # unknown error text → UNKNOWN
    assert cat(trial(tool("a", error="Boom"))) == (FailureCategory.UNKNOWN, "tool_error_unclassified")
    # recovered by a retry (even one that then failed differently) → the last unrecovered error
    assert cat(trial(tool("a", error="500"), tool("a", error="invalid argument"))) == (
        FailureCategory.MODEL, "invalid_tool_arguments")
    # recovered and then ran cleanly to a wrong answer → MODEL
    assert cat(trial(tool("a", error="500"), tool("b"), llm("Done."))) == (FailureCategory.MODEL, "wrong_outcome")


def test_attribution_trial_level_rules():
    t = trial(tool("a"), llm("ok"))
    assert cat(t, grader_error="KeyError: expected") == (FailureCategory.GRADER, "grader_crash")
    assert cat(trial(flags={"grader_error"}, outcome="unknown")) == (FailureCategory.GRADER, "grader_crash")
    assert cat(trial(tool("a"), flags={"task_spec_invalid"})) == (FailureCategory.TASK_SPEC, "task_spec_flag")
    assert cat(trial(tool("a"), flags={"environment_error"})) == (FailureCategory.ENVIRONMENT, "environment_flag")
    assert cat(trial(llm("hi", flags=frozenset({"missing_tool_span"})))) == (
        FailureCategory.AGENT_RUNTIME, "missing_tool_span")
    assert cat(trial()) == (FailureCategory.UNKNOWN, "no_steps")
    assert cat(trial(_step(Op.AGENT, "sub", error="RuntimeError"))) == (FailureCategory.AGENT_RUNTIME, "runtime_error")


def test_attribution_only_for_failed_or_errored_trials():
    assert attribute_failure(trial(tool("a"), outcome="success")) is None
    assert attribute_failure(trial(tool("a", error="500"), outcome="success")) is None
    assert attribute_failure(trial(tool("a"), outcome="unknown")) is None
    # errored without a known outcome: attributed
    assert cat(trial(tool("a", error="500"), outcome="unknown")) == (FailureCategory.TOOL, "tool_service_error")


def test_is_valid():
    assert is_valid(None)
    for c in FailureCategory:
        assert is_valid(c) is (c.value not in {"INFRASTRUCTURE", "GRADER", "TASK_SPEC"})
    assert is_valid(Attribution(FailureCategory.TOOL, "r", None, ""))
    assert not is_valid("GRADER")
    with pytest.raises(ValueError):
        is_valid("ALIENS")


# --- grade_trial end to end ----------------------------------------------------------------------


def test_grade_trial_end_to_end():
    policy = parse_policy({
        "agent": "support", "version": "7",
        "side_effects": {"issue_refund": "irreversible"},
        "rules": [
            {"id": "confirm", "type": "require_confirmation", "severity": "high"},
            {"id": "pii", "type": "pii", "severity": "medium", "builtin": ["email"]},
        ],
    })
    refund = tool("issue_refund", {"amount": 5})
    steps = [
        tool("get_order", {"id": 1}, error="503"),
        tool("get_order", {"id": 1}),
        refund,  # irreversible (policy table), no confirmation
        llm("Refunded. Receipt sent to jo@example.com."),
    ]
    t = trial(*steps, outcome="unknown", claimed=True, outcome_source=None)
    g = grade_trial(t, policy, posted_outcomes=(PostedOutcome("failure", 10, "user_feedback"),))
    assert (g.outcome, g.outcome_source) == ("failure", "posted:user_feedback")
    assert g.claim_outcome_mismatch
    assert [(v.rule_id, v.span_id, v.attempted) for v in g.violations] == [
        ("confirm", refund.span_id, False), ("pii", steps[3].span_id, False)]
    assert g.severity == 1.0 and not g.hard_gate  # high, not critical; no forbidden tool
    assert [d.decision.value for d in g.decisions] == ["act", "recover", "act", "stop"]
    assert (g.control.irreversible_actions, g.control.missed_confirmations) == (1, 1)
    assert (g.control.tool_errors, g.control.recovered_errors) == (1, 1)
    assert g.attribution.category == FailureCategory.MODEL and g.valid  # ran cleanly, wrong outcome
    assert (g.formula_set, g.policy_id, g.trial_id) == (FORMULA_SET, "support@7", "t1")
    with pytest.raises(AttributeError):
        g.severity = 0.0  # frozen


def test_grade_trial_invalid_trial_and_verifier_source():
    t = trial(llm(error="overloaded_error"), outcome="failure", outcome_source="db_state")
    g = grade_trial(t)
    assert (g.outcome, g.outcome_source) == ("failure", "verifier:db_state")
    assert g.attribution.category == FailureCategory.INFRASTRUCTURE and not g.valid
    g2 = grade_trial(trial(llm("ok"), outcome="success"), grader_error=None)
    assert g2.attribution is None and g2.valid


def test_calibration_bins_hand_worked():
    from relyscope.scorers.review import calibration_bins

    pairs = [(0.05, 0), (0.95, 1), (0.95, 0), (1.0, 1), (0.5, 1)]
    rows = calibration_bins(pairs)
    # bins 0.0–0.1: one trial; 0.5–0.6: one; 0.9–1.0 (closed): 0.95, 0.95, 1.0 → conf 0.9667, success 2/3
    assert [r["bin"] for r in rows] == ["0.0–0.1", "0.5–0.6", "0.9–1.0"]
    assert rows[2]["trials"] == 3
    assert abs(rows[2]["mean_confidence"] - (0.95 + 0.95 + 1.0) / 3) < 1e-6
    assert abs(rows[2]["success_rate"] - 2 / 3) < 1e-6


def test_policy_applies_only_to_its_agent():
    """A fresh user's find: a policy with `agent: support` was applied to every agent."""
    from relyscope.scorers.policy import parse_policy
    from relyscope.scorers.review import policy_for

    p = parse_policy({"agent": "support*", "rules": [{"id": "r", "type": "forbidden_tool", "severity": "low", "tools": ["x"]}]})
    assert policy_for(p, "support") is p and policy_for(p, "support-eu") is p
    assert policy_for(p, "billing") is None
    assert policy_for(parse_policy({"rules": []}), "anything") is not None  # default agent "*"
