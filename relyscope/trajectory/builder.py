"""Assemble spans into trials (metrics.md §1, conventions.md §3), whatever order spans arrive in.

Streaming rules (:class:`TrajectoryBuilder`):

- Spans are buffered per trace. A trace is finalized when it has a *root candidate* (an agent
  span not explicitly marked ``gen_ai.invocation.is_nested=true``, or a parentless workflow span)
  and ``grace_s`` seconds passed without a new span of that trace; or, with no root candidate, when
  ``root_timeout_s`` seconds passed without a new span. Children arriving before their parent (the
  usual OTel export order: a parent ends last) therefore never finalize early: with no root in
  sight the trace waits for the (long) root timeout. Whether a trial is ``complete`` is decided by
  its structure (:func:`assemble`), not by which timer fired: with no agent/workflow root it is
  ``incomplete`` (flag ``missing_root``) under a virtual root spanning min(start)..max(end).
- Spans arriving after finalization re-open the trace; it is re-finalized with ``revision + 1`` and
  the same trial id, so the store (ReplacingMergeTree on the trial key) replaces the earlier row.
  When re-finalization changes a trial's identity (the real root arrives after a provisional root
  or a virtual root was used: the trial id or agent name differs), the earlier trial is re-emitted
  as a *tombstone*: same key, ``status="superseded"``, no steps, flag ``superseded`` — readers
  must skip superseded rows (:func:`sessions` does).
- Exact re-sends (same trace id, span id and content) are ignored; a re-send with different content
  (e.g. a streamed span first exported without an end) replaces the earlier version.
- Finalized traces are kept ``retain_s`` seconds to absorb late spans — and at most
  ``retain_bytes`` (estimated) of them, oldest evicted first (counted in
  :attr:`TrajectoryBuilder.evicted`) — then evicted; a span of an evicted trace arriving within a
  further ``retain_s`` is not assembled (it is still stored by the pipeline) and counted in
  :attr:`TrajectoryBuilder.dropped_late` — re-assembling it alone would replace a full trial with
  a one-span fragment. With ``forget_evicted=True`` an evicted trace is forgotten instead
  (:meth:`TrajectoryBuilder.knows` answers False), for a caller that reloads the trace's stored
  spans before adding a late one (the sidecar's pipeline does).

- Span links tie runs across traces (issue 11): a parentless agent span linked to a span of
  another trace continues that trace's run (a handoff that started a new trace, D03): its trace
  is buffered and assembled with the linked one, its root under the linked span (trial flag
  ``linked_continuation``); an evaluator span (not an agent run) whose
  ``gen_ai.evaluation.result`` events link to a span of another trace grades the trial holding
  that span (D21, flag ``linked_evaluation``), re-finalizing it if it was already assembled.
  Both hold while the linked trace is retained; pending links to traces never seen are dropped
  after ``retain_s``.

Assembly rules (:func:`assemble`, a pure function of the set of spans — arrival order never
matters):

- Root: the earliest agent span with ``is_nested=false``, else the earliest outermost agent/workflow
  span of the trace (its parent need not be collected: a remote parent is flagged
  ``remote_parent``) that is not explicitly nested (``is_nested=true``); when every outermost one
  is, the real root is missing and a virtual root is used. Several runs in one trace are several
  trials: every agent span with ``is_nested=false``, and every outermost agent span under the same
  parent as the first root (sibling runs under one uncollected server span, or parentless runs
  sharing a trace id). Agent spans marked ``relyscope.trial.separate`` root trials of their own;
  all other nested agents and handoffs are steps of the outer run.
- A span whose parent was never collected (a missing intermediate span) is re-attached, with its
  subtree, to the nearest known ancestor: the innermost trial root whose time interval contains
  it, else the main root; its steps (and the trial) are flagged ``reattached``.
- Steps: innermost model calls (``llm``), tool calls (tool name), handoffs (``handoff:<agent>``),
  control decisions (``decision:<state>``) in (start, end, span id) order (metrics.md §3),
  corrected by causality where clocks disagree: a subtree that starts before its parent is shifted
  into the parent's interval, and a tool call never precedes the end of the model call that asked
  for it (:func:`_causal_key`). A tool call the model asked for that no tool span shows (a
  client-side tool) is a step of its own (flags ``missing_tool_span``, ``client_side``); an MCP
  client span and the server span under it (same tool) are one tool call.
- Agent name: ``gen_ai.agent.name`` of the root, else the first nested agent's name (the OpenAI
  Agents SDK bridges name agent spans, not the workflow root), else the root span's name without
  its convention prefix unless a framework default (``LangGraph``), else ``service.name``. A model
  call that requested tool-call ids with no matching tool span in the trace is flagged
  ``missing_tool_span`` (tool spans without a call id, as OpenLLMetry emits, answer the requests of
  the model call they follow, up to the next model call, by count); a span exported without an end (``raw_end_ns == 0``, decoder flag
  ``missing_end``) is flagged ``unended``; each step flag is also a trial flag.

Not thread-safe: owned by one worker thread. The clock is injected (``now`` arguments, seconds on
any monotonic scale) so tests need no sleeps. Per-span cost of :meth:`TrajectoryBuilder.add` is a few
dict operations; a trace is assembled only when it is due (once per finalization).
"""

from __future__ import annotations

import dataclasses
import operator
import pickle
import sys
import threading
import types

import bisect
import hashlib
import heapq
import itertools
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import zstandard

from relyscope.model import MAX_COUNT, CanonicalSpan, Evaluation, Op, SpanSemantics, Step, Trial

__all__ = ["TrajectoryBuilder", "assemble", "assemble_ahead", "task_fingerprint", "sessions", "SUPERSEDED"]

#: ``Trial.status`` of a tombstone row replacing a trial that no longer exists after re-assembly.
SUPERSEDED = "superseded"

_AGENTISH = (Op.AGENT, Op.WORKFLOW)
_WS = re.compile(r"\s+")

Spans = Mapping[str, tuple[CanonicalSpan, SpanSemantics]]


def task_fingerprint(text: str) -> str:
    """Task id from the first user input: SHA-256 of whitespace-collapsed, lower-cased text
    (metrics.md §1, preference 3). Returns 64 hex chars."""
    norm = _WS.sub(" ", text).strip().lower()
    return hashlib.sha256(norm.encode("utf-8", "replace")).hexdigest()


def sessions(trials: Iterable[Trial]) -> dict[str, list[Trial]]:
    """Group trials by conversation id (``gen_ai.conversation.id`` / ``session.id``) for
    session-level views: a session may span several traces.

    Returns ``{conversation_id: [Trial, …]}``, each list in (start_ns, trial_id) order, sessions in
    order of their first trial's start. Trials without a conversation id and superseded tombstones
    are left out. Pure.
    """
    out: dict[str, list[Trial]] = {}
    for t in sorted(trials, key=lambda t: (t.start_ns, t.trial_id)):
        if t.conversation_id and t.status != SUPERSEDED:
            out.setdefault(t.conversation_id, []).append(t)
    return out


def _is_root_candidate(span: CanonicalSpan, sem: SpanSemantics) -> bool:
    """Whether this span lets the trace finalize after the short grace period: an agent span not
    explicitly nested, or a parentless workflow span. (A workflow with a parent is usually a step
    inside a run whose root has not arrived yet.) Only timing depends on this, never the result."""
    if sem.op is Op.AGENT:
        return sem.is_nested is not True
    return sem.op is Op.WORKFLOW and not span.parent_span_id


# ------------------------------------------------------------------------------------------------
# assembly (pure)
# ------------------------------------------------------------------------------------------------


