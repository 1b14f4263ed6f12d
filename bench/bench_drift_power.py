"""Benchmark: false alarms per day and detection of a drop by the drift alert (metrics.md §10), by
day-level simulation of the sidecar's minute-by-minute drift test and the Prometheus alert.

Traffic: ``--tasks`` tasks with success probabilities p_t ~ Beta(7, 3) (mean 0.70, new per
simulated day); trials arrive as a Poisson process of ``rate`` per hour, each picking a task
uniformly: per-minute bucket counts n[m, t] ~ Poisson(rate / 60 / T), successes c ~ Binomial(n,
p_t) (outcome-only trials: no trajectories or resources, so R_Con = R = C_out). Windows are sums
of minute buckets, as the sidecar reads them (scoring/stage.py ``_drift``): at evaluation minute e
the current window is [e − 60, e) and the reference [e − 1500, e − 60).

*Stable day*: 24 h of reference warm-up and the first current hour, then 1440 evaluations (one a
minute, the sidecar's drift cadence) on unchanged traffic. *Drop*: the same warm-up, then every p_t
lowered by ``--drop`` (clipped at 0) at the first evaluation, evaluated for ``--detect-hours``.

Each evaluation is :func:`relyscope.scoring.drift.outcome_drift_batch` — the sidecar's decision
on the same bootstrap draws as :func:`relyscope.scoring.drift.drift` (equality is the unit test
``tests/test_drift.py::test_batch_equals_drift``) — for success_rate, pass^1 and C_out. The alert
RelyscopeDriftDetected (deploy/alerts/relyscope-rules.yml) is ``delta < 0 and flag == 1`` held
``for:`` F minutes, i.e. true at F + 1 consecutive 1-minute rule evaluations, per metric series; a
day counts as a false alarm if any watched series fires. Old rule (before this change): 95 %
percentile interval excludes 0 and |Δ| > 0.05, for: 15m.

Usage: ``python bench/bench_drift_power.py [--days 300] [--rates 50,100,200,400,1000]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from relyscope.scoring.drift import (DEFAULT_ALERT_LEVEL, DEFAULT_MIN_TRIALS,  # noqa: E402
                                     critical_value, outcome_drift_batch)

CUR, REF = 60, 1440  # minutes


def traffic(rng: np.random.Generator, p: np.ndarray, rate: float, minutes: int, drop_at: int | None,
            drop: float) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative per-task (successes, trials), shape (minutes + 1, T), row m = sums before minute m."""
    T = p.size
    n = rng.poisson(rate / 60.0 / T, size=(minutes, T))
    pm = np.broadcast_to(p, (minutes, T)).copy()
    if drop_at is not None:
        pm[drop_at:] = np.clip(p - drop, 0.0, 1.0)
    c = rng.binomial(n, pm)
    zero = np.zeros((1, T), dtype=np.int64)
    return np.vstack([zero, np.cumsum(c, 0)]), np.vstack([zero, np.cumsum(n, 0)])


def windows(C: np.ndarray, N: np.ndarray, evals: np.ndarray):
    """(c_cur, n_cur, c_ref, n_ref) of the evaluations at minutes ``evals`` (shape (E, T) each)."""
    return (C[evals] - C[evals - CUR], N[evals] - N[evals - CUR],
            C[evals - CUR] - C[evals - CUR - REF], N[evals - CUR] - N[evals - CUR - REF])


def first_fire(cond: np.ndarray, for_min: int) -> int:
    """Index of the first evaluation at which an alert with ``for: for_min m`` fires (the
    condition true at for_min + 1 consecutive evaluations); -1 if never."""
    L = for_min + 1
    if cond.size < L:
        return -1
    run = np.convolve(cond.astype(np.int64), np.ones(L, dtype=np.int64), "valid") == L
    hits = np.flatnonzero(run)
    return int(hits[0]) + L - 1 if hits.size else -1


