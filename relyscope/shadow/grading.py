"""Grading of shadow replays against the production runs they replay (metrics.md §6 item 4), and
the harness check: the incumbent's nominal replays must reproduce its production outcomes, or the
difference comes from the sandbox and is reported, not blamed on the agent.

I/O only through :class:`relyscope.store.Store` reads; the rules live in
:mod:`relyscope.scorers.replay_outcome`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relyscope.model import Trial
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.replay_outcome import apply_replay_outcomes, is_sandbox_miss

__all__ = ["resolve_replays", "HarnessCheck", "harness_check"]


def _policy_side_effects(policy: Any) -> dict[str, str]:
    if policy is None:
        return {}
    return {k: getattr(v, "value", v) for k, v in getattr(policy, "side_effects", {}).items()}


def resolve_replays(store: Any, trials: Sequence[Trial], posted: Mapping, judged: Mapping | None,
                    policy: Any = None) -> list[Trial]:
    """``trials`` with replays graded by side-effect equivalence with their production runs (loaded
    from ``store`` by trial id, their own outcomes resolved by §6 first), and without the trials of
    replay attempts the ledger superseded (a replay re-run after a stop or crash). Cost: two
    lookups by the production trial ids the replays name. Raises StoreUnavailable."""
    prod_ids = {t.shadow_of for t in trials if t.shadow_of}
    if not prod_ids:
        return list(trials)
    # a replay re-run after a stop or crash has a new trace id in the ledger: the cut-off attempt's
    # trial is dropped (replays the ledger does not know — another harness's — are kept)
    from relyscope.store.shadow import ShadowLedger

    current = ShadowLedger(store).replay_traces(prod_ids)
    trials = [t for t in trials if not t.shadow_of or t.shadow_of not in current or t.trace_id in current[t.shadow_of]]
    prods = apply_outcomes(store.load_trials(trial_ids=prod_ids), posted, judged)
    return apply_replay_outcomes(trials, {p.trial_id: p for p in prods}, _policy_side_effects(policy))


@dataclass(frozen=True, slots=True)
class HarnessCheck:
    """Nominal replays of the incumbent (replay version = production version) with a known outcome
    whose production run has a known outcome: ``replays``; of these, ``agreeing`` reproduced the
    production outcome; ``expected``: how many a faithful sandbox would make agree given the
    agent's own inconsistency (see :func:`harness_check`). ``agreement`` = agreeing / replays."""

    replays: int
    agreeing: int
    expected: float
    variance: float = 0.0

    @property
    def agreement(self) -> float:
        return self.agreeing / self.replays if self.replays else float("nan")


def harness_check(replays: Sequence[Trial], productions: Mapping[str, Trial],
                  success_rate: Mapping[str, float] | None = None) -> HarnessCheck:
    """The harness check over resolved trials.

    A faithful sandbox makes a replay another independent run of the task, succeeding with the
    incumbent's production success rate p_t (``success_rate[task_id]``; default: 1 or 0 from the
    replayed run alone — a deterministic agent). Graded by side-effect equivalence, the replay of
    a verified success agrees with probability p_t; the replay of a verified failure has a known
    outcome only when it repeated the failure, so a known one always agrees (1). ``expected`` sums
    these probabilities q, ``variance`` sums q(1 − q); the gate compares the upper bound of
    ``agreeing / expected`` with ``min_harness_agreement``."""
    n = agree = 0
    expected = variance = 0.0
    rates = success_rate or {}
    for t in replays:
        prod = productions.get(t.shadow_of or "")
        if (prod is None or t.perturbation_family not in (None, "nominal") or is_sandbox_miss(t)
                or t.agent_version != prod.agent_version):
            continue
        if t.outcome in ("success", "failure") and prod.outcome in ("success", "failure"):
            n += 1
            agree += t.outcome == prod.outcome
            q = float(rates.get(t.task_id, 1.0)) if prod.outcome == "success" else 1.0
            expected += q
            variance += q * (1.0 - q)
    return HarnessCheck(n, agree, expected, variance)


def production_success_rates(trials: Sequence[Trial], prior_weight: float = 2.0) -> dict[str, float]:
    """task id → estimated success probability p_t from the trials with a known outcome (complete
    runs only), shrunk toward the pooled rate p̄ of all these trials:
    ``p_t = (c_t + m·p̄) / (n_t + m)`` with ``m = prior_weight`` (a beta-binomial posterior mean).
    With one production run per task the raw rate is 0 or 1 and would call every stochastic agent
    deterministic (and a faithful sandbox harness drift); many runs make the prior vanish."""
    c: dict[str, list[int]] = {}
    for t in trials:
        if t.status == "complete" and t.outcome in ("success", "failure"):
            c.setdefault(t.task_id, []).append(t.outcome == "success")
    total = sum(len(v) for v in c.values())
    if not total:
        return {}
    pooled = sum(sum(v) for v in c.values()) / total
    return {k: (sum(v) + prior_weight * pooled) / (len(v) + prior_weight) for k, v in c.items()}
