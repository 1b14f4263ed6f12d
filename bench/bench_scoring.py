"""Benchmark: score 200 000 trials (40 000 tasks × 5) with every relyscope-v1 metric and a
B = 2000 task-clustered bootstrap, on one core.

Prints wall seconds, peak traced memory of the scoring call (tracemalloc, separate run so tracing
does not distort the timing), process max RSS, and the speed-up over a plain-Python loop
implementation of the same formulas (success rate, pass^1..5, C_out; and a clustered bootstrap of
the success rate, measured at B = 20 and scaled linearly to 2000), all measured in this run.
Ends with one markdown table row.

Usage: ``python bench/bench_scoring.py [--tasks 40000] [--trials-per-task 5] [--n-boot 2000]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402

from relyscope.model import Op, Step, Trial  # noqa: E402
from relyscope.scorers import metrics as M  # noqa: E402
from relyscope.scorers.bootstrap import bootstrap_ratio  # noqa: E402
from relyscope.scorers.profile import score_group  # noqa: E402

TOOLS = ["llm", "search_flights", "get_user", "get_reservation", "book", "cancel", "update_baggage",
         "refund", "send_email", "lookup_order", "handoff:human", "decision:confirm"]  # fmt: skip


def make_trials(n_tasks: int, per_task: int, seed: int = 0) -> tuple[list[Trial], dict[str, float]]:
    """Synthetic group: per-task pass rate ~ Beta(1.2, 1.0); 25 % of tasks have their last trial
    perturbed (fault/env/prompt in turn); confidences with 2 decimals; 5 % of trials violate a
    policy (severity .25/.5/1). Step objects are immutable and shared between trials."""
    rng = random.Random(seed)
    steps = {a: Step(span_id="0" * 16, parent_span_id="", action=a, op=Op.LLM if a == "llm" else Op.TOOL,
                     name=a, start_ns=0, end_ns=1) for a in TOOLS}  # fmt: skip
    trials: list[Trial] = []
    severities: dict[str, float] = {}
    fams = ("fault", "env", "prompt")
    for t in range(n_tasks):
        p = rng.betavariate(1.2, 1.0)
        base = [rng.choice(TOOLS) for _ in range(rng.randint(3, 10))]
        for i in range(per_task):
            ok = rng.random() < p
            acts = [a if rng.random() > 0.2 else rng.choice(TOOLS) for a in base]
            fam = fams[t % 3] if (i == per_task - 1 and t % 4 == 0) else None
            tid = f"{t}-{i}"
            trials.append(
                Trial(
                    trial_id=tid, trace_id=tid, root_span_id="0" * 16, task_id=f"task-{t}",
                    task_id_source="attribute", agent_name="bench", agent_version="1", run_kind="offline",
                    outcome="success" if ok else "failure", outcome_source=None, outcome_score=None,
                    claimed_success=None,
                    confidence=round(min(1.0, max(0.0, (0.6 if ok else 0.4) + rng.gauss(0, 0.2))), 2),
                    conversation_id=None, start_ns=0, end_ns=int(rng.uniform(1, 30) * 1e9),
                    steps=tuple(steps[a] for a in acts), input_tokens=0, output_tokens=0,
                    total_tokens=rng.randint(500, 5000), cost_usd=rng.uniform(0.001, 0.05),
                    model_calls=acts.count("llm"), tool_calls=len(acts) - acts.count("llm"),
                    tool_errors=rng.randint(0, 1), perturbation_family=fam,
                )
            )  # fmt: skip
            if rng.random() < 0.05:
                severities[tid] = rng.choice((0.25, 0.5, 1.0))
    return trials, severities


# --- plain-Python reference implementation of a subset of the formulas ----------------------------


def python_point_metrics(trials: list[Trial], max_k: int) -> dict[str, float]:
    """success rate, pass^1..max_k, C_out with dicts and loops (nominal, known outcome)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tr in trials:
        if tr.status != "complete" or tr.perturbation_family in ("fault", "env", "prompt"):
            continue
        s = tr.success
        if s is None:
            continue
        cn = counts[tr.task_id]
        cn[0] += s
        cn[1] += 1
    out = {"success_rate": sum(c for c, _ in counts.values()) / sum(n for _, n in counts.values())}
    for k in range(1, max_k + 1):
        vals = [math.comb(c, k) / math.comb(n, k) for c, n in counts.values() if n >= k]
        out[f"pass^{k}"] = sum(vals) / len(vals)
    outs = [(2 * c / n - 1) ** 2 for c, n in counts.values() if n >= 2]
    out["C_out"] = sum(outs) / len(outs)
    return out