def _order_key(spans: Spans, sid: str) -> tuple[int, int, str]:
    s = spans[sid][0]
    return (s.start_ns, s.end_ns, sid)


def _plan_roots(spans: Spans) -> list[str]:
    """Trial roots: [main, *separate]; main is "" for a virtual root."""
    agentish = [sid for sid, (_, sem) in spans.items() if sem.op in _AGENTISH]
    if not agentish:
        return [""]
    memo: dict[str, bool] = {}  # span id -> has an agentish ancestor among known spans

    def has_agent_ancestor(sid: str) -> bool:
        path, seen = [], {sid}
        parent = spans[sid][0].parent_span_id
        result = False
        while parent and parent in spans and parent not in seen:
            if parent in memo:
                result = memo[parent] or spans[parent][1].op in _AGENTISH
                break
            if spans[parent][1].op in _AGENTISH:
                result = True
                break
            path.append(parent)
            seen.add(parent)
            parent = spans[parent][0].parent_span_id
        for p in path:  # non-agentish spans on the way share the answer
            memo[p] = result
        return result

    explicit = [s for s in agentish if spans[s][1].is_nested is False and spans[s][1].op is Op.AGENT]
    candidates = explicit or [s for s in agentish if not has_agent_ancestor(s)]
    if not candidates:  # agent spans in a parent cycle: take them all
        candidates = agentish
    tops = sorted((s for s in candidates if spans[s][1].is_nested is not True),
                  key=lambda s: _order_key(spans, s))
    if not tops:
        main = ""  # the outermost agent says it is nested: the real root never arrived
        siblings: list[str] = []
    elif explicit:  # each agent span that says it is not nested is a run of its own
        main, siblings = tops[0], tops[1:]
    else:
        # outermost runs under the same parent as the first (both under one uncollected server
        # span, or both parentless: a session id reused as trace id) are sibling runs, one trial
        # each (D06); an outermost agent elsewhere (under a missing intermediate span) stays a
        # step of the run that contains it
        main = tops[0]
        p0 = spans[main][0].parent_span_id
        siblings = [s for s in tops[1:] if spans[s][0].parent_span_id == p0 and spans[s][1].op is Op.AGENT
                    and spans[main][1].op is Op.AGENT]
    separate = set(siblings) | {s for s in agentish if s != main and spans[s][1].separate_trial}
    return [main, *sorted(separate, key=lambda s: _order_key(spans, s))]


def _attach(spans: Spans, roots: list[str]) -> tuple[dict[str, str], dict[str, int], set[str]]:
    """Owner root, depth below it, and the re-attached spans (chain broken by a missing parent)."""
    root_set = {r for r in roots if r}
    main = roots[0]
    owner: dict[str, str] = {r: r for r in root_set}
    depth: dict[str, int] = {r: 0 for r in root_set}
    reattached: set[str] = set()

    # the missing parent a virtual root stands for: the one most top spans point to
    virtual_parent = ""
    if not main:
        counts: dict[str, int] = {}
        for sid, (span, _) in spans.items():
            p = span.parent_span_id
            if p and p not in spans:
                counts[p] = counts.get(p, 0) + 1
        if counts:
            virtual_parent = min(counts, key=lambda p: (-counts[p], p))

    containers = sorted((r for r in root_set), key=lambda r: (spans[r][0].duration_ns, r))

    def top_owner(top: str) -> str:
        s = spans[top][0]
        for r in containers:
            rs = spans[r][0]
            if rs.start_ns <= s.start_ns and s.end_ns <= rs.end_ns:
                return r
        return main

    for sid in spans:
        if sid in owner:
            continue
        path: list[str] = []
        seen: set[str] = set()
        cur = sid
        while True:
            path.append(cur)
            seen.add(cur)
            parent = spans[cur][0].parent_span_id
            if parent in owner:  # a root or an already resolved span
                o, d, broken = owner[parent], depth[parent], parent in reattached
                break
            if not parent or parent in seen:  # a parentless span, or a parent cycle
                o, d, broken = main, 0, bool(parent)
                break
            if parent not in spans:  # an orphan: its parent was never collected
                if parent == virtual_parent:  # …and the virtual root stands for that parent
                    o, d, broken = main, 0, False
                else:
                    o, d, broken = top_owner(cur), 0, True
                break
            cur = parent
        for p in reversed(path):
            d += 1
            owner[p], depth[p] = o, d
            if broken:
                reattached.add(p)
    return owner, depth, reattached


def _llm_wrappers(spans: Spans) -> set[str]:
    """Model-call spans that wrap another model call (they double-report usage): the nearest
    model-call ancestor of every model-call span."""
    out: set[str] = set()
    for sid, (span, sem) in spans.items():
        if sem.op is not Op.LLM:
            continue
        p, seen = span.parent_span_id, {sid}
        while p and p in spans and p not in seen:
            if spans[p][1].op is Op.LLM:
                out.add(p)
                break
            seen.add(p)
            p = spans[p][0].parent_span_id
    return out


def _tool_pairs(spans: Spans) -> dict[str, str]:
    """One tool call seen twice — an MCP client span and the server span under it (``tools/call
    <name>``), or any tool span directly wrapping a tool span of the same name: ``{inner span id:
    outer span id}``. The outer (the agent's own view, with the call id the model asked for) is
    the step; the inner adds its error when the outer has none."""
    out: dict[str, str] = {}
    for sid, (span, sem) in spans.items():
        if sem.op is not Op.TOOL:
            continue
        p = span.parent_span_id
        if p in spans:
            psem = spans[p][1]
            if psem.op is Op.TOOL and p != sid and (psem.tool_name or spans[p][0].name) == (
                    sem.tool_name or span.name):
                out[sid] = p
    return out


def assemble(
    trace_id: str,
    spans: Spans,
    *,
    complete: bool,
    revision: int = 1,
    linked_evaluations: Mapping[str, tuple] | None = None,
) -> list[Trial]:
    """Build the trials of one trace from its spans (keyed by span id). Pure; arrival order of
    ``spans`` never changes the result.

    ``complete=False`` marks every trial ``incomplete`` (a caller that gave up on the trace).
    Without an agent/workflow root the trial is ``incomplete`` under a virtual root (flag
    ``missing_root``, trial id ``{trace_id}:virtual``, interval min(start)..max(end)). Returns []
    when the trace holds no model, tool or handoff span and no agent root (not an agent run).
    ``linked_evaluations``: ``{span id: (Evaluation, …)}`` recorded elsewhere (an evaluator span in
    another trace linking to that span, D21): added to the trial holding the span, flag
    ``linked_evaluation``.
    """
    roots = _plan_roots(spans)
    if not roots[0] and len(roots) == 1:
        if not any(sem.op in (Op.LLM, Op.TOOL, Op.HANDOFF) for _, sem in spans.values()):
            return []
    owner, depth, reattached = _attach(spans, roots)
    wrappers = _llm_wrappers(spans)
    pairs = _tool_pairs(spans)
    tool_ids = {sem.tool_call_id for _, sem in spans.values() if sem.op is Op.TOOL and sem.tool_call_id}
    members: dict[str, list[str]] = {r: [] for r in roots}
    for sid, o in owner.items():
        if sid != o:
            members[o].append(sid)
    trials = []
    for i, root in enumerate(roots):
        t = _build_trial(trace_id, root, members[root], spans, reattached, depth, wrappers, tool_ids,
                         complete=complete and bool(root), revision=revision, pairs=pairs)
        if linked_evaluations:
            extra = [ev for sid in (root, *members[root]) for ev in linked_evaluations.get(sid, ())]
            if extra:
                t = replace(t, evaluations=t.evaluations + tuple(extra),
                            flags=t.flags | {"linked_evaluation"})
        if i == 0 and len(roots) > 1 and not t.steps and t.outcome == "unknown" and _wraps(spans, root, roots[1:]):
            continue  # a wrapper around separate trials with nothing of its own
        trials.append(t)
    return trials


