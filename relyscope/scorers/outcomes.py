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

__all__ = ["apply_outcomes", "JUDGE_EVALUATION"]

JUDGE_EVALUATION = "relyscope.judge"

# posted rows as the store returns them: (outcome, score, source, verifier, posted_ns)
PostedRows = Mapping[tuple[str, str], Sequence[tuple[str, float | None, str, bool, int]]]


def apply_outcomes(trials: Sequence[Trial], posted: PostedRows,
                   judged: Mapping[str, Evaluation] | None = None) -> list[Trial]:
    """Trials with ``outcome`` / ``outcome_source`` / ``outcome_score`` resolved (§6).

    ``posted``: (``"trial"``, trial id) or (``"trace"``, trace id) → posted rows, oldest first.
    ``judged``: trial id → the LLM judge's evaluation, if a judge is configured. A trial whose
    resolution does not change is returned as the same object."""
    out = []
    for t in trials:
        rows = list(posted.get(("trial", t.trial_id), ())) + list(posted.get(("trace", t.trace_id), ()))
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
