"""Trajectory builder: every assembly rule of the issue "Real-world spans: … assemble trajectories
that survive out-of-order, orphan and late spans", on spans built here and normalized by the real
normalizer. Expected trees, actions and totals are written out by hand from the spans below."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from relyscope.collector.normalize import normalize
from relyscope.model import CanonicalSpan, Op
from relyscope.trajectory import SUPERSEDED, TrajectoryBuilder, assemble, sessions

T = "5b8efff798038103d269b633813fc60c"
S = 1_000_000_000  # ns per second
BASE = 1_760_000_000 * S
RES = {"service.name": "support-agent", "service.version": "1.2"}

GRACE, ROOT_TIMEOUT, RETAIN = 5.0, 300.0, 900.0


def sp(sid: str, parent: str, name: str, start_s: float, end_s: float, attrs: dict, *,
       trace: str = T, resource: dict | None = None, **kw) -> CanonicalSpan:
    return CanonicalSpan(trace_id=trace, span_id=sid * 16 if len(sid) == 1 else sid,
                         parent_span_id=(parent * 16 if len(parent) == 1 else parent),
                         name=name, kind=1, start_ns=BASE + int(start_s * S), end_ns=BASE + int(end_s * S),
                         attributes=attrs, resource=RES if resource is None else resource, **kw)


def agent(sid, parent, start, end, name="support_bot", **extra):
    return sp(sid, parent, f"invoke_agent {name}", start, end,
              {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name, **extra})


def chat(sid, parent, start, end, tin=0, tout=0, **extra):
    return sp(sid, parent, "chat gpt-4o", start, end,
              {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
               "gen_ai.usage.input_tokens": tin, "gen_ai.usage.output_tokens": tout, **extra})


def tool(sid, parent, start, end, name, call_id=None, args=None, **extra):
    a = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, **extra}
    if call_id:
        a["gen_ai.tool.call.id"] = call_id
    if args is not None:
        a["gen_ai.tool.call.arguments"] = json.dumps(args)
    return sp(sid, parent, f"execute_tool {name}", start, end, a)


def sid(c: str) -> str:
    return c * 16


def pairs(*spans):
    return [(s, normalize(s)) for s in spans]


def only(trials):
    assert len(trials) == 1, trials
    return trials[0]


def tree(trial) -> list[tuple[str, int, str]]:
    """(action, depth, parent span id) per step, in step order."""
    return [(s.action, s.depth, s.parent_span_id) for s in trial.steps]


def builder() -> TrajectoryBuilder:
    return TrajectoryBuilder(grace_s=GRACE, root_timeout_s=ROOT_TIMEOUT, retain_s=RETAIN)


# ---- children before parents (C01) -------------------------------------------------------------

def test_children_before_parent_wait_for_the_root_then_attach_under_it():
    b = builder()
    b.add(pairs(chat("b", "a", 1, 3, 812, 41), tool("c", "a", 3.5, 3.9, "get_order_details", "call_1")), now=0.0)
    # no root yet: not finalized after the grace period, nor long after
    assert b.poll(GRACE) == [] and b.poll(ROOT_TIMEOUT / 2) == []
    assert b.open_trace_ids() == {T}
    b.add(pairs(agent("a", "", 0, 9)), now=10.0)
    assert b.poll(10.0 + GRACE - 0.01) == []
    t = only(b.poll(10.0 + GRACE))
    assert t.status == "complete" and t.root_span_id == sid("a") and t.trial_id == f"{T}:{sid('a')}"
    assert tree(t) == [("llm", 1, sid("a")), ("get_order_details", 1, sid("a"))]
    assert (t.input_tokens, t.output_tokens, t.total_tokens) == (812, 41, 853)
    assert t.flags == frozenset() and t.agent_name == "support_bot"
    assert t.wall_time_s == 9.0
    assert b.open_traces == 0


# ---- missing intermediate span (C03) ------------------------------------------------------------

def test_missing_intermediate_reattaches_subtree_to_root_and_flags_it():
    # a → (missing e) → c (chain) → d (llm);  a → b (llm) normal
    c = sp("c", "e", "chain step", 2, 4, {"openinference.span.kind": "CHAIN"})
    b = builder()
    b.add(pairs(agent("a", "", 0, 9), chat("b", "a", 1, 1.5, 10, 1), c, chat("d", "c", 2.5, 3, 20, 2),
                tool("f", "e", 5, 6, "search")), now=0.0)
    t = only(b.poll(GRACE))
    assert t.status == "complete"
    assert tree(t) == [("llm", 1, sid("a")), ("llm", 2, sid("c")), ("search", 1, sid("e"))]
    assert [sorted(s.flags) for s in t.steps] == [[], ["reattached"], ["reattached"]]
    assert "reattached" in t.flags and t.model_calls == 2 and t.input_tokens == 30


def test_orphan_goes_to_innermost_trial_root_containing_it():
    # outer a [0, 100]; separate nested agent s [10, 50]; orphans x in [20, 30], y in [60, 70]
    b = builder()
    b.add(pairs(agent("a", "", 0, 100), agent("5", "a", 10, 50, name="sub", **{"relyscope.trial.separate": True}),
                chat("6", "5", 11, 12, 5, 5), tool("7", "9", 20, 30, "x"), tool("8", "9", 60, 70, "y")), now=0.0)
    trials = {t.root_span_id: t for t in b.poll(GRACE)}
    assert set(trials) == {sid("a"), sid("5")}
    assert trials[sid("5")].actions == ("llm", "x") and trials[sid("5")].trial_id == f"{T}:{sid('5')}"
    assert trials[sid("5")].agent_name == "sub"
    assert trials[sid("a")].actions == ("y",)


# ---- root whose parent was never collected (C04) -----------------------------------------------

def test_root_with_uncollected_parent_is_still_the_root():
    b = builder()
    b.add(pairs(agent("a", "f", 0, 9), chat("b", "a", 1, 3, 812, 41), tool("c", "a", 3.5, 3.9, "get_order_details")),
          now=0.0)
    t = only(b.poll(GRACE))
    assert t.status == "complete" and t.root_span_id == sid("a")
    assert tree(t) == [("llm", 1, sid("a")), ("get_order_details", 1, sid("a"))]
    assert t.flags == frozenset({"remote_parent"})
    assert all(not s.flags for s in t.steps)


# ---- root never arrives (C02), then arrives after the timeout -----------------------------------

def test_root_never_arrives_incomplete_after_timeout_under_virtual_root():
    b = builder()
    b.add(pairs(chat("b", "a", 1, 3, 812, 41), tool("c", "a", 3.5, 3.9, "get_order_details")), now=0.0)
    assert b.poll(ROOT_TIMEOUT - 0.01) == []
    t = only(b.poll(ROOT_TIMEOUT))
    assert t.status == "incomplete" and "missing_root" in t.flags
    assert t.trial_id == f"{T}:virtual" and t.root_span_id == ""
    assert (t.start_ns, t.end_ns) == (BASE + 1 * S, BASE + int(3.9 * S))
    assert t.actions == ("llm", "get_order_details")
    # both point at the one missing parent the virtual root stands for: not "re-attached"
    assert [s.depth for s in t.steps] == [1, 1] and all(not s.flags for s in t.steps)
    assert t.agent_name == "support-agent" and t.agent_version == "1.2"  # resource defaults


def test_root_arriving_after_timeout_replaces_virtual_trial_with_tombstone():
    b = builder()
    b.add(pairs(chat("b", "a", 1, 3, 812, 41), tool("c", "a", 3.5, 3.9, "get_order_details")), now=0.0)
    virtual = only(b.poll(ROOT_TIMEOUT))
    b.add(pairs(agent("a", "", 0, 9)), now=ROOT_TIMEOUT + 1)
    out = b.poll(ROOT_TIMEOUT + 1 + GRACE)
    by_status = {t.status: t for t in out}
    assert sorted(by_status) == ["complete", SUPERSEDED]
    done, tomb = by_status["complete"], by_status[SUPERSEDED]
    assert done.trial_id == f"{T}:{sid('a')}" and done.actions == ("llm", "get_order_details")
    assert done.revision == 2 and done.agent_name == "support_bot"
    # the tombstone carries the old row key so the store replaces it
    assert (tomb.trial_id, tomb.agent_name, tomb.agent_version, tomb.run_kind) == (
        virtual.trial_id, virtual.agent_name, virtual.agent_version, virtual.run_kind)
    assert tomb.steps == () and tomb.revision == 2
    assert sessions([done, tomb]) == {}  # neither has a conversation id; tombstones never count


def test_explicitly_nested_agent_without_outer_root_waits_for_root_timeout():
    b = builder()
    inner = agent("n", "a", 1, 5, name="sub", **{"gen_ai.invocation.is_nested": True})
    b.add(pairs(inner, chat("b", "n", 2, 3, 1, 1)), now=0.0)
    assert b.poll(GRACE) == []
    t = only(b.poll(ROOT_TIMEOUT))
    assert t.status == "incomplete" and "missing_root" in t.flags and t.actions == ("llm",)


def test_nested_workflow_before_its_agent_root_does_not_finalize_early():
    # OpenInference: a CHAIN and its model call exported before the AGENT root that contains them
    chain = sp("c", "a", "chain", 1, 5, {"openinference.span.kind": "CHAIN"})
    b = builder()
    b.add(pairs(chain, chat("d", "c", 2, 3, 4, 4)), now=0.0)
    assert b.poll(GRACE) == []
    b.add(pairs(sp("a", "", "agent", 0, 9, {"openinference.span.kind": "AGENT"})), now=20.0)
    t = only(b.poll(20.0 + GRACE))
    assert t.root_span_id == sid("a") and t.status == "complete" and t.revision == 1
    assert tree(t) == [("llm", 2, sid("c"))]


def test_workflow_root_with_remote_parent_is_complete_after_root_timeout():
    # a chain is the outermost span of the run; its caller's span lives in another service
    b = builder()
    b.add(pairs(sp("c", "f", "chain", 1, 5, {"openinference.span.kind": "CHAIN"}), chat("d", "c", 2, 3)), now=0.0)
    assert b.poll(GRACE) == []
    t = only(b.poll(ROOT_TIMEOUT))
    assert t.status == "complete" and t.root_span_id == sid("c") and t.flags == frozenset({"remote_parent"})


def test_provisional_root_is_superseded_when_the_outer_root_arrives():
    # a nested agent (no is_nested attribute) exported long before the outer run ends
    b = builder()
    b.add(pairs(agent("n", "a", 1, 5, name="sub"), chat("b", "n", 2, 3, 1, 1)), now=0.0)
    first = only(b.poll(GRACE))
    assert first.root_span_id == sid("n") and first.status == "complete"
    b.add(pairs(agent("a", "", 0, 9), tool("c", "a", 6, 7, "lookup")), now=60.0)
    out = b.poll(60.0 + GRACE)
    done = only([t for t in out if t.status == "complete"])
    assert done.root_span_id == sid("a") and done.actions == ("llm", "lookup")
    assert [s.depth for s in done.steps] == [2, 1]
    assert only([t for t in out if t.status == SUPERSEDED]).trial_id == first.trial_id


# ---- late spans after finalization --------------------------------------------------------------

def test_late_span_refinalizes_same_trial_id_without_duplicate():
    b = builder()
    b.add(pairs(agent("a", "", 0, 9), chat("b", "a", 1, 2, 10, 5)), now=0.0)
    first = only(b.poll(GRACE))
    assert first.revision == 1 and first.actions == ("llm",)
    b.add(pairs(tool("c", "a", 3, 4, "refund", "call_9", {"amount": 5})), now=30.0)
    assert b.open_trace_ids() == {T}
    again = only(b.poll(30.0 + GRACE))
    assert again.trial_id == first.trial_id and again.revision == 2
    assert again.actions == ("llm", "refund") and again.steps[1].arguments == {"amount": 5}
    # an exact re-send after finalization changes nothing and re-opens nothing
    assert b.add(pairs(tool("c", "a", 3, 4, "refund", "call_9", {"amount": 5})), now=40.0) == 0
    assert b.open_traces == 0 and b.poll(40.0 + GRACE) == []


def test_resent_span_with_end_replaces_unended_version():
    start = BASE + 1 * S
    unended = CanonicalSpan(trace_id=T, span_id=sid("b"), parent_span_id=sid("a"), name="chat gpt-4o",
                            kind=3, start_ns=start, end_ns=start, raw_end_ns=0,
                            flags=frozenset({"end_before_start", "missing_end"}),
                            attributes={"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 7})
    b = builder()
    b.add(pairs(agent("a", "", 0, 9), unended), now=0.0)
    t = only(b.poll(GRACE))
    # the streamed span that never ended is a visible, flagged step; its usage still counts
    assert t.actions == ("llm",) and t.steps[0].flags == frozenset({"unended"})
    assert "unended" in t.flags and t.input_tokens == 7
    ended = chat("b", "a", 1, 2, 7, 3)
    assert b.add(pairs(ended), now=10.0) == 1
    t2 = only(b.poll(10.0 + GRACE))
    assert t2.steps[0].flags == frozenset() and (t2.input_tokens, t2.output_tokens) == (7, 3)
    assert t2.model_calls == 1 and t2.revision == 2


def test_span_of_evicted_trace_is_not_assembled_alone():
    b = builder()
    b.add(pairs(agent("a", "", 0, 9), chat("b", "a", 1, 2)), now=0.0)
    only(b.poll(GRACE))
    assert b.poll(GRACE + RETAIN) == []  # evicted now
    b.add(pairs(tool("c", "a", 3, 4, "late_tool")), now=GRACE + RETAIN + 1)
    assert b.dropped_late == 1 and b.open_traces == 0
    assert b.flush(GRACE + RETAIN + 2) == []


# ---- several agent runs in one trace ------------------------------------------------------------

def _multi_agent_trace(separate: bool):
    handoff = sp("h", "a", "handoff", 2, 2.1, {"gen_ai.operation.name": "agent_handoff",
                                              "gen_ai.handoff.to_agent": "billing"})
    sub_attrs = {"relyscope.trial.separate": True} if separate else {}
    return pairs(agent("a", "", 0, 20, **{"relyscope.task.id": "t1", "relyscope.outcome": "success"}),
                 chat("b", "a", 1, 1.5, 100, 10), handoff,
                 agent("n", "a", 3, 10, name="billing", **sub_attrs),
                 chat("d", "n", 4, 5, 50, 5), tool("e", "n", 6, 7, "charge"), chat("f", "a", 11, 12, 30, 3))


def test_nested_agent_and_handoff_are_steps_of_the_outer_run():
    t = only(assemble(T, dict((s.span_id, (s, m)) for s, m in _multi_agent_trace(False)), complete=True))
    assert t.root_span_id == sid("a") and t.agent_name == "support_bot"
    assert t.actions == ("llm", "handoff:billing", "llm", "charge", "llm")
    assert [s.depth for s in t.steps] == [1, 1, 2, 2, 1]
    assert (t.model_calls, t.tool_calls, t.input_tokens) == (3, 1, 180)
    assert t.outcome == "success" and t.task_id == "t1" and t.task_id_source == "attribute"


def test_separate_marked_nested_agent_is_its_own_trial():
    trials = assemble(T, dict((s.span_id, (s, m)) for s, m in _multi_agent_trace(True)), complete=True)
    by_root = {t.root_span_id: t for t in trials}
    outer, sub = by_root[sid("a")], by_root[sid("n")]
    assert outer.actions == ("llm", "handoff:billing", "llm") and outer.input_tokens == 130
    assert sub.actions == ("llm", "charge") and sub.input_tokens == 50 and sub.agent_name == "billing"
    assert sub.trial_id == f"{T}:{sid('n')}" and sub.outcome == "unknown"
    assert [s.depth for s in sub.steps] == [1, 1]


def test_workflow_wrapper_without_own_steps_around_separate_trials_is_dropped():
    wf = sp("w", "", "invoke_workflow triage", 0, 30, {"gen_ai.operation.name": "invoke_workflow"})
    runs = [agent("1", "w", 1, 10, name="a1", **{"relyscope.trial.separate": True}), chat("2", "1", 2, 3),
            agent("3", "w", 11, 20, name="a2", **{"relyscope.trial.separate": True}), tool("4", "3", 12, 13, "t")]
    trials = assemble(T, dict((s.span_id, (s, m)) for s, m in pairs(wf, *runs)), complete=True)
    assert sorted((t.agent_name, t.actions) for t in trials) == [("a1", ("llm",)), ("a2", ("t",))]


def test_a_sibling_run_without_steps_or_outcome_is_still_a_trial():
    """Two parentless agent runs in one trace (a session id reused as trace id) are two trials
    (D06). The first, with no model or tool span and no outcome yet (one is posted later), was
    dropped as if it were a wrapper around the second — and the outcome posted for it never
    counted. Under one parent the same; a wrapper that encloses the other run is still dropped."""
    for parent in ("", "p"):
        spans = [agent("1", parent, 0, 5, name="r", **{"relyscope.confidence": 0.7}),
                 agent("2", parent, 6, 9, name="r"), chat("3", "2", 7, 8)]
        trials = assemble(T, dict((s.span_id, (s, m)) for s, m in pairs(*spans)), complete=True)
        assert sorted((t.root_span_id, t.actions, t.confidence) for t in trials) == [
            (sid("1"), (), 0.7), (sid("2"), ("llm",), None)], parent


# ---- model calls without a matching tool span ---------------------------------------------------

def test_requested_tool_call_without_tool_span_is_flagged_until_it_arrives():
    out_msgs = json.dumps([{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "call_1", "name": "get_order", "arguments": {}},
        {"type": "tool_call", "id": "call_2", "name": "get_user", "arguments": {}}]}])
    b = builder()
    b.add(pairs(agent("a", "", 0, 9), chat("b", "a", 1, 2, 5, 5, **{"gen_ai.output.messages": out_msgs}),
                tool("c", "a", 3, 4, "get_order", "call_1")), now=0.0)
    t = only(b.poll(GRACE))
    # the call with no tool span is still a step (a client-side tool: graded by the policy, D15),
    # placed right after the model call that asked for it
    assert t.actions == ("llm", "get_user", "get_order")
    assert t.steps[0].flags == frozenset({"missing_tool_span"}) and "missing_tool_span" in t.flags
    assert t.steps[1].flags == frozenset({"missing_tool_span", "client_side"})
    assert (t.steps[1].tool_call_id, t.steps[1].op, t.steps[1].arguments) == ("call_2", Op.TOOL, {})
    assert t.tool_calls == 2
    b.add(pairs(tool("d", "a", 4, 5, "get_user", "call_2")), now=20.0)
    t2 = only(b.poll(20.0 + GRACE))
    assert t2.actions == ("llm", "get_order", "get_user") and t2.flags == frozenset()


def test_tool_spans_without_call_ids_answer_the_preceding_model_call():
    # OpenLLMetry: the completion lists tool-call ids, its tool spans carry none
    def llm(sid_, start, ids):
        a = {"llm.request.type": "chat", "gen_ai.completion.0.role": "assistant"}
        for j, c in enumerate(ids):
            a[f"gen_ai.completion.0.tool_calls.{j}.id"] = c
        return sp(sid_, "a", "openai.chat", start, start + 0.5, a)

    def ol_tool(sid_, start, name):
        return sp(sid_, "a", f"{name}.tool", start, start + 0.2,
                  {"traceloop.span.kind": "tool", "traceloop.entity.name": name})

    spans = pairs(agent("a", "", 0, 20), llm("1", 1, ["x1", "x2"]), ol_tool("2", 2, "f"), ol_tool("3", 3, "g"),
                  llm("4", 4, ["x3", "x4"]), ol_tool("5", 5, "h"), llm("6", 6, []))
    t = only(assemble(T, {s.span_id: (s, m) for s, m in spans}, complete=True))
    assert t.actions == ("llm", "f", "g", "llm", "h", "llm")
    # first call: two requests, two tool spans before the next model call; second: two requests, one
    assert [sorted(s.flags) for s in t.steps if s.action == "llm"] == [[], ["missing_tool_span"], []]


# ---- totals ------------------------------------------------------------------------------------

def test_wrapping_model_call_and_aggregating_chain_are_not_double_counted():
    chain = sp("c", "a", "chain", 1, 8, {"openinference.span.kind": "CHAIN", "llm.cost.total": 0.5})
    outer = sp("o", "c", "ChatOpenAI", 2, 7, {"openinference.span.kind": "LLM", "llm.token_count.prompt": 40,
                                              "llm.token_count.completion": 4, "llm.cost.total": 0.5})
    inner = sp("i", "o", "openai.chat", 3, 6, {"llm.request.type": "chat", "gen_ai.usage.prompt_tokens": 40,
                                               "gen_ai.usage.completion_tokens": 4,
                                               "openinference.span.kind": "LLM", "llm.cost.total": 0.5})
    t = only(assemble(T, {s.span_id: (s, m) for s, m in pairs(agent("a", "", 0, 9), chain, outer, inner)},
                      complete=True))
    assert t.actions == ("llm",) and t.model_calls == 1
    assert (t.input_tokens, t.output_tokens, t.total_tokens) == (40, 4, 44)
    assert t.cost_usd == 0.5


def test_virtual_root_defaults_do_not_depend_on_arrival_order():
    s1 = sp("b", "a", "chat gpt-4o", 1, 2, {"gen_ai.operation.name": "chat"}, resource={"service.name": "first"})
    s2 = sp("c", "a", "execute_tool x", 3, 4, {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "x"},
            resource={"service.name": "second"})
    for order in ([s1, s2], [s2, s1]):
        t = only(assemble(T, {s.span_id: (s, m) for s, m in pairs(*order)}, complete=False))
        assert t.agent_name == "first"  # the earliest span's service


# ---- sessions ----------------------------------------------------------------------------------

def test_sessions_group_trials_of_several_traces_by_conversation_id():
    t2, t3 = "2" * 32, "3" * 32
    b = builder()
    b.add(pairs(agent("a", "", 10, 19, **{"gen_ai.conversation.id": "sess-42"}), chat("b", "a", 11, 12)), now=0.0)
    b.add(pairs(sp("a", "", "invoke_agent support_bot", 0, 9,
                   {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "sess-42"}, trace=t2)), now=0.0)
    b.add(pairs(sp("a", "", "agent", 5, 6, {"openinference.span.kind": "AGENT", "session.id": "other"}, trace=t3),
                sp("b", "", "x", 1, 2, {"openinference.span.kind": "AGENT"}, trace="4" * 32)), now=0.0)
    groups = sessions(b.poll(GRACE))
    assert list(groups) == ["sess-42", "other"]
    assert [t.trace_id for t in groups["sess-42"]] == [t2, T]
    assert [t.trace_id for t in groups["other"]] == [t3]


# ---- property: arrival order and batching never change the result -------------------------------

def _rich_trace() -> list[CanonicalSpan]:
    out_msgs = json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": "k1"},
                                                           {"type": "tool_call", "id": "k9"}]}])
    return [
        agent("a", "", 0, 50, **{"relyscope.task.id": "t1", "relyscope.outcome": "failure",
                                 "gen_ai.conversation.id": "c1"}),
        sp("w", "a", "plan", 1, 20, {"openinference.span.kind": "CHAIN"}),
        chat("b", "w", 2, 3, 10, 2, **{"gen_ai.output.messages": out_msgs}),
        tool("c", "w", 4, 5, "search", "k1", {"q": "x"}),
        tool("d", "w", 4, 5, "search", "k2", {"q": "y"}),  # same times as c: span id breaks the tie
        agent("n", "a", 21, 30, name="helper"),
        chat("e", "n", 22, 23, 7, 1),
        agent("s", "a", 31, 40, name="solo", **{"relyscope.trial.separate": True}),
        chat("f", "s", 32, 33, 3, 3),
        tool("g", "z", 34, 35, "orphan"),  # parent z never collected; inside s by time
        sp("h", "a", "handoff", 41, 42, {"gen_ai.operation.name": "agent_handoff",
                                        "gen_ai.handoff.to_agent": "billing"}),
        sp("o", "a", "ChatOpenAI", 43, 48, {"openinference.span.kind": "LLM", "llm.token_count.prompt": 5,
                                            "llm.token_count.completion": 5}),
        chat("i", "o", 44, 47, 5, 5),
        tool("j", "y", 49, 49.5, "late_orphan"),  # outside every separate root: main trial
    ]


_RICH = pairs(*_rich_trace())


def _finalize_all_at_once():
    b = builder()
    b.add(_RICH, now=0.0)
    return sorted(b.poll(GRACE), key=lambda t: t.trial_id)


_REFERENCE = _finalize_all_at_once()


def test_reference_trajectory_of_the_rich_trace():
    by_root = {t.root_span_id: t for t in _REFERENCE}
    main, solo = by_root[sid("a")], by_root[sid("s")]
    assert main.actions == ("llm", "search", "search", "llm", "handoff:billing", "llm", "late_orphan")
    assert [s.depth for s in main.steps] == [2, 2, 2, 2, 1, 2, 1]
    assert main.steps[0].flags == frozenset({"missing_tool_span"})  # k9 never executed
    assert [s.arguments for s in main.steps[1:3]] == [{"q": "x"}, {"q": "y"}]
    assert (main.model_calls, main.tool_calls, main.input_tokens, main.output_tokens) == (3, 3, 22, 8)
    assert main.outcome == "failure" and main.conversation_id == "c1"
    assert main.flags == frozenset({"missing_tool_span", "reattached"})
    assert solo.actions == ("llm", "orphan") and solo.steps[1].flags == frozenset({"reattached"})
    assert (solo.input_tokens, solo.output_tokens) == (3, 3)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_permutation_and_batching_gives_the_same_trajectory(data):
    order = data.draw(st.permutations(range(len(_RICH))))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(_RICH) - 1), max_size=len(_RICH) - 1)))
    gaps = data.draw(st.lists(st.floats(0.0, GRACE * 0.99), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    resend = data.draw(st.booleans())
    items = [_RICH[i] for i in order]
    bounds = [0, *cuts, len(items)]
    b = builder()
    now = 0.0
    for k in range(len(bounds) - 1):
        now += gaps[k]
        b.add(items[bounds[k]:bounds[k + 1]], now=now)
        if resend and k % 2:  # at-least-once delivery: a retried batch changes nothing
            b.add(items[bounds[k]:bounds[k + 1]], now=now)
        assert b.poll(now) == []  # nothing due while spans keep coming
    got = sorted(b.poll(now + GRACE), key=lambda t: t.trial_id)
    assert got == _REFERENCE