def _wraps(spans: Spans, main: str, others: list[str]) -> bool:
    """Whether ``main`` (the virtual root: "") is an ancestor of one of ``others`` — a wrapper,
    not a sibling run (two runs under one parent, or both parentless, are each a trial, D06: a
    sibling without steps or outcome yet, waiting for a posted one, was dropped)."""
    if not main:
        return True
    for r in others:
        seen, p = {r}, spans[r][0].parent_span_id
        while p and p in spans and p not in seen:
            if p == main:
                return True
            seen.add(p)
            p = spans[p][0].parent_span_id
    return False


def _enclosing_sems(root: str, members: list[str], spans: Spans, depth: dict[str, int]) -> list[SpanSemantics]:
    """Semantics of the spans around a trial's root, nearest first: its ancestors among the
    trace's spans up to the first agent or workflow span (an application's own span wrapping a
    framework's agent span), or, under a virtual root, the trial's top-level spans in start
    order. Their ``relyscope.task.id``, outcome and confidence count when the root has none."""
    if not root:
        return [spans[s][1] for s in sorted((m for m in members if depth.get(m) == 1),
                                            key=lambda m: _order_key(spans, m))]
    out, seen = [], {root}
    parent = spans[root][0].parent_span_id
    # up to the first agent/workflow span: that is another trial's root, whose values are its own
    while parent and parent in spans and parent not in seen and spans[parent][1].op not in _AGENTISH:
        seen.add(parent)
        out.append(spans[parent][1])
        parent = spans[parent][0].parent_span_id
    return out


def _pick_first(rsem: SpanSemantics, above: list[SpanSemantics], attr: str):
    """``attr`` of the root's semantics, else of the nearest enclosing span that has it."""
    for sem in (rsem, *above):
        v = getattr(sem, attr)
        if v is not None and v != "":
            return v
    return None


def _step_action(sid: str, span: CanonicalSpan, sem: SpanSemantics, wrappers: set[str]) -> str | None:
    if sem.op is Op.LLM:
        return None if sid in wrappers else "llm"
    if sem.op is Op.TOOL:
        return sem.tool_name or span.name
    if sem.op is Op.HANDOFF:
        return f"handoff:{sem.handoff_target or span.name}"
    if sem.op is Op.RETRIEVAL:
        return "retrieval"
    if sem.decision:
        return f"decision:{sem.decision}"
    return None


#: Span names frameworks give every run (no agent identity in them).
_GENERIC_RUN_NAMES = frozenset({"langgraph", "agent workflow", "agentexecutor", "runnablesequence",
                                "invoke_agent", "invoke_workflow", "agent run", "workflow", "agent"})
_RUN_NAME_PREFIXES = ("invoke_agent ", "invoke_workflow ", "agent run: ", "agent run ")


def _framework_agent_name(root: str, ordered: list[str], spans: Spans) -> str | None:
    """The agent's own name where its framework records it and the root carries no
    ``gen_ai.agent.name``: the entry agent (the first nested agent span with a name: the OpenAI
    Agents SDK bridges name agent spans, not the workflow root), else the root span's name without
    its convention prefix (``invoke_agent X``, Logfire's ``Agent run: 'X'``, a named LangGraph
    graph) unless it is a framework default (``LangGraph``, ``Agent workflow``)."""
    for sid in ordered:
        sem = spans[sid][1]
        if sem.op is Op.AGENT and sem.agent_name:
            return sem.agent_name
    if not root or spans[root][1].op not in _AGENTISH:
        return None
    name = spans[root][0].name.strip()
    low = name.lower()
    for p in _RUN_NAME_PREFIXES:
        if low.startswith(p):
            name = name[len(p):].strip().strip("'\"")
            break
    if not name or name.lower() in _GENERIC_RUN_NAMES:
        return None
    return name


def _causal_key(steps: list[Step], spans: Spans, members: list[str]):
    """Sort key of steps: start order, corrected by what causality says where clocks disagree
    (a client and a service with skewed clocks): a span's subtree is shifted into its parent's
    interval when it starts before its parent (or ends after it), and a tool call never sorts
    before the end of the model call that requested it (matched by call id). Only the order
    changes; the steps keep their recorded times."""
    shift: dict[str, int] = {}

    def shift_of(sid: str) -> int:
        path: list[str] = []
        seen: set[str] = set()
        cur = sid
        while cur in spans and cur not in shift and cur not in seen:
            path.append(cur)
            seen.add(cur)
            cur = spans[cur][0].parent_span_id
        for n in reversed(path):  # top first: each parent is resolved before its child
            span = spans[n][0]
            p = span.parent_span_id
            if p not in shift or p not in spans:
                shift[n] = 0
                continue
            ps, pshift = spans[p][0], shift[p]
            d = 0
            if ps.start_ns > 0 and span.start_ns > 0:
                lo, hi = ps.start_ns + pshift, ps.end_ns + pshift
                st, en = span.start_ns + pshift, span.end_ns + pshift
                if st < lo:
                    d = lo - st
                elif en > hi and ps.raw_end_ns is None:
                    d = max(hi - en, lo - st)
            shift[n] = pshift + d
        return shift.get(sid, 0)

    requested_by: dict[str, str] = {}
    repeated: set[str] = set()
    for sid in members:
        sem = spans[sid][1]
        if sem.op is Op.LLM:
            for c in sem.requested_tool_calls:
                if c in requested_by and requested_by[c] != sid:
                    repeated.add(c)
                requested_by.setdefault(c, sid)
    for c in repeated:  # an id several model calls asked for says nothing about which one
        del requested_by[c]

    def key(st: Step) -> tuple:
        sh = shift_of(st.span_id) if st.span_id in spans else 0
        start, end = st.start_ns + sh, st.end_ns + sh
        if st.op is Op.TOOL and st.tool_call_id and "client_side" not in st.flags:
            req = requested_by.get(st.tool_call_id)
            if req is not None and req != st.span_id:
                r_end = spans[req][0].end_ns + shift_of(req)
                if start < r_end:
                    start, end = r_end, max(end, r_end)
        return (start, end, st.span_id, "client_side" in st.flags)

    return key


class _Usage:
    """Token sums that stay None until a span reports a count (unknown is not zero)."""

    __slots__ = ("input", "output", "total", "missing")

    def __init__(self) -> None:
        self.input: int | None = None
        self.output: int | None = None
        self.total: int | None = None
        self.missing = 0  # spans added that reported no token count at all

    @property
    def known(self) -> bool:
        return self.input is not None or self.output is not None or self.total is not None

    def add(self, sem: SpanSemantics) -> None:
        i, o, t = sem.input_tokens, sem.output_tokens, sem.total_tokens
        if t is None and i is not None and o is not None:
            t = i + o
        if i is None and o is None and t is None:
            self.missing += 1
            return
        if i is not None:
            self.input = (self.input or 0) + i
        if o is not None:
            self.output = (self.output or 0) + o
        if t is not None:
            self.total = (self.total or 0) + t


