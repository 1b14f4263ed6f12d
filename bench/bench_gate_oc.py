"""Benchmark: operating characteristics of the release gate (relyscope.scorers.gate) by simulation.

For each suite size N (shared tasks) and each true effect d (candidate success minus baseline
success, in expectation), simulate ``--sims`` experiments and run ``evaluate_gate`` with the
default policy (``gate_default.yaml``): success_rate (allowed regression 0.05), pass^3 (0.10),
C_out (0.10), R_Rob (0.05, not measured here: nominal trials only, noted), S_comp (0.02; no
violations on either side, so Δ = 0). Reports P(pass), P(block), P(inconclusive) with Monte Carlo
standard errors sqrt(p(1 − p) / sims), and which metrics blocked or stayed inconclusive (counts
of simulated experiments; one experiment can name several metrics). About 75 s on one core at the defaults.

Model of one experiment: N tasks, per-task success probability p_t ~ Beta(α, β); K nominal trials
per task and side, outcomes Bernoulli(p_t) for the baseline and Bernoulli(p'_t) for the candidate
with ``p'_t = p_t · (1 + d / E[p])`` (clipped to [0, 1], which only binds for d > 0): every task
loses the same *fraction*, so E[p'] = E[p] + d exactly for d ≤ 0.

Spreads (``--spread``):
- ``tau`` (default): Beta fitted by the beta-binomial method of moments to τ-bench airline gpt-4o
  (sierra-research/tau-bench ``historical_trajectories/gpt-4o-airline.json``, 50 tasks × 4 trials;
  successes per task {0: 14, 1: 12, 2: 10, 3: 4, 4: 10}, /work/shared/data/tau-bench/README.md):
  mean 0.42, α ≈ 0.64, β ≈ 0.88 (U-shaped: many tasks always or never solved).
- ``demo``: Beta fitted by moments to the demo agent's per-task ``p_correct`` (relyscope.demo.agent).

Usage: ``python bench/bench_gate_oc.py [--tasks 30,100,300] [--trials 5] [--sims 300] [--n-boot 2000]
[--spread tau|demo] [--effects 0,-0.05,-0.10] [--seed 0]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402

from relyscope.model import Trial  # noqa: E402
from relyscope.scorers.gate import GatePolicy, GateSide, default_gate_policy, evaluate_gate  # noqa: E402

TAU_AIRLINE_SUCCESS_HIST = {0: 14, 1: 12, 2: 10, 3: 4, 4: 10}  # tasks with c of 4 trials successful
TAU_TRIALS = 4


def beta_from_beta_binomial(hist: dict[int, int], n: int) -> tuple[float, float]:
    """Method of moments for a beta-binomial: Var(c) = n μ (1 − μ) [1 + (n − 1) ρ], ρ = 1 / (α + β + 1)."""
    c = np.repeat(np.array(list(hist), dtype=float), list(hist.values()))
    mu = c.mean() / n
    var = c.var()  # population variance of the counts
    rho = (var / (n * mu * (1 - mu)) - 1) / (n - 1)
    s = 1 / rho - 1
    return mu * s, (1 - mu) * s


def beta_from_values(p: np.ndarray) -> tuple[float, float]:
    """Method of moments for a Beta from probabilities: α + β = μ(1 − μ) / var − 1."""
    mu, var = float(p.mean()), float(p.var())
    s = mu * (1 - mu) / var - 1
    return mu * s, (1 - mu) * s


def make_side(label: str, p: np.ndarray, k: int, rng: np.random.Generator) -> GateSide:
    outcomes = rng.random((p.size, k)) < p[:, None]
    trials = []
    for t in range(p.size):
        for i in range(k):
            tid = f"{label}-{t}-{i}"
            trials.append(
                Trial(
                    trial_id=tid, trace_id=tid, root_span_id="0" * 16, task_id=f"task-{t}", task_id_source="shadow",
                    agent_name="bench", agent_version=label, run_kind="shadow",
                    outcome="success" if outcomes[t, i] else "failure", outcome_source="sim", outcome_score=None,
                    claimed_success=None, confidence=None, conversation_id=None, start_ns=0, end_ns=1, steps=(),
                )  # fmt: skip
            )
    return GateSide(trials, severities={}, critical={}, committed_forbidden={}, label=label)


def simulate(n_tasks: int, k: int, effect: float, sims: int, alpha: float, beta: float, policy: GatePolicy, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    mean_p = alpha / (alpha + beta)
    verdicts: Counter[str] = Counter()
    blockers: Counter[str] = Counter()
    undecided: Counter[str] = Counter()
    for s in range(sims):
        p = rng.beta(alpha, beta, n_tasks)
        p_c = np.clip(p * (1 + effect / mean_p), 0.0, 1.0)
        base, cand = make_side("base", p, k, rng), make_side("cand", p_c, k, rng)
        r = evaluate_gate(base, cand, policy.model_copy(update={"seed": seed * 100_003 + s}))
        verdicts[r.verdict] += 1
        for reason in r.reasons:
            if reason.verdict == "block":
                blockers[reason.name] += 1
            elif reason.verdict == "inconclusive":
                undecided[reason.name] += 1
    return {"verdicts": verdicts, "blockers": blockers, "undecided": undecided}


def fmt_p(count: int, sims: int) -> str:
    p = count / sims
    return f"{p:.3f} ± {math.sqrt(p * (1 - p) / sims):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="30,100,300", help="comma-separated suite sizes N (shared tasks)")
    ap.add_argument("--trials", type=int, default=5, help="nominal trials per task and side (K)")
    ap.add_argument("--sims", type=int, default=300)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--spread", choices=("tau", "demo"), default="tau")
    ap.add_argument("--effects", default="0,-0.05,-0.10", help="true success-rate changes d")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    if args.spread == "tau":
        alpha, beta = beta_from_beta_binomial(TAU_AIRLINE_SUCCESS_HIST, TAU_TRIALS)
    else:
        from relyscope.demo.agent import TASKS

        alpha, beta = beta_from_values(np.array([t.p_correct for t in TASKS]))
    policy = default_gate_policy().model_copy(update={"n_boot": args.n_boot})
    print(f"spread {args.spread}: Beta({alpha:.3f}, {beta:.3f}), E[p] = {alpha / (alpha + beta):.3f}; "
          f"K = {args.trials}, sims = {args.sims}, B = {args.n_boot}, default policy")  # fmt: skip
    print()
    print("| N tasks | true Δ success | P(pass) | P(block) | P(inconclusive) | blocks by | inconclusive by |")
    print("|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for n_tasks in (int(x) for x in args.tasks.split(",")):
        for effect in (float(x) for x in args.effects.split(",")):
            out = simulate(n_tasks, args.trials, effect, args.sims, alpha, beta, policy, args.seed)
            v, b = out["verdicts"], out["blockers"]
            by = ", ".join(f"{name} {cnt}" for name, cnt in b.most_common()) or "—"
            und = ", ".join(f"{name} {cnt}" for name, cnt in out["undecided"].most_common()) or "—"
            print(f"| {n_tasks} | {effect:+.2f} | {fmt_p(v['pass'], args.sims)} | {fmt_p(v['block'], args.sims)} | "
                  f"{fmt_p(v['inconclusive'], args.sims)} | {by} | {und} |", flush=True)  # fmt: skip
            assert v["error"] == 0
    print(f"\nwall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
