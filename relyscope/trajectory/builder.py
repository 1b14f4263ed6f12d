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

Assembly rules (:func:`assemble`, a pure function of the set of spans — arrival order never
matters):

- Root: the earliest agent span with ``is_nested=false``, else the earliest outermost agent/workflow
  span of the trace (its parent need not be collected: a remote parent is flagged
  ``remote_parent``). If that span is itself explicitly nested (``is_nested=true``) the real root
  is missing and a virtual root is used. Agent spans marked ``relyscope.trial.separate`` root
  trials of their own; all other nested agents and handoffs are steps of the outer run.
- A span whose parent was never collected (a missing intermediate span) is re-attached, with its
  subtree, to the nearest known ancestor: the innermost trial root whose time interval contains
  it, else the main root; its steps (and the trial) are flagged ``reattached``.
- Steps: innermost model calls (``llm``), tool calls (tool name), handoffs (``handoff:<agent>``),
  control decisions (``decision:<state>``) in (start, end, span id) order (metrics.md §3). A model
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
import types

import bisect
import hashlib
import heapq
import itertools
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from relyscope.model import CanonicalSpan, Op, SpanSemantics, Step, Trial

__all__ = ["TrajectoryBuilder", "assemble", "task_fingerprint", "sessions", "SUPERSEDED"]

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
    main = min(candidates, key=lambda s: _order_key(spans, s))
    if spans[main][1].is_nested is True:
        main = ""  # the outermost agent says it is nested: the real root never arrived
    separate = sorted((s for s in agentish if s != main and spans[s][1].separate_trial),
                      key=lambda s: _order_key(spans, s))
    return [main, *separate]


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


def assemble(
    trace_id: str,
    spans: Spans,
    *,
    complete: bool,
    revision: int = 1,
) -> list[Trial]:
    """Build the trials of one trace from its spans (keyed by span id). Pure; arrival order of
    ``spans`` never changes the result.

    ``complete=False`` marks every trial ``incomplete`` (a caller that gave up on the trace).
    Without an agent/workflow root the trial is ``incomplete`` under a virtual root (flag
    ``missing_root``, trial id ``{trace_id}:virtual``, interval min(start)..max(end)). Returns []
    when the trace holds no model, tool or handoff span and no agent root (not an agent run).
    """
    roots = _plan_roots(spans)
    if not roots[0] and len(roots) == 1:
        if not any(sem.op in (Op.LLM, Op.TOOL, Op.HANDOFF) for _, sem in spans.values()):
            return []
    owner, depth, reattached = _attach(spans, roots)
    wrappers = _llm_wrappers(spans)
    tool_ids = {sem.tool_call_id for _, sem in spans.values() if sem.op is Op.TOOL and sem.tool_call_id}
    members: dict[str, list[str]] = {r: [] for r in roots}
    for sid, o in owner.items():
        if sid != o:
            members[o].append(sid)
    trials = []
    for i, root in enumerate(roots):
        t = _build_trial(trace_id, root, members[root], spans, reattached, depth, wrappers, tool_ids,
                         complete=complete and bool(root), revision=revision)
        if i == 0 and len(roots) > 1 and not t.steps and t.outcome == "unknown":
            continue  # a wrapper around separate trials with nothing of its own
        trials.append(t)
    return trials


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