def _build_trial(trace_id: str, root: str, members: list[str], spans: Spans, reattached: set[str],
                 depth: dict[str, int], wrappers: set[str], tool_ids: set[str], *, complete: bool,
                 revision: int, pairs: Mapping[str, str] | None = None) -> Trial:
    steps: list[Step] = []
    flags: set[str] = set()
    usage = _Usage()  # model calls
    fallback = _Usage()  # wrapping model calls, then agent spans: used only if no model call reports usage
    agent_usage = _Usage()
    cost: float | None = None
    model_calls = tool_calls = tool_errors = 0
    outcome_sem: list[SpanSemantics] = []
    evaluations: list = []
    first_input: str | None = None
    conversation: str | None = None
    ordered = sorted(members, key=lambda s: (spans[s][0].start_ns, spans[s][0].end_ns, s))  # _order_key
    inner_error = {outer: spans[inner][1].error_type for inner, outer in (pairs or {}).items()
                   if spans[inner][1].error_type}
    # model calls of this trial, and tool spans that carry no call id (OpenLLMetry, …): those can
    # answer the requests of the model call right before them (until the next model call)
    llm_starts = [spans[s][0].start_ns for s in ordered if spans[s][1].op is Op.LLM and s not in wrappers]
    # (a handoff answers the transfer_to_<agent> tool call the model made: the OpenAI Agents SDK)
    anon_tool_starts = sorted(spans[s][0].start_ns for s in ordered
                              if spans[s][1].op in (Op.TOOL, Op.HANDOFF) and not spans[s][1].tool_call_id
                              and not (pairs and s in pairs))
    for sid in ordered:
        span, sem = spans[sid]
        if span.trace_id != trace_id:  # a continuation in a linked trace (D03)
            flags.add("linked_continuation")
        if first_input is None and sem.first_user_input:
            first_input = sem.first_user_input
        if conversation is None and sem.conversation_id:
            conversation = sem.conversation_id
        evaluations.extend(sem.evaluations)
        if sem.outcome is not None or sem.confidence is not None or sem.claimed_success is not None:
            outcome_sem.append(sem)
        action = _step_action(sid, span, sem, wrappers)
        if pairs and sid in pairs:
            action = None  # the server side of a tool call whose client span is the step
        if sem.op is Op.LLM and sid in wrappers:
            fallback.add(sem)
        elif sem.op in _AGENTISH:
            agent_usage.add(sem)
        if sem.cost_usd is not None and sem.op not in _AGENTISH and sid not in wrappers:
            cost = (cost or 0.0) + sem.cost_usd
        if action is None:
            continue
        sflags: set[str] = set()
        if sid in reattached:
            sflags.add("reattached")
        if span.raw_end_ns == 0 or "missing_end" in span.flags:
            sflags.add("unended")
        elif "end_before_start" in span.flags:
            sflags.add("end_before_start")
        requested_only: list[str] = []
        if sem.op is Op.LLM:
            model_calls += 1
            usage.add(sem)
            unmatched_ids = [c for c in sem.requested_tool_calls if c not in tool_ids]
            unmatched = len(unmatched_ids)
            if unmatched:
                nxt = bisect.bisect_right(llm_starts, span.start_ns)
                until = llm_starts[nxt] if nxt < len(llm_starts) else None
                lo = bisect.bisect_left(anon_tool_starts, span.start_ns)
                hi = (bisect.bisect_left(anon_tool_starts, until) if until is not None
                      else len(anon_tool_starts))
                if hi - lo < unmatched:
                    sflags.add("missing_tool_span")
                    requested_only = unmatched_ids[hi - lo:]
        elif sem.op is Op.TOOL:
            tool_calls += 1
            if sem.error_type is None and inner_error.get(sid):
                sem = replace(sem, error_type=inner_error[sid])
            if sem.error_type:
                tool_errors += 1
        flags |= sflags
        if sem.fault_type:
            sflags.add("injected_fault")
        steps.append(Step(
            span_id=sid, parent_span_id=span.parent_span_id, action=action, op=sem.op,
            name=span.name, start_ns=span.start_ns, end_ns=span.end_ns, depth=depth.get(sid, 1),
            tool_name=sem.tool_name, tool_call_id=sem.tool_call_id, arguments=sem.tool_arguments,
            result=sem.tool_result, error=sem.error_type, decision=sem.decision,
            side_effect=sem.side_effect, model=sem.model, input_tokens=sem.input_tokens,
            output_tokens=sem.output_tokens, cost_usd=sem.cost_usd, flags=frozenset(sflags),
            fault_type=sem.fault_type,
        ))
        if requested_only:
            # D15: calls the model asked for that no tool span shows (a client-side tool) are
            # still steps, right after the request, so the policy grades them
            asked = {c[0]: c for c in sem.requested_tools}
            for cid in requested_only:
                req = asked.get(cid)
                if req is None or not req[1]:
                    continue
                tool_calls += 1
                cflags = frozenset({"missing_tool_span", "client_side"})
                flags |= cflags
                steps.append(Step(
                    span_id=sid, parent_span_id=span.parent_span_id, action=req[1], op=Op.TOOL,
                    name=span.name, start_ns=span.end_ns, end_ns=span.end_ns,
                    depth=depth.get(sid, 1), tool_name=req[1], tool_call_id=cid, arguments=req[2],
                    flags=cflags,
                ))

    if root:
        rspan, rsem = spans[root]
        start, end = rspan.start_ns, rspan.end_ns
        if rspan.raw_end_ns == 0 or "missing_end" in rspan.flags:
            flags.add("root_unended")
            end = max([end] + [spans[s][0].end_ns for s in members])
        if rsem.decision and rsem.op is not Op.GUARDRAIL:
            steps.append(Step(span_id=root, parent_span_id=rspan.parent_span_id,
                              action=f"decision:{rsem.decision}", op=rsem.op, name=rspan.name,
                              start_ns=end, end_ns=end, depth=0, decision=rsem.decision))
        if rsem.first_user_input:
            first_input = rsem.first_user_input
        if rsem.conversation_id:
            conversation = rsem.conversation_id
        if rspan.parent_span_id and rspan.parent_span_id not in spans:
            flags.add("remote_parent")
        if rspan.status_code == 2:  # the run itself raised / ended in error
            flags.add("root_error")
        if rsem.cost_usd is not None and cost is None:
            cost = rsem.cost_usd
        root_usage = _Usage()
        root_usage.add(rsem)
        agent_usage = root_usage if root_usage.known else agent_usage
        resource = rspan.resource
    else:
        rsem = SpanSemantics()
        allspans = [spans[s][0] for s in ordered]
        starts = [s.start_ns for s in allspans if s.start_ns > 0] or [s.start_ns for s in allspans]
        start = min(starts, default=0)
        end = max((s.end_ns for s in allspans), default=0)
        flags.add("missing_root")
        resource = allspans[0].resource if allspans else {}

    above = _enclosing_sems(root, members, spans, depth)

    def pick(attr: str):
        v = getattr(rsem, attr)
        if v is not None:
            return v
        for sem in above:  # the application's own span around the run (nearest first)
            if getattr(sem, attr) is not None:
                return getattr(sem, attr)
        for sem in reversed(outcome_sem):  # the root's value wins; else the latest span's
            if getattr(sem, attr) is not None:
                return getattr(sem, attr)
        return None

    task_attr = _pick_first(rsem, above, "task_id")
    if task_attr:
        task_id, task_src = str(task_attr), "attribute"
    elif first_input:
        task_id, task_src = task_fingerprint(first_input), "fingerprint"
    else:
        task_id, task_src = trace_id, "trace"
    outcome = pick("outcome")
    if outcome not in ("success", "failure"):
        outcome = "unknown"
    # unknown usage stays unknown (None), never 0: model calls' usage; else that of wrapping model
    # calls (a Vercel AI SDK outer span); else the agent span's (Claude Agent SDK via Logfire)
    for u in (usage, fallback, agent_usage):
        if u.known:
            break
    else:
        u = usage
    if u is usage and usage.missing and usage.known:
        flags.add("partial_usage")  # some model calls reported no usage: the sums are lower bounds
    # counts are non-negative, so a sum that passed MAX_COUNT stays past it: checked once here, not
    # per span; such a sum is unknown (the store's UInt64 refused it, and it is no count anyway)
    tokens = tuple(None if v is not None and v > MAX_COUNT else v for v in (u.input, u.output, u.total))
    if tokens != (u.input, u.output, u.total):
        flags.add("token_count_overflow")
    steps.sort(key=_causal_key(steps, spans, members))
    return Trial(
        trial_id=str(rsem.trial_id) if rsem.trial_id else f"{trace_id}:{root or 'virtual'}",
        trace_id=trace_id, root_span_id=root, task_id=task_id, task_id_source=task_src,
        agent_name=str(rsem.agent_name or _framework_agent_name(root, ordered, spans)
                       or resource.get("service.name") or "unknown"),
        agent_version=str(rsem.agent_version or resource.get("service.version") or "unknown"),
        run_kind=str(rsem.run_kind or "production"),
        outcome=outcome, outcome_source=pick("outcome_source") if outcome != "unknown" else None,
        outcome_score=pick("outcome_score"), claimed_success=pick("claimed_success"),
        confidence=pick("confidence"), conversation_id=conversation,
        start_ns=start, end_ns=end, steps=tuple(steps),
        input_tokens=tokens[0], output_tokens=tokens[1], total_tokens=tokens[2], cost_usd=cost,
        model_calls=model_calls, tool_calls=tool_calls, tool_errors=tool_errors,
        status="complete" if complete else "incomplete", flags=frozenset(flags),
        shadow_of=rsem.shadow_of, perturbation_family=rsem.perturbation_family,
        perturbation_strength=rsem.perturbation_strength, revision=revision,
        span_count=len(members) + (1 if root else 0),
        evaluations=tuple(evaluations) + (tuple(rsem.evaluations) if root else ()),
        task_input=first_input or None,
    )