def vector_point_metrics(trials: list[Trial], max_k: int) -> dict[str, float]:
    """The same subset through relyscope.scorers.metrics (array extraction included)."""
    ids: dict[str, int] = {}
    task, y = [], []
    for tr in trials:
        if tr.status != "complete" or tr.perturbation_family in ("fault", "env", "prompt"):
            continue
        s = tr.success
        if s is None:
            continue
        task.append(ids.setdefault(tr.task_id, len(ids)))
        y.append(s)
    ta, ya = np.asarray(task), np.asarray(y)
    c = np.bincount(ta, weights=ya, minlength=len(ids)).astype(np.int64)
    n = np.bincount(ta, minlength=len(ids))
    out = {"success_rate": M.success_rate(c, n).value}
    for k in range(1, max_k + 1):
        out[f"pass^{k}"] = M.pass_hat_k(c, n, k).value
    out["C_out"] = M.c_out(c, n).value
    return out


def python_bootstrap_success(trials: list[Trial], n_boot: int, seed: int = 0) -> tuple[float, float]:
    """Task-clustered percentile bootstrap of the success rate with plain loops."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tr in trials:
        if tr.perturbation_family in ("fault", "env", "prompt") or tr.success is None:
            continue
        counts[tr.task_id][0] += tr.success
        counts[tr.task_id][1] += 1
    cn = list(counts.values())
    rng = random.Random(seed)
    reps = []
    for _ in range(n_boot):
        sc = sn = 0
        for _ in range(len(cn)):
            c, n = cn[rng.randrange(len(cn))]
            sc += c
            sn += n
        reps.append(sc / sn)
    reps.sort()
    return reps[int(0.025 * (n_boot - 1))], reps[int(0.975 * (n_boot - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40_000)
    ap.add_argument("--trials-per-task", type=int, default=5)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--no-tracemalloc", action="store_true", help="skip the memory-tracing run")
    args = ap.parse_args()

    t0 = time.perf_counter()
    trials, sev = make_trials(args.tasks, args.trials_per_task)
    print(f"built {len(trials)} trials in {time.perf_counter() - t0:.1f} s (not timed)")

    t0 = time.perf_counter()
    g = score_group(trials, severities=sev, n_boot=args.n_boot, seed=0)
    t_full = time.perf_counter() - t0
    t0 = time.perf_counter()
    score_group(trials, severities=sev, n_boot=0)
    t_point = time.perf_counter() - t0
    print(f"score_group all metrics + B={args.n_boot}: {t_full:.2f} s  (point estimates only: {t_point:.2f} s)")
    for key in ("success_rate", "pass^1", "pass^5", "C_out", "C_traj_d", "C_traj_s", "C_res", "R_fault",
                "P_cal", "P_AUROC", "P_brier", "R_Saf", "R"):  # fmt: skip
        mv = g.metrics[key]
        print(f"  {key:12s} {mv.value:.4f}  ci={None if mv.ci is None else tuple(round(x, 4) for x in mv.ci)}  n_tasks={mv.n_tasks}")

    K = args.trials_per_task
    t0 = time.perf_counter()
    ref = python_point_metrics(trials, K)
    t_py = time.perf_counter() - t0
    t0 = time.perf_counter()
    vec = vector_point_metrics(trials, K)
    t_vec = time.perf_counter() - t0
    assert all(abs(ref[k] - vec[k]) < 1e-9 for k in ref), (ref, vec)
    assert all(abs(ref[k] - g.metrics[k].value) < 1e-9 for k in ref)
    print(f"subset (success_rate, pass^1..{K}, C_out): plain Python {t_py:.3f} s, numpy {t_vec:.3f} s, ratio {t_py / t_vec:.1f}x")

    # formulas only, from per-task (c, n) counts (no trial traversal)
    cn_list = []
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tr in trials:
        if tr.perturbation_family not in ("fault", "env", "prompt") and tr.success is not None:
            per[tr.task_id][0] += tr.success
            per[tr.task_id][1] += 1
    cn_list = list(per.values())
    c_arr = np.array([c for c, _ in cn_list])
    n_arr = np.array([n for _, n in cn_list])
    t0 = time.perf_counter()
    sr = sum(c for c, _ in cn_list) / sum(n for _, n in cn_list)
    ph = [sum(math.comb(c, k) / math.comb(n, k) for c, n in cn_list if n >= k) for k in range(1, K + 1)]
    co = sum((2 * c / n - 1) ** 2 for c, n in cn_list if n >= 2)
    t_pyf = time.perf_counter() - t0
    t0 = time.perf_counter()
    M.success_rate(c_arr, n_arr)
    for k in range(1, K + 1):
        M.pass_hat_k(c_arr, n_arr, k)
    M.c_out(c_arr, n_arr)
    t_vf = time.perf_counter() - t0
    del sr, ph, co
    print(f"  formulas only from per-task counts: plain Python {t_pyf * 1e3:.1f} ms, numpy {t_vf * 1e3:.1f} ms, "
          f"ratio {t_pyf / t_vf:.1f}x")  # fmt: skip

    small_b = 20
    t0 = time.perf_counter()
    python_bootstrap_success(trials, small_b)
    t_pyb = (time.perf_counter() - t0) * args.n_boot / small_b
    vm = [tr for tr in trials if tr.perturbation_family not in ("fault", "env", "prompt")]
    ids: dict[str, int] = {}
    ti = np.fromiter((ids.setdefault(tr.task_id, len(ids)) for tr in vm), dtype=np.int64, count=len(vm))
    ys = np.fromiter((tr.success for tr in vm), dtype=np.float64, count=len(vm))
    t0 = time.perf_counter()
    bootstrap_ratio(np.bincount(ti, weights=ys), np.bincount(ti), n_boot=args.n_boot, seed=0)
    t_vb = time.perf_counter() - t0
    print(f"clustered bootstrap of success_rate, B={args.n_boot}: plain Python ~{t_pyb:.1f} s "
          f"(measured at B={small_b}, scaled), numpy {t_vb:.3f} s, ratio ~{t_pyb / t_vb:.0f}x")  # fmt: skip
    print(f"full profile vs plain-Python (subset point metrics + success-rate bootstrap): "
          f"{t_full:.2f} s vs ~{t_py + t_pyb:.1f} s")  # fmt: skip

    peak_mib = float("nan")
    if not args.no_tracemalloc:
        tracemalloc.start()
        score_group(trials, severities=sev, n_boot=args.n_boot, seed=0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        peak_mib = peak / 2**20
        print(f"peak traced memory during score_group: {peak_mib:.0f} MiB")
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process max RSS (incl. the {len(trials)} Trial objects): {rss_mib:.0f} MiB")

    print()
    print("| trials | tasks | B | all metrics + CI (s) | point only (s) | peak traced (MiB) | max RSS (MiB) "
          "| plain-Python subset (s) | numpy subset (s) | subset speed-up | formulas-only speed-up | bootstrap speed-up |")  # fmt: skip
    print(f"| {len(trials):,} | {args.tasks:,} | {args.n_boot} | {t_full:.2f} | {t_point:.2f} | {peak_mib:.0f} | "
          f"{rss_mib:.0f} | {t_py:.2f} | {t_vec:.2f} | {t_py / t_vec:.1f}x | {t_pyf / t_vf:.1f}x | ~{t_pyb / t_vb:.0f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
