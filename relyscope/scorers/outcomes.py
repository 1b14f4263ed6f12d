"""Resolve each trial's outcome from every source, by the precedence of metrics.md §6.

One place decides: the span's ``relyscope.outcome`` (the application's verifier), outcomes posted to
the API later (keyed by trial id or trace id; a post marked ``verifier`` counts as the
application's own check), deterministic rules, ``gen_ai.evaluation.result`` events, and the
optional LLM judge (an evaluation named :data:`JUDGE_EVALUATION`, consulted last). The precedence
itself is :func:`relyscope.scorers.graders.resolve_outcome`. Pure: posted outcomes are passed in.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from relyscope.model import Evaluation, Trial
from relyscope.scorers.graders import PostedOutcome, resolve_outcome

__all__ = ["apply_outcomes", "orphan_posts", "rekeyed_posts", "JUDGE_EVALUATION"]

JUDGE_EVALUATION = "relyscope.judge"

# posted rows as the store returns them: (outcome, score, source, verifier, posted_ns)
PostedRows = Mapping[tuple[str, str], Sequence[tuple[str, float | None, str, bool, int]]]


def orphan_posts(posted: PostedRows, trials: Sequence[Trial]) -> list[str]:
    """Trial ids with posted outcomes that name no trial of ``trials`` but a trial id derived in one
    of their traces (``<trace id>:<span id>``): candidates for :func:`rekeyed_posts` (a re-keyed
    trial's old id). Pure; cost O(len(posted))."""
    traces = {t.trace_id for t in trials}
    live = {t.trial_id for t in trials}
    return sorted(k for kind, k in posted if kind == "trial" and k not in live and k[:32] in traces
                  and k[32:33] == ":")


def rekeyed_posts(trials: Sequence[Trial], tombstones: Sequence[Trial]) -> dict[str, list[str]]:
    """Trial id → the ids it replaced, whose posted outcomes are its own: a trial finalized before
    its trace's real root arrived (a nested agent span, or the virtual root) is re-keyed to that
    root, leaving a ``superseded`` tombstone; an outcome posted for the id the API listed then
    named no trial and was lost. Each tombstone goes to the live trial of its trace whose time
    interval contains its own (the innermost one), else to the trace's only trial; else nowhere.
    ``tombstones``: the superseded rows of the traces of ``trials`` (their times kept)."""
    by_trace: dict[str, list[Trial]] = {}
    for t in trials:
        by_trace.setdefault(t.trace_id, []).append(t)
    out: dict[str, list[str]] = {}
    for old in tombstones:
        live = [t for t in by_trace.get(old.trace_id, ()) if t.trial_id != old.trial_id]
        inside = [t for t in live if t.start_ns <= old.start_ns and old.end_ns <= t.end_ns]
        heir = (min(inside, key=lambda t: (t.end_ns - t.start_ns, t.trial_id)) if inside
                else live[0] if len(live) == 1 else None)
        if heir is not None:
            out.setdefault(heir.trial_id, []).append(old.trial_id)
    return out


def apply_outcomes(trials: Sequence[Trial], posted: PostedRows,
                   judged: Mapping[str, Evaluation] | None = None,
                   rekeyed: Mapping[str, Sequence[str]] | None = None) -> list[Trial]:
    """Trials with ``outcome`` / ``outcome_source`` / ``outcome_score`` resolved (§6).

    ``posted``: (``"trial"``, trial id) or (``"trace"``, trace id) → posted rows, oldest first.
    ``judged``: trial id → the LLM judge's evaluation, if a judge is configured. ``rekeyed``: trial
    id → the ids it replaced (:func:`rekeyed_posts`), whose posts count as its own. A trial whose
    resolution does not change is returned as the same object."""
    out = []
    for t in trials:
        rows = list(posted.get(("trial", t.trial_id), ())) + list(posted.get(("trace", t.trace_id), ()))
        if rekeyed and t.trial_id in rekeyed:
            rows += [r for old in rekeyed[t.trial_id] for r in posted.get(("trial", old), ())]
            rows.sort(key=lambda r: r[4])  # oldest first, as posted
        judge = judged.get(t.trial_id) if judged else None
        if not rows and not t.evaluations and judge is None:
            out.append(t)
            continue
        posts = [PostedOutcome(outcome=r[0], posted_ns=r[4], source=r[2], verifier=r[3]) for r in rows]
        span_outcome = t.outcome if t.outcome in ("success", "failure") else None
        outcome, source = resolve_outcome(span_outcome, posts, t.evaluations, None)
        if outcome == "unknown" and judge is not None:  # the judge is consulted last (§6 item 3)
            outcome, source = resolve_outcome(span_outcome, posts, (judge,), None)
        if source == "verifier":  # the span's own outcome stands
            out.append(t)
            continue
        score = t.outcome_score
        if source and (source.startswith("posted:") or source == "verifier_api"):
            latest = max((r for r in rows if r[0] == outcome), key=lambda r: r[4], default=None)
            score = latest[1] if latest else None
        out.append(dataclasses.replace(t, outcome=outcome, outcome_source=source, outcome_score=score))
    return out