# ------------------------------------------------------------------------------------------------
# streaming
# ------------------------------------------------------------------------------------------------

_TrialKey = tuple[str, str, str, str]  # (trial_id, agent, version, run_kind): the store's row key


@dataclass(slots=True)
class _Trace:
    spans: dict[str, tuple[CanonicalSpan, SpanSemantics]] = field(default_factory=dict)
    last_seen: float = 0.0
    dirty: bool = True
    revision: int = 0
    finalized_at: float | None = None
    root_candidates: int = 0  # spans for which _is_root_candidate holds
    emitted: dict[_TrialKey, Trial] = field(default_factory=dict)
    bytes: int = 0  # estimated memory of the decoded spans (_span_bytes)
    last_bytes: int = 0  # memory when last finalized (_pack): what it counts in ``retained_bytes``
    packed: bytes | None = None  # finalized: spans and emitted trials in compact form (_pack)
    open_counted: int = 0  # what this trace adds to ``TrajectoryBuilder.open_bytes`` (0 unless open)
    # assembled ahead (:func:`assemble_ahead`, in a decode process): (its trials, their packed
    # form or None, spans it was made of, spans added since, estimated bytes); None once
    # anything else touched the trace
    ahead: list | None = None


# A decoded span held by the builder (CanonicalSpan without attributes/events, SpanSemantics, its
# dict slot): 1 650-1 750 B for bench_ingest_decode's GenAI spans under CPython 3.11 (tracemalloc,
# tests/test_finalized_cache.py), plus its decoded tool arguments/result and input text.
_SPAN_BASE_BYTES = 1600


def _span_bytes(span: CanonicalSpan, sem: SpanSemantics) -> int:
    """Estimated memory of one decoded buffered span, bytes: a fixed part plus its large strings
    (decoded JSON takes ~3x its text). Used for traces that stay decoded (open traces, and a
    finalized trace that cannot be packed); packed ones count their real size (:func:`_pack`)."""
    n = _SPAN_BASE_BYTES + len(span.name)
    for v, times in ((sem.tool_arguments, 3), (sem.tool_result, 3), (sem.first_user_input, 1)):
        if v is not None:
            n += times * (len(v) if isinstance(v, (str, bytes)) else len(repr(v)))
    return n


# ---- compact form of a finalized trace ----------------------------------------------------------
# A finalized trace is kept only for late spans: re-assembly needs its spans and, for tombstones,
# the header of each trial it emitted (never the steps). Decoded, that is ~2 KB per span in
# Python objects; as one zstd-compressed pickle of plain tuples it is ~50-100 B per span, and its
# size is exact (len of one bytes object), so the byte budget is honest. Built in ~5 us per span
# (bench/README.md, bench_memory.py), unpacked only when a late span (or a re-send) arrives.
_SPAN_PACKED = tuple(f.name for f in dataclasses.fields(CanonicalSpan) if f.name not in ("attributes", "events"))
_SEM_FIELDS = tuple(f.name for f in dataclasses.fields(SpanSemantics))
_TRIAL_PACKED = tuple(f.name for f in dataclasses.fields(Trial) if f.name != "steps")
_get_span = operator.attrgetter(*_SPAN_PACKED)
_get_sem = operator.attrgetter(*_SEM_FIELDS)
_get_trial = operator.attrgetter(*_TRIAL_PACKED)
_I_SEM_EVALS = _SEM_FIELDS.index("evaluations")
_I_TRIAL_EVALS = _TRIAL_PACKED.index("evaluations")
_I_RESOURCE = _SPAN_PACKED.index("resource")
# the _Trace object, its _traces and _finalized slots, the trace id key, the bytes object header
_PACKED_TRACE_OVERHEAD = 560
_PACKED = types.MappingProxyType({})  # spans / emitted of a packed trace: read-only, empty


def assemble_ahead(spans: Sequence[CanonicalSpan], sems: Sequence[SpanSemantics]) -> dict[str, tuple]:
    """What :meth:`TrajectoryBuilder._finalize` would compute for each trace of one batch if the
    batch held the whole trace: ``{trace id: (number of its spans, trials, packed form or None)}``.
    Pure (a decode process runs it beside the decode, off the worker thread); the builder uses an
    entry only when, at finalization, the trace holds exactly these spans, added together in one
    :meth:`~TrajectoryBuilder.add` and touched by nothing else (no other span, re-send, link,
    linked evaluation, continuation or earlier trial) — then ``assemble`` (pure: the same set of
    spans gives the same trials) would return equal trials. Only traces whose root is in the
    batch (the others wait for it, their assembly would be wasted) and with no span link."""
    by_trace: dict[str, dict[str, tuple[CanonicalSpan, SpanSemantics]]] = {}
    rooted: set[str] = set()
    linked: set[str] = set()
    for span, sem in zip(spans, sems):
        tid = span.trace_id
        d = by_trace.get(tid)
        if d is None:
            d = by_trace[tid] = {}
        d[span.span_id] = (span, sem)
        if span.links:
            linked.add(tid)
        if _is_root_candidate(span, sem):
            rooted.add(tid)
    out: dict[str, tuple] = {}
    for tid in rooted - linked:
        d = by_trace[tid]
        trials = assemble(tid, d, complete=True, revision=1)
        headers = {_key(t): replace(t, steps=()) for t in trials}
        try:
            blob = _pack(d, headers)
        except (TypeError, AttributeError, pickle.PicklingError, RecursionError):
            blob = None
        out[tid] = (len(d), _trials_out(trials), blob)
    return out


