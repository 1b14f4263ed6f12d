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
from relyscope.scorers.outcomes import apply_outcomes, orphan_posts, rekeyed_posts
from relyscope.scorers.replay_outcome import EQUIVALENCE_SOURCE, apply_replay_outcomes, is_sandbox_miss

__all__ = ["load_resolved", "rekeyed_of", "resolve_replays", "HarnessCheck", "ReplayRecord", "expected_agreement", "harness_check"]


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


def load_resolved(store: Any, policy: Any = None, *, judge: bool = False, **filters) -> list[Trial]:
    """Trials from ``store`` (``filters`` as :meth:`relyscope.store.Store.load_trials`) with their
    outcomes resolved: posted outcomes, and a judge's verdicts if ``judge`` (metrics.md §6), then
    replays by :func:`resolve_replays`. What the scoring stage and ``report --store`` both score.
    Raises StoreUnavailable."""
    judged = store.judgements() if judge else None
    posted = store.outcomes()
    trials = store.load_trials(**filters)
    trials = apply_outcomes(trials, posted, judged, rekeyed_of(store, posted, trials))
    return resolve_replays(store, trials, posted, judged, policy)


def rekeyed_of(store: Any, posted: Mapping, trials: Sequence[Trial]) -> dict[str, list[str]]:
    """:func:`relyscope.scorers.outcomes.rekeyed_posts` of ``trials``: the ids they replaced when
    re-keyed whose posted outcomes (``posted``) count as theirs. The tombstones are read only when
    such a post exists (:func:`~relyscope.scorers.outcomes.orphan_posts`: rare), so a caller's
    cost stays with its trials. Raises StoreUnavailable."""
    orphans = orphan_posts(posted, trials)
    return rekeyed_posts(trials, store.tombstones(orphans)) if orphans else {}


@dataclass(frozen=True, slots=True)
class HarnessCheck:
    """Nominal replays of the incumbent (replay version = production version) with a known outcome
    whose production run has a known outcome: ``replays``; of these, ``agreeing`` reproduced the
    production outcome; ``expected``: how many a faithful sandbox would make agree given the
    agent's own inconsistency, and ``variance`` the variance of ``agreeing − expected`` under a
    faithful sandbox (see :func:`harness_check`); ``conservative``: how many of the replays have
    a task with no other production run, where ``expected`` is a lower bound, not an estimate.
    ``agreement`` = agreeing / replays."""

    replays: int
    agreeing: int
    expected: float
    variance: float = 0.0
    conservative: int = 0

    @property
    def agreement(self) -> float:
        return self.agreeing / self.replays if self.replays else float("nan")


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """One replay as the harness check sees it: ``version`` and ``task`` of its production run
    ``production_id`` (outcome ``production_success``); ``agreed``: the replay's outcome equals
    the production outcome (None: the replay's outcome is unknown); ``certain``: graded by
    side-effect equivalence against a production failure — known only when it repeated the
    failure, so a known one agrees whatever the sandbox."""

    version: str
    task: str
    production_id: str
    production_success: bool
    agreed: bool | None
    certain: bool = False