def _build_trial(trace_id: str, root: str, members: list[str], spans: Spans, reattached: set[str],
                 depth: dict[str, int], wrappers: set[str], tool_ids: set[str], *, complete: bool,
                 revision: int) -> Trial:
    steps: list[Step] = []
    flags: set[str] = set()
    in_tok = out_tok = tot_tok = 0
    cost: float | None = None
    model_calls = tool_calls = tool_errors = 0
    outcome_sem: list[SpanSemantics] = []
    evaluations: list = []
    first_input: str | None = None
    conversation: str | None = None
    ordered = sorted(members, key=lambda s: _order_key(spans, s))
    # model calls of this trial, and tool spans that carry no call id (OpenLLMetry, …): those can
    # answer the requests of the model call right before them (until the next model call)
    llm_starts = [spans[s][0].start_ns for s in ordered if spans[s][1].op is Op.LLM and s not in wrappers]
    anon_tool_starts = sorted(spans[s][0].start_ns for s in ordered
                              if spans[s][1].op is Op.TOOL and not spans[s][1].tool_call_id)
    for sid in ordered:
        span, sem = spans[sid]
        if first_input is None and sem.first_user_input:
            first_input = sem.first_user_input
        if conversation is None and sem.conversation_id:
            conversation = sem.conversation_id
        evaluations.extend(sem.evaluations)
        if any(v is not None for v in (sem.outcome, sem.confidence, sem.claimed_success)):
            outcome_sem.append(sem)
        action = _step_action(sid, span, sem, wrappers)
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
        if sem.op is Op.LLM:
            model_calls += 1
            in_tok += sem.input_tokens or 0
            out_tok += sem.output_tokens or 0
            tot_tok += sem.total_tokens if sem.total_tokens is not None else (
                (sem.input_tokens or 0) + (sem.output_tokens or 0))
            unmatched = sum(1 for c in sem.requested_tool_calls if c not in tool_ids)
            if unmatched:
                nxt = bisect.bisect_right(llm_starts, span.start_ns)
                until = llm_starts[nxt] if nxt < len(llm_starts) else None
                lo = bisect.bisect_left(anon_tool_starts, span.start_ns)
                hi = (bisect.bisect_left(anon_tool_starts, until) if until is not None
                      else len(anon_tool_starts))
                if hi - lo < unmatched:
                    sflags.add("missing_tool_span")
        elif sem.op is Op.TOOL:
            tool_calls += 1
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
        if rsem.cost_usd is not None and cost is None:
            cost = rsem.cost_usd
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
    steps.sort(key=lambda s: (s.start_ns, s.end_ns, s.span_id))
    return Trial(
        trial_id=str(rsem.trial_id) if rsem.trial_id else f"{trace_id}:{root or 'virtual'}",
        trace_id=trace_id, root_span_id=root, task_id=task_id, task_id_source=task_src,
        agent_name=str(rsem.agent_name or resource.get("service.name") or "unknown"),
        agent_version=str(rsem.agent_version or resource.get("service.version") or "unknown"),
        run_kind=str(rsem.run_kind or "production"),
        outcome=outcome, outcome_source=pick("outcome_source") if outcome != "unknown" else None,
        outcome_score=pick("outcome_score"), claimed_success=pick("claimed_success"),
        confidence=pick("confidence"), conversation_id=conversation,
        start_ns=start, end_ns=end, steps=tuple(steps),
        input_tokens=in_tok, output_tokens=out_tok, total_tokens=tot_tok, cost_usd=cost,
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
    bytes: int = 0  # estimated memory (_span_bytes)
    last_bytes: int = 0  # ``bytes`` when last finalized: what it counts in ``retained_bytes``


_SPAN_BASE_BYTES = 700  # a buffered span, its semantics and its share of the emitted trial (measured)


def _span_bytes(span: CanonicalSpan, sem: SpanSemantics) -> int:
    """Estimated memory of one buffered span, bytes: a fixed part plus its large strings (tool
    arguments and results count twice: they are in the emitted trial's steps too)."""
    n = _SPAN_BASE_BYTES + len(span.name)
    for v, times in ((sem.tool_arguments, 2), (sem.tool_result, 2), (sem.first_user_input, 1)):
        if v is not None:
            n += times * (len(v) if isinstance(v, (str, bytes)) else len(repr(v)))
    return n


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

    Attributes:
        dropped_late: spans not assembled because their trace was already evicted.
        evicted: finalized traces evicted (by age or by ``retain_bytes``).
        retained_bytes: estimated memory of the finalized traces kept, bytes.
    """

    def __init__(self, *, grace_s: float = 5.0, root_timeout_s: float = 300.0, retain_s: float = 900.0,
                 retain_bytes: int | None = None, forget_evicted: bool = False):
        self.grace_s = grace_s
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

    def __len__(self) -> int:
        return len(self._open)

    @property
    def open_traces(self) -> int:
        """Traces holding spans not yet finalized."""
        return len(self._open)

    def open_trace_ids(self) -> set[str]:
        """Ids of traces with spans not yet finalized (a copy)."""
        return set(self._open)

    def _due_at(self, tr: _Trace) -> float:
        return tr.last_seen + (self.grace_s if tr.root_candidates else self.root_timeout_s)

    def knows(self, trace_id: str) -> bool:
        """Whether this builder holds (or has evicted) state for the trace since it started."""
        tr = self._traces.get(trace_id)
        return bool(tr is not None and tr.spans) or trace_id in self._evicted

    def remember_emitted(self, trace_id: str, trials: Iterable[Trial]) -> None:
        """Declare trials already stored for a trace (by an earlier process), so that
        re-finalizing it tombstones any of them it no longer produces. Call before :meth:`add`
        of the trace's stored spans."""
        tr = self._traces.get(trace_id)
        if tr is None:
            tr = self._traces[trace_id] = _Trace(dirty=False)
        for t in trials:
            tr.emitted.setdefault(_key(t), t)

    def add(self, items: Iterable[tuple[CanonicalSpan, SpanSemantics]], now: float) -> int:
        """Buffer spans (any order, any batching). Returns the number of new spans (not exact
        re-sends). O(1) dict operations per span; nothing is assembled here."""
        new = 0
        touched: dict[str, _Trace] = {}
        for span, sem in items:
            # keep only what assembly reads: attributes and events (prompts, messages: most of a
            # span's memory) are already in ``sem`` and in the store
            if span.attributes or span.events:
                span = dataclasses.replace(span, attributes=_NO_ATTRS, events=())
            tid = span.trace_id
            tr = touched.get(tid) or self._traces.get(tid)
            if tr is None:
                if tid in self._evicted:
                    self.dropped_late += 1
                    new += 1
                    continue
                tr = self._traces[tid] = _Trace()
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
            tr.bytes += _span_bytes(span, sem)
            tr.spans[span.span_id] = (span, sem)
            touched[tid] = tr
            new += 1
        for tid, tr in touched.items():
            tr.last_seen = now
            if not tr.dirty:
                tr.dirty = True
                if self._finalized.pop(tid, None) is not None:
                    self.retained_bytes -= tr.last_bytes
            self._open.add(tid)
            heapq.heappush(self._due, (self._due_at(tr), next(self._seq), tid))
        return new

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
        while self._evicted:
            tid, at = next(iter(self._evicted.items()))
            if now - at < self.retain_s:
                break
            del self._evicted[tid]
        return out

    def flush(self, now: float = 0.0) -> list[Trial]:
        """Finalize every open trace now (end of input), complete or not."""
        out: list[Trial] = []
        for tid in sorted(self._open):
            out.extend(self._finalize(tid, self._traces[tid], now))
        return out

    def _finalize(self, tid: str, tr: _Trace, now: float) -> list[Trial]:
        tr.revision += 1
        tr.dirty = False
        tr.finalized_at = now
        self._open.discard(tid)
        if tid in self._finalized:
            self.retained_bytes -= tr.last_bytes
        self._finalized[tid] = now
        self._finalized.move_to_end(tid)
        tr.last_bytes = tr.bytes
        self.retained_bytes += tr.bytes
        # completeness is structural: a trial is incomplete when its root is missing (virtual root)
        trials = assemble(tid, tr.spans, complete=True, revision=tr.revision)
        emitted = {_key(t): t for t in trials}
        tombstones = [
            replace(old, status=SUPERSEDED, steps=(), flags=frozenset({SUPERSEDED}), revision=tr.revision)
            for k, old in tr.emitted.items() if k not in emitted
        ]
        tr.emitted = emitted
        return trials + tombstones
