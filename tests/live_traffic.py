"""Random but reproducible trials covering every selection rule of metrics.md (invalid,
incomplete, perturbed, unknown outcome, missing cost, confidence with ties, violations), for the
incremental-vs-batch scoring tests."""

from __future__ import annotations

import random

from relyscope.model import Op, Step, Trial

ACTIONS = ("llm", "search", "issue_refund", "lookup", "drop_database")


def make_trial(rng: random.Random, i: int, *, task: str, end_ns: int, agent: str = "support",
               version: str = "1.0", run_kind: str = "production", p_success: float = 0.6) -> Trial:
    n_steps = rng.randint(1, 5)
    steps = tuple(
        Step(span_id=f"{i:08x}{j:08x}", parent_span_id="", action=a, op=Op.LLM if a == "llm" else Op.TOOL,
             name=a, start_ns=j, end_ns=j + 1, tool_name=None if a == "llm" else a,
             arguments={"amount": 5, "order": {"total": 3}} if a == "issue_refund" else None)
        for j, a in enumerate(rng.choice(ACTIONS) for _ in range(n_steps)))
    r = rng.random()
    outcome = "unknown" if r < 0.1 else "success" if rng.random() < p_success else "failure"
    fam = rng.choice((None, None, None, None, "fault", "env", "prompt", "nominal"))
    conf = rng.choice((None, 0.5, 0.9, 1.0, round(rng.random(), 3), 0.25))
    wall = rng.randint(1, 5_000) * 1_000_000
    return Trial(
        trial_id=f"tr{i:07d}", trace_id=f"{i:032x}", root_span_id=f"{i:016x}", task_id=task,
        task_id_source="attribute", agent_name=agent, agent_version=version, run_kind=run_kind,
        outcome=outcome, outcome_source=None, outcome_score=None, claimed_success=None, confidence=conf,
        conversation_id=None, start_ns=end_ns - wall, end_ns=end_ns, steps=steps,
        total_tokens=rng.randint(0, 3000), cost_usd=None if rng.random() < 0.2 else round(rng.random() / 50, 6),
        model_calls=rng.randint(0, 4), tool_calls=rng.randint(0, 4), tool_errors=rng.choice((0, 0, 1)),
        status="incomplete" if rng.random() < 0.05 else "complete", perturbation_family=fam)


def grading(rng: random.Random, trials) -> tuple[dict[str, float], set[str]]:
    """Random severities and an invalid set (standing in for the graders' verdicts)."""
    sev = {t.trial_id: rng.choice((0.0, 0.0, 0.0, 0.25, 0.5, 1.0)) for t in trials}
    invalid = {t.trial_id for t in trials if rng.random() < 0.05}
    return sev, invalid