def expected_agreement(records: Sequence[ReplayRecord],
                       production_runs: Mapping[tuple[str, str], Mapping[str, bool]]) -> HarnessCheck:
    """The harness check's figures from ``records`` (every eligible replay, also those with an
    unknown outcome: they feed the pooled rate) and ``production_runs``: (version, task) → {trial
    id → success} of the production runs with a known outcome (the replayed runs among them).

    Model (a faithful sandbox): a replay is one more independent run of its task, succeeding with
    the task's success probability p_t, whatever its production run did. A replay of a production
    success then agrees with probability p_t, of a production failure with 1 − p_t (1 for
    ``certain`` records). Estimators, for the replay of production run j of task t:

    - **leave-one-out** when t has other production runs: p̂ = c′/n′ over them (j excluded). The
      other runs are independent of run j, so E[y_j · p̂] = p_t² exactly: ``expected`` is unbiased
      for any distribution of p_t. Including run j (the former ``(c_t + m·p̄)/(n_t + m)``, m = 2)
      pulls p̂ toward run j's own outcome and, with one run per task, amounts to assuming a
      Beta prior of weight m: biased either way depending on the agent (false drift for p_t near
      0.7 on every task, Beta(7, 3)).
    - **pooled lower bound** when t has no other production run: E[p_t | run j succeeded] =
      E[p²]/E[p] is then not identifiable (it depends on how p varies across tasks). p̂ = the mean
      production outcome of the other such replays (their production runs ≠ j), per version,
      estimates E[p], and E[p]² ≤ E[p²] (Cauchy–Schwarz; likewise for 1 − p): ``expected`` is a
      lower bound, exact when the agent is equally reliable on every task, and these replays are
      counted in ``conservative``. No other such replay: p̂ is unknown and the replay is expected
      to agree with probability 0 (the most conservative value). Assumes replayed runs are not
      chosen by their outcome (the sampler hashes trial ids).

    Shrinking the leave-one-out p̂ toward the pooled rate (a beta-binomial empirical-Bayes
    posterior mean, prior fitted by moments) was measured and not used: it lowered ``expected``
    (conservatively) without lowering the noise of ``agreeing − expected``, which the replays'
    own Bernoulli noise dominates.

    ``variance`` = max(V, Σ q(1 − q)). V = G/(G − 1)·Σ_t u_t² over the G tasks, u_t = A_t − R̂·E_t
    (task t's agreeing and expected counts, R̂ = agreeing / expected) minus R̂ times task t's pull
    on the pooled rate (delta method: one pooled rate moves every conservative q at once): the
    task-clustered linearisation (sandwich) variance of the ratio agreeing / expected, covering
    the replays' noise, the noise of the p̂ and replays that share a production run; residuals
    about R̂, not 1, so that a broken sandbox's shortfall does not inflate its own variance.
    Σ q(1 − q), the replays' Bernoulli noise alone, is a floor when few tasks make V noisy.
    Sources: the leave-one-out / U-statistic argument behind unbiased pass@k (Chen et al. 2021,
    metrics.md §2); ratio-estimator variance, Cochran, *Sampling Techniques* (1977) §6.3;
    cluster-robust variance, Liang & Zeger, Biometrika 73 (1986). Pure; O(records + runs)."""
    totals = {g: (len(v), sum(v.values())) for g, v in production_runs.items()}

    def others(r: ReplayRecord) -> tuple[int, int]:
        g = (r.version, r.task)
        n, c = totals.get(g, (0, 0))
        own = production_runs.get(g, {}).get(r.production_id)
        return (n - 1, c - int(own)) if own is not None else (n, c)

    # pooled rate of the replays whose task has no other production run, per version
    pool_n: dict[str, int] = {}
    pool_c: dict[str, int] = {}
    pool_j: dict[tuple[str, str], int] = {}
    rest_of = [others(r) for r in records]
    fallback = [n_o == 0 for n_o, _ in rest_of]
    for r, is_fb in zip(records, fallback):
        if is_fb:
            pool_n[r.version] = pool_n.get(r.version, 0) + 1
            pool_c[r.version] = pool_c.get(r.version, 0) + r.production_success
            pool_j[(r.version, r.production_id)] = pool_j.get((r.version, r.production_id), 0) + 1
    n = agree = conservative = 0
    expected = bernoulli = 0.0
    sums: dict[tuple[str, str], list[float]] = {}  # task → [agreeing, expected]
    slope: dict[str, float] = {}  # version → ∂expected/∂p̄ (the pooled rate's weight in expected)
    for r, is_fb, (n_o, c_o) in zip(records, fallback, rest_of):
        if r.agreed is None:
            continue
        if is_fb:
            k = pool_j[(r.version, r.production_id)]
            rest = pool_n[r.version] - k
            p = (pool_c[r.version] - k * r.production_success) / rest if rest else None
            conservative += 1
        else:
            p = c_o / n_o
        if r.production_success:
            q = 0.0 if p is None else p
        else:
            q = 1.0 if r.certain else (0.0 if p is None else 1.0 - p)
        if is_fb and p is not None and not r.certain:
            slope[r.version] = slope.get(r.version, 0.0) + (1.0 if r.production_success else -1.0)
        n += 1
        agree += r.agreed
        expected += q
        bernoulli += q * (1.0 - q)
        a_e = sums.setdefault((r.version, r.task), [0.0, 0.0])
        a_e[0] += r.agreed
        a_e[1] += q
    ratio = agree / expected if expected > 0 else 1.0
    # per task: its deviation from the ratio, plus its influence on the pooled rates it fed
    # (delta method: one pooled p̄ shifts every conservative replay's q at once)
    resid = {g: a - ratio * e for g, (a, e) in sums.items()}
    for r, is_fb in zip(records, fallback):
        if is_fb and slope.get(r.version):
            v = r.version
            infl = (r.production_success - pool_c[v] / pool_n[v]) / pool_n[v]
            g = (v, r.task)
            resid[g] = resid.get(g, 0.0) - ratio * slope[v] * infl
    g = len(resid)
    clustered = sum(u * u for u in resid.values()) * g / (g - 1) if g > 1 else 0.0
    return HarnessCheck(n, agree, expected, max(clustered, bernoulli), conservative)


def harness_check(replays: Sequence[Trial], productions: Mapping[str, Trial],
                  production_runs: Sequence[Trial] = ()) -> HarnessCheck:
    """The harness check over resolved trials: ``replays`` (any trials; those that are nominal
    replays of the incumbent — replay version = production version — without a sandbox miss
    count), ``productions`` (trial id → the replayed production runs, outcomes resolved) and
    ``production_runs``: the incumbent's production runs of the replayed tasks (complete, known
    outcome ones count; the replayed runs among them are left out of their own replay's rate).
    Figures and estimators: :func:`expected_agreement`. A replay of a production failure graded
    by side-effect equivalence is known only when it repeated the failure, so a known one always
    agrees; one whose outcome came from elsewhere (posted for the replay, its own verifier where
    equivalence could not decide) agrees with probability 1 − p_t. The gate compares the upper
    bound of ``agreeing / expected`` with ``min_harness_agreement``."""
    runs: dict[tuple[str, str], dict[str, bool]] = {}
    for t in production_runs:
        if t.status == "complete" and t.outcome in ("success", "failure"):
            runs.setdefault((t.agent_version, t.task_id), {})[t.trial_id] = t.outcome == "success"
    records = []
    for t in replays:
        prod = productions.get(t.shadow_of or "")
        if (prod is None or t.perturbation_family not in (None, "nominal") or is_sandbox_miss(t)
                or t.agent_version != prod.agent_version or prod.outcome not in ("success", "failure")):
            continue
        known = t.outcome in ("success", "failure")
        records.append(ReplayRecord(
            prod.agent_version, prod.task_id, prod.trial_id, prod.outcome == "success",
            (t.outcome == prod.outcome) if known else None,
            certain=prod.outcome == "failure" and t.outcome_source == EQUIVALENCE_SOURCE))
    return expected_agreement(records, runs)