def day(rng, args, rate, *, drop: bool, percentiles: bool):
    """One simulated day: per metric, arrays delta, se, ci_low, ci_high, trials (E,)."""
    p = rng.beta(7, 3, args.tasks)
    n_eval = int(args.detect_hours * 60) if drop else 1440
    start = CUR + REF
    C, N = traffic(rng, p, rate, start + n_eval, start if drop else None, args.drop)
    evals = np.arange(start, start + n_eval)
    cc, nc, cr, nr = windows(C, N, evals)
    res = outcome_drift_batch(cc, nc, cr, nr, threshold=args.threshold, n_boot=args.n_boot, seed=0,
                              percentiles=percentiles, min_trials=0)
    tasks = ((nc + nr) > 0).sum(axis=1)  # the union the bootstrap draws from
    for r in res.values():
        r["tasks"] = tasks
    return res, nc.sum(axis=1)


def rule_new(res, trials, level, min_trials, threshold):
    """Alert condition per metric for the new flag (delta < 0 and flag) at level / min_trials."""
    out = {}
    for k, r in res.items():
        d, se = r["delta"], r["se"]
        z = np.array([critical_value(level, int(T)) for T in r["tasks"]])
        with np.errstate(invalid="ignore"):
            excl = np.where(se > 0, np.abs(d) > z * se, (se == 0) & (d != 0))
            out[k] = excl & (np.abs(d) > threshold) & (trials >= min_trials) & (d < 0)
    return out


def rule_old(res, threshold):
    out = {}
    for k, r in res.items():
        with np.errstate(invalid="ignore"):
            out[k] = ((r["ci_low"] > 0) | (r["ci_high"] < 0)) & (np.abs(r["delta"]) > threshold) & (r["delta"] < 0)
    return out


def fires(conds, for_min):
    """First firing index over all watched series (-1: none)."""
    t = [first_fire(c, for_min) for c in conds.values()]
    t = [x for x in t if x >= 0]
    return min(t) if t else -1