_TRIAL_FIELDS = tuple(f.name for f in dataclasses.fields(Trial))
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(Step))
_get_trial_all = operator.attrgetter(*_TRIAL_FIELDS)
_get_step = operator.attrgetter(*_STEP_FIELDS)
_I_TRIAL_STEPS = _TRIAL_FIELDS.index("steps")


def _trials_out(trials: list[Trial]) -> list[tuple]:
    """Trials as plain field tuples (steps too): they cross the process boundary ~4x cheaper
    than pickled dataclasses (whose state is set field by field through ``object.__setattr__``)."""
    out = []
    for t in trials:
        tv = list(_get_trial_all(t))
        tv[_I_TRIAL_STEPS] = [_get_step(st) for st in t.steps]
        out.append(tv)
    return out


def _trials_in(wire: list[tuple]) -> list[Trial]:
    """Inverse of :func:`_trials_out` (positional constructors: the same objects)."""
    out = []
    for tv in wire:
        tv = list(tv)
        tv[_I_TRIAL_STEPS] = tuple([Step(*sv) for sv in tv[_I_TRIAL_STEPS]])
        out.append(Trial(*tv))
    return out


def _evals_out(evs: tuple) -> tuple:
    return tuple((e.name, e.score, e.label, e.explanation) for e in evs)


def _evals_in(evs: tuple) -> tuple:
    return tuple(Evaluation(*e) for e in evs)


def _pack(spans: Mapping[str, tuple[CanonicalSpan, SpanSemantics]], emitted: Mapping[_TrialKey, Trial]) -> bytes:
    """The compact form of a finalized trace (see above). Raises TypeError / pickle.PicklingError
    for a value pickle cannot serialize (the trace then stays decoded). Field tuples as they come
    out of one C-level getter (``Op`` members and the shared resource dict are pickled once per
    trace, then by pickle's memo), compressed by zstd level 1 (~4x cheaper than zlib level 1 for
    a smaller blob: 2 us per span of the worker went into ``zlib.compress``)."""
    out_spans = []
    for span, sem in spans.values():
        sv = _get_span(span)
        if type(sv[_I_RESOURCE]) is not dict:
            sv = list(sv)
            sv[_I_RESOURCE] = dict(sv[_I_RESOURCE])
        mv = _get_sem(sem)
        if mv[_I_SEM_EVALS]:
            mv = list(mv)
            mv[_I_SEM_EVALS] = _evals_out(mv[_I_SEM_EVALS])
        out_spans.append((sv, mv))
    out_trials = []
    for t in emitted.values():
        tv = _get_trial(t)
        if tv[_I_TRIAL_EVALS]:
            tv = list(tv)
            tv[_I_TRIAL_EVALS] = _evals_out(tv[_I_TRIAL_EVALS])
        out_trials.append(tv)
    blob = _zstd().compress(pickle.dumps((out_spans, out_trials), protocol=5))
    # zstandard returns its output in a buffer of the compression bound (~4x the blob): keep an
    # exact-size copy, so the memory held is what ``retained_bytes`` counts
    return bytes(memoryview(blob))


def _unpack(blob: bytes) -> tuple[dict[str, tuple[CanonicalSpan, SpanSemantics]], dict[_TrialKey, Trial]]:
    """Inverse of :func:`_pack`: spans keyed by span id (attributes and events empty, as the
    builder holds them) and the emitted trials without their steps."""
    out_spans, out_trials = pickle.loads(_unzstd().decompress(blob))
    spans = {}
    for sv, mv in out_spans:
        span = CanonicalSpan(**dict(zip(_SPAN_PACKED, sv)), attributes=_NO_ATTRS, events=())
        if mv[_I_SEM_EVALS]:
            mv = list(mv)
            mv[_I_SEM_EVALS] = _evals_in(mv[_I_SEM_EVALS])
        spans[span.span_id] = (span, SpanSemantics(*mv))
    emitted = {}
    for tv in out_trials:
        if tv[_I_TRIAL_EVALS]:
            tv = list(tv)
            tv[_I_TRIAL_EVALS] = _evals_in(tv[_I_TRIAL_EVALS])
        t = Trial(**dict(zip(_TRIAL_PACKED, tv)), steps=())
        emitted[_key(t)] = t
    return spans, emitted


_zstd_local = threading.local()  # zstd contexts are not safe for concurrent use: one per thread


def _zstd() -> "zstandard.ZstdCompressor":
    c = getattr(_zstd_local, "c", None)
    if c is None:
        c = _zstd_local.c = zstandard.ZstdCompressor(level=1)
    return c


def _unzstd() -> "zstandard.ZstdDecompressor":
    d = getattr(_zstd_local, "d", None)
    if d is None:
        d = _zstd_local.d = zstandard.ZstdDecompressor()
    return d


def _key(t: Trial) -> _TrialKey:
    return (t.trial_id, t.agent_name, t.agent_version, t.run_kind)


_NO_ATTRS = types.MappingProxyType({})  # shared, read-only


