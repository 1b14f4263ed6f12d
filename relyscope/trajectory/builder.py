"""Assemble spans into trials (metrics.md §1, conventions.md §3).

The builder buffers spans per trace, whatever order they arrive in, and finalizes a trial when

- its root agent span has arrived (an exported span has ended) and ``grace_s`` seconds have passed
  without a new span of that trace, or
- no root has arrived ``root_timeout_s`` seconds after the trace's last span: the trial is
  finalized ``incomplete`` (flag ``missing_root``) under a virtual root spanning min(start)..max(end).

Spans that arrive after finalization re-open the trace; it is re-finalized after the grace period
with ``revision + 1``, and the store replaces the earlier row (ReplacingMergeTree on trial id), so a
late span never duplicates a trial. Re-sent spans (same trace id and span id) are deduplicated.

Not thread-safe: owned by one worker thread. The clock is injected (``now`` arguments, seconds on
any monotonic scale) so tests need no sleeps.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Iterable

from relyscope.model import CanonicalSpan, Op, SpanSemantics, Step, Trial

__all__ = ["TrajectoryBuilder", "assemble", "task_fingerprint"]

_AGENTISH = (Op.AGENT, Op.WORKFLOW)
_WS = re.compile(r"\s+")


def task_fingerprint(text: str) -> str:
    """Task id from the first user input: SHA-256 of whitespace-collapsed, lower-cased text
    (metrics.md §1, preference 3). Returns 64 hex chars."""
    norm = _WS.sub(" ", text).strip().lower()
    return hashlib.sha256(norm.encode("utf-8", "replace")).hexdigest()


@dataclass(slots=True)
class _Trace:
    spans: dict[str, tuple[CanonicalSpan, SpanSemantics]] = field(default_factory=dict)
    last_seen: float = 0.0
    dirty: bool = True
    revision: int = 0
    finalized_at: float | None = None


def _has_root(spans: dict[str, tuple[CanonicalSpan, SpanSemantics]]) -> bool:
    return any(sem.op in _AGENTISH for _, sem in spans.values())


def _roots(spans: dict[str, tuple[CanonicalSpan, SpanSemantics]]) -> list[str]:
    """Span ids that root a trial: the explicit root (is_nested=False) or the outermost agent span,
    plus nested agent runs marked ``relyscope.trial.separate``."""
    agentish = [sid for sid, (_, sem) in spans.items() if sem.op in _AGENTISH]
    if not agentish:
        return []

    def agent_ancestor(sid: str) -> str | None:
        seen = set()
        parent = spans[sid][0].parent_span_id
        while parent and parent in spans and parent not in seen:
            seen.add(parent)
            if spans[parent][1].op in _AGENTISH:
                return parent
            parent = spans[parent][0].parent_span_id
        return None

    explicit = [s for s in agentish if spans[s][1].is_nested is False and spans[s][1].op is Op.AGENT]
    outer = [s for s in agentish if agent_ancestor(s) is None]
    # an explicit root (gen_ai.invocation.is_nested=false) wins; else the outermost agent span
    # Prefer an outermost agent over an outermost workflow wrapper only when told to (is_nested);
    # otherwise the outermost span of the run is the root.
    candidates = explicit or outer
    main = min(candidates, key=lambda s: (spans[s][0].start_ns, s))
    roots = [main]
    roots += [s for s in agentish if s != main and spans[s][1].separate_trial]
    return roots


def assemble(
    trace_id: str,
    spans: dict[str, tuple[CanonicalSpan, SpanSemantics]],
    *,
    complete: bool,
    revision: int = 1,
) -> list[Trial]:
    """Build the trials of one trace from its spans (keyed by span id).

    ``complete=False`` builds an ``incomplete`` trial under a virtual root when no agent span
    exists. Returns [] when the trace holds no agent, model or tool span (not an agent run).
    """
    roots = _roots(spans)
    if not roots:
        if not any(sem.op in (Op.LLM, Op.TOOL, Op.HANDOFF) for _, sem in spans.values()):
            return []
        roots = [""]  # virtual root
    root_set = set(roots)

    # owner trial of each span: walk up to the nearest root; spans whose chain breaks (missing
    # parent) are re-attached to the main root and flagged.
    owner: dict[str, str] = {}
    reattached: set[str] = set()
    depth: dict[str, int] = {}
    for sid in spans:
        if sid in root_set:
            continue
        cur, d, seen = sid, 0, set()
        while True:
            parent = spans[cur][0].parent_span_id
            d += 1
            if parent in root_set:
                owner[sid] = parent
                break
            if not parent or parent not in spans or parent in seen:
                owner[sid] = roots[0]
                if parent and parent not in spans:
                    reattached.add(sid)
                break
            seen.add(parent)
            cur = parent
        depth[sid] = d

    # innermost LLM spans only count as model calls (wrappers double-report usage)
    llm_parents = set()
    for sid, (span, sem) in spans.items():
        if sem.op is Op.LLM:
            p = span.parent_span_id
            seen = set()
            while p and p in spans and p not in seen:
                seen.add(p)
                if spans[p][1].op is Op.LLM:
                    llm_parents.add(p)
                p = spans[p][0].parent_span_id

    trials = []
    for root in roots:
        members = [sid for sid, o in owner.items() if o == root]
        trials.append(
            _build_trial(trace_id, root, members, spans, reattached, depth, llm_parents,
                         complete=complete and root != "", revision=revision)
        )
    return trials


def _build_trial(trace_id, root, members, spans, reattached, depth, llm_parents, *, complete, revision):
    steps: list[Step] = []
    tool_call_ids = {spans[s][1].tool_call_id for s in members if spans[s][1].op is Op.TOOL}
    flags: set[str] = set()
    in_tok = out_tok = tot_tok = 0
    cost = None
    model_calls = tool_calls = tool_errors = 0
    outcome_sem: list[SpanSemantics] = []
    first_input: str | None = None
    ordered = sorted(members, key=lambda s: (spans[s][0].start_ns, spans[s][0].end_ns, s))
    for sid in ordered:
        span, sem = spans[sid]
        sflags = set()
        if sid in reattached:
            sflags.add("reattached")
        if span.raw_end_ns == 0:
            sflags.add("unended")
        if "end_before_start" in span.flags and span.raw_end_ns != 0:
            sflags.add("end_before_start")
        if first_input is None and sem.first_user_input:
            first_input = sem.first_user_input
        if any(v is not None for v in (sem.outcome, sem.confidence, sem.claimed_success)):
            outcome_sem.append(sem)
        action = None
        if sem.op is Op.LLM and sid not in llm_parents:
            action = "llm"
            model_calls += 1
            in_tok += sem.input_tokens or 0
            out_tok += sem.output_tokens or 0
            tot_tok += sem.total_tokens if sem.total_tokens is not None else (
                (sem.input_tokens or 0) + (sem.output_tokens or 0))
            missing = [c for c in sem.requested_tool_calls if c not in tool_call_ids]
            if missing:
                sflags.add("missing_tool_span")
        elif sem.op is Op.TOOL:
            action = sem.tool_name or span.name
            tool_calls += 1
            if sem.error_type:
                tool_errors += 1
        elif sem.op is Op.HANDOFF:
            action = f"handoff:{sem.handoff_target or span.name}"
        elif sem.op is Op.GUARDRAIL and sem.decision:
            action = f"decision:{sem.decision}"
        elif sem.op is Op.RETRIEVAL:
            action = "retrieval"
        elif sem.decision:
            action = f"decision:{sem.decision}"
        if sem.cost_usd is not None and (sem.op is not Op.LLM or sid not in llm_parents):
            cost = (cost or 0.0) + sem.cost_usd
        if action is None:
            continue
        flags |= sflags
        steps.append(Step(
            span_id=sid, parent_span_id=span.parent_span_id, action=action, op=sem.op,
            name=span.name, start_ns=span.start_ns, end_ns=span.end_ns, depth=depth.get(sid, 1),
            tool_name=sem.tool_name, tool_call_id=sem.tool_call_id, arguments=sem.tool_arguments,
            result=sem.tool_result, error=sem.error_type, decision=sem.decision,
            side_effect=sem.side_effect, model=sem.model, input_tokens=sem.input_tokens,
            output_tokens=sem.output_tokens, cost_usd=sem.cost_usd,
            flags=frozenset(sflags | ({"injected_fault"} if sem.fault_type else set())),
            fault_type=sem.fault_type,
        ))

    if root:
        rspan, rsem = spans[root]
        start, end = rspan.start_ns, rspan.end_ns
        if rsem.decision and rsem.op is not Op.GUARDRAIL:
            steps.append(Step(span_id=root, parent_span_id=rspan.parent_span_id,
                              action=f"decision:{rsem.decision}", op=rsem.op, name=rspan.name,
                              start_ns=rspan.end_ns, end_ns=rspan.end_ns, depth=0,
                              decision=rsem.decision))
        if rsem.first_user_input and first_input is None:
            first_input = rsem.first_user_input
        if rspan.parent_span_id and rspan.parent_span_id not in spans:
            flags.add("remote_parent")
    else:
        rspan, rsem = None, SpanSemantics()
        allspans = [spans[s][0] for s in members]
        start = min(s.start_ns for s in allspans)
        end = max(s.end_ns for s in allspans)
        flags.add("missing_root")

    # outcome attributes: the root's win; else the last span that set one
    def pick(attr):
        v = getattr(rsem, attr)
        if v is not None:
            return v
        for sem in reversed(outcome_sem):
            if getattr(sem, attr) is not None:
                return getattr(sem, attr)
        return None

    resource = rspan.resource if rspan else spans[members[0]][0].resource if members else {}
    if rsem.task_id:
        task_id, task_src = str(rsem.task_id), "attribute"
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
        confidence=pick("confidence"), conversation_id=rsem.conversation_id or next(
            (spans[s][1].conversation_id for s in ordered if spans[s][1].conversation_id), None),
        start_ns=start, end_ns=end, steps=tuple(steps),
        input_tokens=in_tok, output_tokens=out_tok, total_tokens=tot_tok, cost_usd=cost,
        model_calls=model_calls, tool_calls=tool_calls, tool_errors=tool_errors,
        status="complete" if complete else "incomplete", flags=frozenset(flags),
        shadow_of=rsem.shadow_of, perturbation_family=rsem.perturbation_family,
        perturbation_strength=rsem.perturbation_strength, revision=revision,
        span_count=len(members) + (1 if root else 0),
    )


class TrajectoryBuilder:
    """Streaming trial assembly. See the module docstring for the finalization rules.

    Args:
        grace_s: seconds without a new span after the root has arrived before finalizing (default 5).
        root_timeout_s: seconds without a new span before a trace with no root is finalized
            ``incomplete`` (default 300).
        retain_s: seconds a finalized trace is kept to absorb late spans (default 900).
    """

    def __init__(self, *, grace_s: float = 5.0, root_timeout_s: float = 300.0, retain_s: float = 900.0):
        self.grace_s = grace_s
        self.root_timeout_s = root_timeout_s
        self.retain_s = retain_s
        self._traces: dict[str, _Trace] = {}

    def __len__(self) -> int:
        return sum(1 for t in self._traces.values() if t.dirty)

    @property
    def open_traces(self) -> int:
        """Traces holding spans not yet finalized."""
        return len(self)

    def open_trace_ids(self) -> set[str]:
        """Ids of traces with spans not yet finalized."""
        return {tid for tid, t in self._traces.items() if t.dirty}

    def add(self, items: Iterable[tuple[CanonicalSpan, SpanSemantics]], now: float) -> int:
        """Buffer spans. Returns the number of new (not duplicate) spans."""
        new = 0
        for span, sem in items:
            tr = self._traces.get(span.trace_id)
            if tr is None:
                tr = self._traces[span.trace_id] = _Trace()
            old = tr.spans.get(span.span_id)
            if old is not None and old[0] == span:
                continue  # exact re-send: nothing changes
            tr.spans[span.span_id] = (span, sem)
            tr.last_seen = now
            tr.dirty = True
            new += 1
        return new

    def poll(self, now: float) -> list[Trial]:
        """Finalize what is due at ``now``; evict finalized traces past retention."""
        out: list[Trial] = []
        for tid in list(self._traces):
            tr = self._traces[tid]
            idle = now - tr.last_seen
            if not tr.dirty:
                if tr.finalized_at is not None and now - tr.finalized_at >= self.retain_s:
                    del self._traces[tid]
                continue
            if _has_root(tr.spans):
                if idle >= self.grace_s:
                    out.extend(self._finalize(tid, tr, now, complete=True))
            elif idle >= self.root_timeout_s:
                out.extend(self._finalize(tid, tr, now, complete=False))
        return out

    def flush(self, now: float = 0.0) -> list[Trial]:
        """Finalize every open trace now (end of input), complete or not."""
        out: list[Trial] = []
        for tid, tr in list(self._traces.items()):
            if tr.dirty:
                out.extend(self._finalize(tid, tr, now, complete=_has_root(tr.spans)))
        return out

    def _finalize(self, tid: str, tr: _Trace, now: float, *, complete: bool) -> list[Trial]:
        tr.revision += 1
        tr.dirty = False
        tr.finalized_at = now
        return assemble(tid, tr.spans, complete=complete, revision=tr.revision)