def clopper_pearson_upper(k: int, n: int, conf: float = 0.95) -> float:
    """One-sided upper bound of a binomial proportion (exact; scipy's beta quantile)."""
    from scipy.stats import beta
    return 1.0 if k >= n else float(beta.ppf(conf, k + 1, n - k))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--days", type=int, default=300, help="stable days per rate")
    ap.add_argument("--drop-days", type=int, default=100, help="drop scenarios per rate")
    ap.add_argument("--old-days", type=int, default=30, help="stable days for the old rule (percentiles)")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--drop", type=float, default=0.10)
    ap.add_argument("--threshold", type=float, default=0.05)
    ap.add_argument("--detect-hours", type=float, default=4.0)
    ap.add_argument("--rates", default="50,100,200,400,1000")
    ap.add_argument("--for-min", type=int, default=15)
    ap.add_argument("--alert-level", type=float, default=DEFAULT_ALERT_LEVEL)
    ap.add_argument("--min-trials", type=int, default=DEFAULT_MIN_TRIALS)
    ap.add_argument("--variants", default="0.999:100:15,0.9995:100:15,0.9998:0:15,0.9998:100:5,0.9999:100:15",
                    help="extra alert_level:min_trials:for_min rules whose false alarms/day and detection "
                    "are also printed (same simulated days)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    z = critical_value(args.alert_level, args.tasks)
    variants = [(float(a), int(b), int(f)) for a, b, f in (v.split(":") for v in args.variants.split(",") if v)]
    rng = np.random.default_rng(args.seed)
    t_all = time.perf_counter()
    table, extra = [], []
    for rate in (int(r) for r in args.rates.split(",")):
        t0 = time.perf_counter()
        fa_days = fa_old = 0
        eval_flags = eval_total = 0
        var_days = [0] * len(variants)
        var_ttd: list[list[int]] = [[] for _ in variants]
        for i in range(args.days):
            old = i < args.old_days
            res, trials = day(rng, args, rate, drop=False, percentiles=old)
            conds = rule_new(res, trials, args.alert_level, args.min_trials, args.threshold)
            fa_days += fires(conds, args.for_min) >= 0
            eval_flags += int(conds["success_rate"].sum())
            eval_total += trials.size
            for j, (lv, mt, fm) in enumerate(variants):
                var_days[j] += fires(rule_new(res, trials, lv, mt, args.threshold), fm) >= 0
            if old:
                fa_old += fires(rule_old(res, args.threshold), 15) >= 0
        ttd, hit1, hit2 = [], 0, 0
        for _ in range(args.drop_days):
            res, trials = day(rng, args, rate, drop=True, percentiles=False)
            t = fires(rule_new(res, trials, args.alert_level, args.min_trials, args.threshold), args.for_min)
            for j, (lv, mt, fm) in enumerate(variants):
                tv = fires(rule_new(res, trials, lv, mt, args.threshold), fm)
                var_ttd[j].append(tv + 1 if tv >= 0 else 10**9)
            if t >= 0:
                ttd.append(t + 1)  # minutes after the drop (the first evaluation is 1 min in)
                hit1 += t + 1 <= 60
                hit2 += t + 1 <= 120
        n_det = len(ttd)
        med = float(np.median(ttd)) if ttd else math.nan
        row = dict(rate=rate, fa=fa_days / args.days, fa_ub=clopper_pearson_upper(fa_days, args.days),
                   fa_k=fa_days, per_eval=eval_flags / eval_total, old=fa_old / max(args.old_days, 1),
                   p1=hit1 / args.drop_days, p2=hit2 / args.drop_days, pall=n_det / args.drop_days,
                   ttd=med, trials=med * rate / 60 if ttd else math.nan)
        table.append(row)
        extra.append((rate, [(v / args.days, float(np.mean(np.array(tt) <= 60)), float(np.mean(np.array(tt) <= 120)),
                              float(np.median(tt)) if tt else math.nan) for v, tt in zip(var_days, var_ttd)]))
        print(f"{rate}/h: false-alarm days {fa_days}/{args.days} (95% upper {row['fa_ub']:.3f}), old rule "
              f"{fa_old}/{args.old_days}; per-evaluation success_rate flags {row['per_eval']:.5f}; drop detected "
              f"{hit1}/{hit2}/{n_det} of {args.drop_days} within 1h/2h/{args.detect_hours:g}h, median {med:.0f} min "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"total {time.perf_counter() - t_all:.0f} s; alert_level={args.alert_level} (z={z:.2f} with all tasks), "
          f"min_trials={args.min_trials}, threshold={args.threshold}, for: {args.for_min}m, B={args.n_boot}, "
          f"{args.tasks} tasks")
    print("\n| trials/h | false-alarm days (new) | 95 % upper bound | old rule, false-alarm days | "
          f"detected ≤ 1 h | ≤ 2 h | ≤ {args.detect_hours:g} h | median time to detect | trials after the drop (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['rate']} | {r['fa_k']}/{args.days} = {r['fa']:.3f} | {r['fa_ub']:.3f} | {r['old']:.2f} | "
              f"{r['p1']:.2f} | {r['p2']:.2f} | {r['pall']:.2f} | {r['ttd']:.0f} min | {r['trials']:.0f} |")
    print("\nother rules, alert_level:min_trials:for_min → false-alarm days / detected ≤ 1 h / ≤ 2 h / median "
          "minutes to detect (1e9 = not within the horizon)")
    print("| trials/h | " + " | ".join(f"{a}:{b}:{f}" for a, b, f in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for rate, v in extra:
        print(f"| {rate} | " + " | ".join(f"{fa:.3f} / {p1:.2f} / {p2:.2f} / {m:.0f}" for fa, p1, p2, m in v) + " |")


if __name__ == "__main__":
    main()