class TrajectoryBuilder:
    """Streaming trial assembly. See the module docstring for the finalization rules.

    Args:
        grace_s: seconds without a new span, once a root candidate has arrived, before finalizing
            (default 5).
        root_timeout_s: seconds without a new span before a trace with no root candidate is
            finalized anyway (``incomplete`` when no root is found; default 300).
        retain_s: seconds a finalized trace is kept to absorb late spans (default 900).
        retain_bytes: bound on the estimated memory of the finalized traces kept, bytes (None:
            unbounded); the oldest are evicted first.
        forget_evicted: forget evicted traces instead of dropping their late spans (module
            docstring).
        open_max_bytes: bound on the estimated memory of the open (not yet finalized) traces,
            bytes (None: unbounded). Beyond it :meth:`poll` finalizes the open traces idle the
            longest — as their timeout would, ``incomplete`` if rootless — until they hold at
            most 90 % of it; a span arriving later re-finalizes its trace as a late span does.

    Attributes:
        dropped_late: spans not assembled because their trace was already evicted.
        evicted: finalized traces evicted (by age or by ``retain_bytes``).
        retained_bytes: estimated memory of the finalized traces kept, bytes.
        open_bytes: estimated memory of the open traces, bytes.
        finalized_early: open traces finalized before their timeout because of ``open_max_bytes``.
    """

    def __init__(self, *, grace_s: float = 5.0, root_timeout_s: float = 300.0, retain_s: float = 900.0,
                 retain_bytes: int | None = None, forget_evicted: bool = False,
                 open_max_bytes: int | None = None):
        self.grace_s = grace_s
        self.open_max_bytes = open_max_bytes
        self.open_bytes = 0
        self.finalized_early = 0
        self.root_timeout_s = root_timeout_s
        self.retain_s = retain_s
        self.retain_bytes = retain_bytes
        self.forget_evicted = forget_evicted
        self.dropped_late = 0
        self.evicted = 0
        self.retained_bytes = 0
        self._traces: dict[str, _Trace] = {}
        self._open: set[str] = set()
        self._due: list[tuple[float, int, str]] = []  # (due time, seq, trace id); lazily invalidated
        self._seq = itertools.count()
        self._finalized: OrderedDict[str, float] = OrderedDict()  # trace id -> finalized_at
        self._evicted: OrderedDict[str, float] = OrderedDict()  # trace id -> evicted at
        self.replaced = 0  # spans that replaced a different span with the same ids
        self.assembled_ahead = 0  # finalizations that took the trials of assemble_ahead
        # D03: a run continued in a new trace tied back by a span link is assembled with the run
        # it continues: continuation trace id -> (buffer trace id, linked span id, root span id)
        self._alias: dict[str, tuple[str, str, str]] = {}
        self._aliased_by: dict[str, set[str]] = {}
        # D21: evaluations on spans of other traces pointing here by a span link:
        # target trace -> {target span id: {evaluator (trace, span): evaluations}}
        self._evals: dict[str, dict[str, dict[tuple[str, str], tuple]]] = {}
        self._evals_seen: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    @property
    def open_traces(self) -> int:
        """Traces holding spans not yet finalized."""
        return len(self._open)

    def open_trace_ids(self) -> set[str]:
        """Ids of traces with spans not yet finalized (a copy), continuation traces assembled with
        an open trace included."""
        out = set(self._open)
        for tid in self._open:
            out |= self._aliased_by.get(tid, set())
        return out

    def _canon(self, trace_id: str) -> str:
        """The trace id whose buffer holds this trace's spans (itself unless a continuation)."""
        a = self._alias.get(trace_id)
        return a[0] if a else trace_id

    def _due_at(self, tr: _Trace) -> float:
        return tr.last_seen + (self.grace_s if tr.root_candidates else self.root_timeout_s)

    def knows(self, trace_id: str) -> bool:
        """Whether this builder holds (or has evicted) state for the trace since it started."""
        if trace_id in self._alias:
            return True
        tr = self._traces.get(trace_id)
        return bool(tr is not None and (tr.spans or tr.packed is not None)) or trace_id in self._evicted

    def remember_emitted(self, trace_id: str, trials: Iterable[Trial]) -> None:
        """Declare trials already stored for a trace (by an earlier process), so that
        re-finalizing it tombstones any of them it no longer produces. Call before :meth:`add`
        of the trace's stored spans."""
        trace_id = self._canon(trace_id)
        tr = self._traces.get(trace_id)
        if tr is None:
            tr = self._traces[trace_id] = _Trace(dirty=False)
        packed = tr.packed is not None
        if packed:
            self._thaw(tr)
        for t in trials:
            tr.emitted.setdefault(_key(t), replace(t, steps=()))  # only tombstones read them
        if packed:
            self._repack(trace_id, tr)

    def add(self, items: Iterable[tuple[CanonicalSpan, SpanSemantics]], now: float,
            ahead: Mapping[str, tuple] | None = None) -> int:
        """Buffer spans (any order, any batching). Returns the number of new spans (not exact
        re-sends). O(1) dict operations per span; nothing is assembled here. ``ahead``:
        :func:`assemble_ahead` of exactly these items, used at finalization where it still holds."""
        new = 0
        touched: dict[str, _Trace] = {}
        thawed: dict[str, _Trace] = {}  # packed traces unpacked to compare re-sends
        created: set[str] = set()  # traces this call began (the only ones ``ahead`` may describe)
        for span, sem in items:
            # keep only what assembly reads: attributes and events (prompts, messages: most of a
            # span's memory) are already in ``sem`` and in the store
            if span.attributes or span.events:
                span = dataclasses.replace(span, attributes=_NO_ATTRS, events=())
            if span.links:
                if sem.evaluations and sem.op not in _AGENTISH:
                    self._link_evaluations(span, sem, touched, now)
                if (sem.op is Op.AGENT and not span.parent_span_id and span.trace_id not in self._alias):
                    self._continue(span, touched)
            tid = span.trace_id
            al = self._alias.get(tid)
            if al is not None:
                tid = al[0]
                if span.span_id == al[2]:  # the continuation's root hangs under the linked span
                    span = dataclasses.replace(span, parent_span_id=al[1])
            tr = touched.get(tid) or self._traces.get(tid)
            if tr is None:
                if tid in self._evicted:
                    self.dropped_late += 1
                    new += 1
                    continue
                tr = self._traces[tid] = _Trace()
                created.add(tid)
                if ahead is not None and al is None:
                    a = ahead.get(tid)
                    if a is not None:
                        tr.ahead = [a[1], a[2], a[0], 0, 0]
            if tr.ahead is not None and (tid not in created or al is not None):
                self._drop_ahead(tr)  # another batch, a continuation: assembled here after all
            if tr.packed is not None and tid not in thawed:
                self._thaw(tr)
                thawed[tid] = tr
            old = tr.spans.get(span.span_id)
            if old is not None and old[0] == span and old[1] == sem:
                continue  # exact re-send: nothing changes
            if old is not None:
                self.replaced += 1  # same ids, different content: the later span wins
            if old is not None and _is_root_candidate(*old):
                tr.root_candidates -= 1
            if _is_root_candidate(span, sem):
                tr.root_candidates += 1
            if old is not None:
                tr.bytes -= _span_bytes(*old)
                if tr.ahead is not None:
                    self._drop_ahead(tr)
            b = _span_bytes(span, sem)
            tr.bytes += b
            if tr.ahead is not None:  # its trials hold about what the spans do: counted as much
                tr.ahead[3] += 1
                tr.ahead[4] += b
                tr.bytes += b
            tr.spans[span.span_id] = (span, sem)
            touched[tid] = tr
            new += 1
        for tid, tr in thawed.items():
            if tid not in touched:  # only exact re-sends: the packed form still holds
                tr.spans, tr.emitted = _PACKED, _PACKED
        for tid, tr in touched.items():
            if tr.packed is not None:  # re-opened: decoded until finalized again
                if tid not in thawed:
                    self._thaw(tr)
                tr.packed = None
            tr.last_seen = now
            if not tr.dirty:
                tr.dirty = True
                if self._finalized.pop(tid, None) is not None:
                    self.retained_bytes -= tr.last_bytes
            self._open.add(tid)
            self.open_bytes += tr.bytes - tr.open_counted
            tr.open_counted = tr.bytes
            heapq.heappush(self._due, (self._due_at(tr), next(self._seq), tid))
        return new

    def _link_evaluations(self, span: CanonicalSpan, sem: SpanSemantics, touched: dict, now: float) -> None:
        """D21: an evaluator span whose evaluations point at spans of other traces by span links:
        remember them for those traces (re-finalizing a trace already assembled)."""
        for lt, ls in span.links:
            if lt == span.trace_id:
                continue
            target = self._canon(lt)
            per_span = self._evals.setdefault(target, {}).setdefault(ls, {})
            if per_span.get(span.key) == sem.evaluations:
                continue  # a re-send
            per_span[span.key] = sem.evaluations
            self._evals_seen[target] = now
            self._evals_seen.move_to_end(target)
            tr = touched.get(target) or self._traces.get(target)
            if tr is not None and (tr.spans or tr.packed is not None):
                touched[target] = tr

    def _continue(self, span: CanonicalSpan, touched: dict) -> None:
        """D03: a parentless agent span linked to a span of another trace starts a continuation
        of that trace's run (a handoff that began a new trace): its trace is assembled with the
        linked one, its root under the linked span. Not when the linked trace is already evicted
        (it is then assembled on its own, as before)."""
        link = next(((lt, ls) for lt, ls in span.links if lt != span.trace_id), None)
        if link is None:
            return
        target = self._canon(link[0])
        own = span.trace_id
        if target == own or target in self._evicted or own in self._aliased_by:
            return
        self._alias[own] = (target, link[1], span.span_id)
        self._aliased_by.setdefault(target, set()).add(own)
        old = self._traces.pop(own, None)
        if old is not None and old.packed is not None:
            self._thaw(old)
        touched.pop(own, None)
        self._open.discard(own)
        if old is not None:
            self.open_bytes -= old.open_counted
            old.open_counted = 0
        if self._finalized.pop(own, None) is not None and old is not None:
            self.retained_bytes -= old.last_bytes
        pending = self._evals.pop(own, None)
        if pending:
            dst = self._evals.setdefault(target, {})
            for sid, per in pending.items():
                dst.setdefault(sid, {}).update(per)
        tr = self._traces.get(target)
        if old is None:
            return
        if tr is None:
            tr = self._traces[target] = _Trace()
        if tr.packed is not None:
            self._thaw(tr)
            tr.packed = None  # touched below: re-finalized
        for sid, (sp, sm) in old.spans.items():  # spans of the continuation that came first
            if sid in tr.spans:
                continue
            if sid == span.span_id:
                sp = dataclasses.replace(sp, parent_span_id=link[1])
            tr.spans[sid] = (sp, sm)
            tr.bytes += _span_bytes(sp, sm)
            if _is_root_candidate(sp, sm):
                tr.root_candidates += 1
        for k, t in old.emitted.items():  # its provisional trials are tombstoned on finalize
            tr.emitted.setdefault(k, t)
        touched[target] = tr

    def poll(self, now: float) -> list[Trial]:
        """Finalize what is due at ``now``; evict finalized traces past retention. Cost is
        proportional to the traces due, not to the traces buffered."""
        out: list[Trial] = []
        while self._due and self._due[0][0] <= now:
            _, _, tid = heapq.heappop(self._due)
            tr = self._traces.get(tid)
            if tr is None or not tr.dirty or self._due_at(tr) > now:
                continue  # stale entry: a newer one is in the heap, or already finalized
            out.extend(self._finalize(tid, tr, now))
        if self.open_max_bytes is not None and self.open_bytes > self.open_max_bytes:
            out.extend(self._finalize_oldest(now))
        while self._finalized:
            tid, at = next(iter(self._finalized.items()))
            over = self.retain_bytes is not None and self.retained_bytes > self.retain_bytes
            if now - at < self.retain_s and not over:
                break
            del self._finalized[tid]
            tr = self._traces.pop(tid, None)
            if tr is not None:
                self.retained_bytes -= tr.last_bytes
            self.evicted += 1
            if not self.forget_evicted:
                self._evicted[tid] = now
            self._evals.pop(tid, None)
            self._evals_seen.pop(tid, None)
            for b in self._aliased_by.pop(tid, ()):
                self._alias.pop(b, None)
                if not self.forget_evicted:
                    self._evicted[b] = now  # a late span of the continuation is not assembled alone
        while self._evicted:
            tid, at = next(iter(self._evicted.items()))
            if now - at < self.retain_s:
                break
            del self._evicted[tid]
        # evaluations for traces never seen: kept retain_s, then dropped (bounded memory)
        while self._evals_seen:
            tid, at = next(iter(self._evals_seen.items()))
            if now - at < self.retain_s:
                break
            del self._evals_seen[tid]
            if tid not in self._traces:
                self._evals.pop(tid, None)
        return out

    def _finalize_oldest(self, now: float) -> list[Trial]:
        """Finalize the open traces idle the longest until the open ones hold ≤ 90 % of
        ``open_max_bytes``. Cost: one pass over the open traces, only when over the bound."""
        target = 0.9 * self.open_max_bytes
        out: list[Trial] = []
        for tid in sorted(self._open, key=lambda t: (self._traces[t].last_seen, t)):
            if self.open_bytes <= target:
                break
            out.extend(self._finalize(tid, self._traces[tid], now))
            self.finalized_early += 1
        return out

    def flush(self, now: float = 0.0) -> list[Trial]:
        """Finalize every open trace now (end of input), complete or not."""
        out: list[Trial] = []
        for tid in sorted(self._open):
            out.extend(self._finalize(tid, self._traces[tid], now))
        return out

    def _linked(self, tid: str) -> dict[str, tuple] | None:
        per = self._evals.get(tid)
        if not per:
            return None
        return {sid: tuple(ev for _, evs in sorted(by_src.items()) for ev in evs)
                for sid, by_src in per.items()}

    def _finalize(self, tid: str, tr: _Trace, now: float) -> list[Trial]:
        tr.revision += 1
        tr.dirty = False
        tr.finalized_at = now
        self._open.discard(tid)
        self.open_bytes -= tr.open_counted
        tr.open_counted = 0
        if tid in self._finalized:
            self.retained_bytes -= tr.last_bytes
        self._finalized[tid] = now
        self._finalized.move_to_end(tid)
        if tr.packed is not None:  # defensive: every path that touches a trace unpacks it
            self._thaw(tr)
            tr.packed = None
        ahead, linked = tr.ahead, self._linked(tid)
        if ahead is not None:
            self._drop_ahead(tr)
            if not (ahead[2] == ahead[3] == len(tr.spans) and tr.revision == 1 and not tr.emitted
                    and linked is None and tid not in self._aliased_by):
                ahead = None
        if ahead is not None:  # what assemble would return for this very set of spans
            trials = _trials_in(ahead[0])
            self.assembled_ahead += 1
        else:
            # completeness is structural: a trial is incomplete when its root is missing (virtual root)
            trials = assemble(tid, tr.spans, complete=True, revision=tr.revision, linked_evaluations=linked)
        emitted = {_key(t): t for t in trials}
        tombstones = [
            replace(old, status=SUPERSEDED, steps=(), flags=frozenset({SUPERSEDED}), revision=tr.revision)
            for k, old in tr.emitted.items() if k not in emitted
        ]
        # kept for late spans: trial headers only (tombstones never read steps), all packed
        tr.emitted = {k: replace(t, steps=()) for k, t in emitted.items()}
        if ahead is not None and ahead[1] is not None:  # packed ahead too: the same spans and headers
            tr.packed = ahead[1]
            tr.spans, tr.emitted = _PACKED, _PACKED
            tr.last_bytes = sys.getsizeof(ahead[1]) + _PACKED_TRACE_OVERHEAD
        else:
            self._pack_trace(tr)
        self.retained_bytes += tr.last_bytes
        return trials + tombstones

    def _drop_ahead(self, tr: _Trace) -> None:
        """Forget a trace's assembly made ahead (and the memory counted for it)."""
        tr.bytes -= tr.ahead[4]
        tr.ahead = None

    def _pack_trace(self, tr: _Trace) -> None:
        """Replace a finalized trace's decoded spans and trials by their compact form; set
        ``last_bytes`` to its memory (exact for the bytes; a measured constant for the rest).
        A trace pickle cannot serialize stays decoded, counted by estimate (``bytes``)."""
        try:
            blob = _pack(tr.spans, tr.emitted)
        except (TypeError, AttributeError, pickle.PicklingError, RecursionError):
            tr.last_bytes = tr.bytes + _PACKED_TRACE_OVERHEAD
            return
        tr.packed = blob
        tr.spans, tr.emitted = _PACKED, _PACKED
        tr.last_bytes = sys.getsizeof(blob) + _PACKED_TRACE_OVERHEAD

    def _thaw(self, tr: _Trace) -> None:
        """Decode a packed trace's spans and trials (``packed`` is kept: the caller clears it
        when the trace changes)."""
        tr.spans, tr.emitted = _unpack(tr.packed)

    def _repack(self, tid: str, tr: _Trace) -> None:
        """Pack a finalized trace again after changing its trials, keeping the accounting."""
        tr.packed = None
        held = tid in self._finalized
        if held:
            self.retained_bytes -= tr.last_bytes
        self._pack_trace(tr)
        if held:
            self.retained_bytes += tr.last_bytes
