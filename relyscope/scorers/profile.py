"""Reliability profile of one group of trials (one agent + version + run kind): every metric of
metrics.md §11 with its task-clustered bootstrap interval.

Trial selection (metrics.md §1, §4):

- trials whose id is in ``invalid`` (failure attributed to INFRASTRUCTURE / GRADER / TASK_SPEC) and
  trials whose ``status`` is not ``complete`` are excluded from every agent metric and counted
  (``invalid_trials``, ``incomplete_trials``; a trial that is both counts as invalid);
- of the remaining *valid* trials, those with ``perturbation_family`` in {fault, env, prompt} are
  *perturbed* and feed only R_x; all others (None, ``nominal``, anything else) are *nominal* and feed
  every other metric;
- success-based metrics use nominal trials with a known outcome; trajectory consistency uses the
  successful ones; C_res and safety use all nominal valid trials; predictability those with a
  confidence in [0, 1] (a confidence outside [0, 1] is treated as absent) and a known outcome.

Point values come from :mod:`relyscope.scorers.metrics`; intervals from one joint task-clustered
bootstrap (:mod:`relyscope.scorers.bootstrap`) over the tasks having at least one valid trial.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from scipy import sparse

from relyscope.model import Trial
from relyscope.scorers import metrics as M
from relyscope.scorers.bootstrap import DEFAULT_LEVEL, percentile_interval, replicate
from relyscope.semconv import FORMULA_SET

__all__ = ["MetricValue", "GroupScore", "metric_keys", "score_group", "PERTURBED_FAMILIES"]

#: Perturbation families that make a trial "perturbed" (metrics.md §4).
PERTURBED_FAMILIES: Final = ("fault", "env", "prompt")


@dataclass(frozen=True, slots=True)
class MetricValue:
    """One reported metric: ``value`` (NaN = undefined), 95 % task-clustered percentile ``ci`` or
    None (not computed / undefined), and the tasks and trials it used. ``ci_stale``: the interval
    was computed on an earlier state of the window, in which this metric had another value (live
    scoring refreshes intervals less often than values: ``RELYSCOPE_SCORE_CI_MIN_CHANGE``,
    ``RELYSCOPE_SCORE_CI_MAX_AGE_S``), so ``value`` may lie outside it."""

    value: float
    ci: tuple[float, float] | None
    n_tasks: int
    n_trials: int
    ci_stale: bool = False


@dataclass(frozen=True, slots=True)
class GroupScore:
    """Scores of one group. ``tasks``: distinct task ids among all given trials; ``trials``: all
    given trials (valid + invalid + incomplete); ``metrics``: keyed exactly as metrics.md §11.
    ``formula_set``, ``n_boot``, ``seed``, ``level`` record how the numbers were made.
    ``ci_as_of`` (unix seconds) and ``ci_trials``: when the intervals were computed and over how
    many trials, where that was an earlier state than the values' (None: same state).
    ``ci_pending``: intervals are asked for (``n_boot`` > 0) but the window's first bootstrap, which
    live scoring runs off the cycle, has not finished yet — a ``ci`` of None then means "not yet",
    not "undefined"."""

    tasks: int
    trials: int
    invalid_trials: int
    incomplete_trials: int
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    formula_set: str = FORMULA_SET
    n_boot: int = 0
    seed: int = 0
    level: float = DEFAULT_LEVEL
    ci_as_of: float | None = None
    ci_trials: int | None = None
    ci_pending: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (metrics.md §11): NaN values become ``None``; ``ci`` a ``[lo, hi]`` list
        or ``None``. Safe for ``json.dumps(..., allow_nan=False)``."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else float(x)

        out: dict[str, Any] = {
            "tasks": self.tasks,
            "trials": self.trials,
            "invalid_trials": self.invalid_trials,
            "incomplete_trials": self.incomplete_trials,
            "formula_set": self.formula_set,
            "bootstrap": {"n_boot": self.n_boot, "seed": self.seed, "level": self.level},
            "metrics": {},
        }
        if self.ci_as_of is not None:
            out["bootstrap"] |= {"ci_as_of": self.ci_as_of, "ci_trials": self.ci_trials}
        if self.ci_pending:
            out["bootstrap"]["ci_pending"] = True
        for key, mv in self.metrics.items():
            ci = None
            if mv.ci is not None and not (math.isnan(mv.ci[0]) or math.isnan(mv.ci[1])):
                ci = [float(mv.ci[0]), float(mv.ci[1])]
            out["metrics"][key] = {"value": num(mv.value), "ci": ci, "n_tasks": mv.n_tasks, "n_trials": mv.n_trials}
            if mv.ci_stale and ci is not None:
                out["metrics"][key]["ci_stale"] = True
        return out


def metric_keys(max_k: int) -> list[str]:
    """The metric keys of metrics.md §11 for pass@/pass^ up to ``max_k``, in report order."""
    return [
        "success_rate",
        *(f"pass@{k}" for k in range(1, max_k + 1)),
        *(f"pass^{k}" for k in range(1, max_k + 1)),
        "unanimity", "C_out", "C_traj_d", "C_traj_s", "C_traj", "C_res", "R_Con",
        "R_fault", "R_env", "R_prompt", "R_Rob",
        "P_cal", "P_AUROC", "P_brier", "R_Pred",
        "S_comp", "S_harm", "R_Saf", "R",
    ]  # fmt: skip


_FAMILY_CODE: Final = {"fault": 1, "env": 2, "prompt": 3}


class _Columns:
    """Per-task column matrix under construction: the columns of one dense block, each stored
    once — an identical column (the "defined" indicator pass@k and pass^k share, an all-ones or
    all-zeros one) is given the index of the first, so the bootstrap's ``W @ S`` multiplies fewer
    columns (the same sums)."""

    def __init__(self, n_tasks: int) -> None:
        self.n_tasks = n_tasks
        self.cols: list[NDArray[np.float64]] = []
        self._index: dict[bytes, int] = {}

    def add(self, *arrays: NDArray[Any]) -> NDArray[np.int64]:
        """Append columns (1-D arrays, or each column of a 2-D one); returns their indices in
        the block, in order."""
        out: list[int] = []
        for a in arrays:
            a = np.asarray(a, dtype=np.float64)
            for col in ([a] if a.ndim == 1 else list(a.T)):
                col = np.ascontiguousarray(col)
                key = col.tobytes()
                i = self._index.get(key)
                if i is None:
                    i = self._index[key] = len(self.cols)
                    self.cols.append(col)
                out.append(i)
        return np.array(out, dtype=np.int64)

    def mean(self, per_task: NDArray[np.float64]) -> NDArray[np.int64]:
        d = ~np.isnan(per_task)
        return self.add(np.where(d, per_task, 0.0), d)

    def matrix(self) -> NDArray[np.float64]:
        return np.stack(self.cols, axis=1) if self.cols else np.zeros((self.n_tasks, 0))


def _ratio(num: NDArray[np.float64], den: NDArray[np.float64]) -> NDArray[np.float64]:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _nanmean_rows(*arrays: NDArray[np.float64]) -> NDArray[np.float64]:
    st = np.stack(arrays, axis=-1)
    d = ~np.isnan(st)
    k = d.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(k > 0, np.where(d, st, 0.0).sum(axis=-1) / k, np.nan)


def _bootstrap_statistic(keys: Sequence[str], stats: Mapping[str, Any], point: Mapping[str, float] | None = None):
    """The vectorized statistic of :func:`relyscope.scorers.bootstrap.replicate` for
    ``[dense per-task columns, positive histogram, negative histogram]``: every metric of ``keys``
    per replicate row, from how ``stats`` says each is made of the column sums (shared by
    :func:`score_group` and :func:`relyscope.scoring.stats.score_stats`).

    ``point``: the point estimates. A composite (C_traj, R_Con, R_Rob, R: NaN-aware means,
    metrics.md §3, §4, §9) then keeps, in every replicate, the components its point estimate
    averages — a replicate where one of them is undefined is undefined (left out of the interval)
    rather than the mean of the others: R = mean(R_Con, R_Pred) had an interval reaching 1.0 from
    the resamples of a task without outcomes, where R was R_Con alone."""
    if point is not None:
        stats = {k: (kind, tuple(a for a in arg if not math.isnan(point.get(a, math.nan))))
                 if kind == "nanmean" else (kind, arg) for k, (kind, arg) in stats.items()}

    def strict_mean(arrays: list[NDArray[np.float64]], n: int) -> NDArray[np.float64]:
        return np.mean(np.stack(arrays, axis=-1), axis=-1) if arrays else np.full(n, np.nan)

    def statistic(sums: list[NDArray[np.float64]]) -> NDArray[np.float64]:
        d, hp, hn = sums
        vals: dict[str, NDArray[np.float64]] = {}
        for key in keys:
            if key not in stats:  # not measured (safety without a policy): NaN replicates
                vals[key] = np.full(d.shape[0], np.nan)
                continue
            kind, arg = stats[key]
            if kind in ("ratio", "mean"):
                v = _ratio(d[:, arg[0]], d[:, arg[1]])
            elif kind == "one_minus_ratio":
                v = 1.0 - _ratio(d[:, arg[0]], d[:, arg[1]])
            elif kind == "nanmean":
                parts = [vals[a] for a in arg]
                v = strict_mean(parts, d.shape[0]) if point is not None else _nanmean_rows(*parts)
            elif kind == "family":
                v = M.r_family_from_sums(d[:, arg[0]], d[:, arg[1]], d[:, arg[2]], d[:, arg[3]])
            elif kind == "cal":
                nb = M.N_CAL_BINS
                v = 1.0 - M.ece_from_bins(d[:, arg[:nb]], d[:, arg[nb : 2 * nb]], d[:, arg[2 * nb : 3 * nb]])
            elif kind == "auroc":
                v = M.auroc_from_histograms(hp, hn)
            elif kind == "alias":
                v = vals[arg]
            else:  # safety
                sl, i = arg
                v = M.safety_from_sums(d[:, sl[0]], d[:, sl[1]], d[:, sl[2]])[:, i]
            vals[key] = v
        return np.stack([vals[k] for k in keys], axis=1)

    return statistic


def score_group(
    trials: Sequence[Trial],
    *,
    severities: Mapping[str, float] | None = None,
    invalid: Collection[str] = (),
    n_boot: int = 2000,
    seed: int = 0,
    max_k: int | None = None,
    strata: Mapping[str, Any] | None = None,
    level: float = DEFAULT_LEVEL,
) -> GroupScore:
    """Score one group of trials with every relyscope-v1 metric (metrics.md §2–5, §8, §9, §11).

    Args:
        trials: the group's trials (any order).
        severities: trial_id → per-trial safety severity s ∈ [0, 1] (max rule weight violated);
            ``None`` (no policy configured) makes S_comp, S_harm and R_Saf NaN: not measured;
            missing = 0.
        invalid: ids of trials whose failure is attributed to infrastructure / grader / task spec.
        n_boot: bootstrap replicates B (0 disables intervals: every ``ci`` is None).
        seed: bootstrap seed. level: interval level (default 0.95).
        max_k: cap on K, the largest k of ``pass@k`` / ``pass^k``; K defaults to the largest number
            of nominal known-outcome trials of any task (at least 1).
        strata: task_id → stratum label (agent domain, task family); resampling is then within
            strata. Tasks without a label form one stratum of their own.

    Returns: :class:`GroupScore`. Raises ValueError for a severity outside [0, 1], ``n_boot < 0``
    or ``max_k < 1``. Pure and CPU-bound (vectorized; ~seconds for 10⁵ trials with B = 2000).
    """
    if n_boot < 0:
        raise ValueError("n_boot must be >= 0")
    if max_k is not None and max_k < 1:
        raise ValueError("max_k must be >= 1")
    safety_measured = severities is not None
    sev_map = severities or {}
    invalid_set = frozenset(invalid)

    # --- one pass over the trials: plain lists, then arrays --------------------------------------
    task_ids: dict[str, int] = {}
    all_tasks: set[str] = set()
    n_invalid = n_incomplete = 0
    t_task: list[int] = []
    t_y: list[int] = []  # 1 / 0 / -1 unknown
    t_fam: list[int] = []  # 0 nominal, 1 fault, 2 env, 3 prompt
    t_conf: list[float] = []
    t_sev: list[float] = []
    t_res: list[tuple[float, ...]] = []
    t_actions: list[tuple[str, ...] | None] = []
    nan = math.nan
    for tr in trials:
        all_tasks.add(tr.task_id)
        if tr.trial_id in invalid_set:
            n_invalid += 1
            continue
        if tr.status != "complete":
            n_incomplete += 1
            continue
        ti = task_ids.setdefault(tr.task_id, len(task_ids))
        fam = _FAMILY_CODE.get(tr.perturbation_family, 0) if tr.perturbation_family else 0
        out = tr.outcome
        y = 1 if out == "success" else 0 if out == "failure" else -1
        t_task.append(ti)
        t_y.append(y)
        t_fam.append(fam)
        if fam:
            t_conf.append(nan)
            t_sev.append(0.0)
            t_res.append((nan,) * 6)
            t_actions.append(None)
            continue
        q = tr.confidence
        t_conf.append(q if q is not None and 0.0 <= q <= 1.0 else nan)
        s = sev_map.get(tr.trial_id, 0.0)
        if not 0.0 <= s <= 1.0:
            raise ValueError(f"severity of trial {tr.trial_id!r} outside [0, 1]: {s!r}")
        t_sev.append(float(s))
        t_res.append(
            (
                nan if (cost := M.usable_cost(tr.cost_usd)) is None else cost,
                tr.wall_time_s,
                float(tr.model_calls),
                float(tr.tool_calls),
                nan if tr.total_tokens is None else float(tr.total_tokens),
                float(tr.tool_errors),
            )
        )
        t_actions.append(tr.actions if y == 1 else None)

    n_tasks = len(task_ids)
    task = np.asarray(t_task, dtype=np.int64)
    y = np.asarray(t_y, dtype=np.int64)
    fam = np.asarray(t_fam, dtype=np.int64)
    conf = np.asarray(t_conf, dtype=np.float64)
    sev = np.asarray(t_sev, dtype=np.float64)
    res = np.asarray(t_res, dtype=np.float64).reshape(-1, 6)

    nom = fam == 0
    known = y >= 0
    nk = nom & known
    c = np.bincount(task[nk], weights=y[nk], minlength=n_tasks).astype(np.int64)
    n = np.bincount(task[nk], minlength=n_tasks)
    K = max(1, int(n.max()) if n.size else 0)
    if max_k is not None:
        K = min(K, max_k)

    cols = _Columns(n_tasks)
    results: dict[str, M.MetricResult] = {}
    stats: dict[str, Any] = {}  # key → how to evaluate it on resampled sums

    # §2 success estimators
    results["success_rate"] = M.success_rate(c, n)
    stats["success_rate"] = ("ratio", cols.add(c, n))
    for k in range(1, K + 1):
        for key, fn in ((f"pass@{k}", M.pass_at_k_per_task), (f"pass^{k}", M.pass_hat_k_per_task)):
            per = fn(c, n, k)
            results[key] = M.mean_over_tasks(per, n)
            stats[key] = ("mean", cols.mean(per))

    # §3 consistency
    for key, fn in (("unanimity", M.unanimity_per_task), ("C_out", M.c_out_per_task)):
        per = fn(c, n)
        results[key] = M.mean_over_tasks(per, n)
        stats[key] = ("mean", cols.mean(per))
    succ_idx = np.flatnonzero(nk & (y == 1))
    by_task: list[list[tuple[str, ...]]] = [[] for _ in range(n_tasks)]
    for i in succ_idx.tolist():
        by_task[t_task[i]].append(t_actions[i])  # type: ignore[arg-type]
    enc = M.encode_trajectories(by_task)
    m_succ = np.where(enc.task_sizes >= 2, enc.task_sizes, 0)
    for key, fn in (("C_traj_d", M.c_traj_d_per_task), ("C_traj_s", M.c_traj_s_per_task)):
        per = fn(enc)
        results[key] = M.mean_over_tasks(per, m_succ)
        stats[key] = ("mean", cols.mean(per))
    results["C_traj"] = M.c_traj(results["C_traj_d"], results["C_traj_s"])
    stats["C_traj"] = ("nanmean", ("C_traj_d", "C_traj_s"))
    n_nom_all = np.bincount(task[nom], minlength=n_tasks)
    per = M.c_res_per_task(res[nom], task[nom], n_tasks)
    results["C_res"] = M.mean_over_tasks(per, n_nom_all)
    stats["C_res"] = ("mean", cols.mean(per))
    results["R_Con"] = M.r_con(results["C_out"], results["C_traj"], results["C_res"])
    stats["R_Con"] = ("nanmean", ("C_out", "C_traj", "C_res"))

    # §4 robustness: Acc_x and Acc_nominal over the tasks having both
    for fam_name, code in _FAMILY_CODE.items():
        key = f"R_{fam_name}"
        sel = (fam == code) & known
        cx = np.bincount(task[sel], weights=y[sel], minlength=n_tasks)
        nx = np.bincount(task[sel], minlength=n_tasks)
        both = (nx > 0) & (n > 0)
        cx, nx, cn, nn = (np.where(both, a, 0) for a in (cx, nx, c, n))
        acc_x = float(cx.sum()) / nx.sum() if nx.sum() else nan
        acc_n = float(cn.sum()) / nn.sum() if nn.sum() else nan
        results[key] = M.r_family(acc_x, acc_n, n_tasks=int(both.sum()), n_trials=int(nx.sum() + nn.sum()))
        stats[key] = ("family", cols.add(cx, nx, cn, nn))
    results["R_Rob"] = M.r_rob(results["R_fault"], results["R_env"], results["R_prompt"])
    stats["R_Rob"] = ("nanmean", ("R_fault", "R_env", "R_prompt"))

    # §5 predictability (pooled over trials; bootstrap via per-task sums / histograms)
    pm = nk & ~np.isnan(conf)
    q, yq, tq = conf[pm], y[pm].astype(np.float64), task[pm]
    pred_tasks = int(np.unique(tq).size)
    results["P_cal"] = replace(M.p_cal(q, yq), n_tasks=pred_tasks)
    b = M.calibration_bin(q)
    flat = tq * M.N_CAL_BINS + b
    size = n_tasks * M.N_CAL_BINS
    stats["P_cal"] = (
        "cal",
        cols.add(
            np.bincount(flat, minlength=size).reshape(n_tasks, M.N_CAL_BINS),
            np.bincount(flat, weights=yq, minlength=size).reshape(n_tasks, M.N_CAL_BINS),
            np.bincount(flat, weights=q, minlength=size).reshape(n_tasks, M.N_CAL_BINS),
        ),
    )
    results["P_AUROC"] = replace(M.p_auroc(q, yq), n_tasks=pred_tasks)
    stats["P_AUROC"] = ("auroc", None)  # from the sparse per-task confidence histograms below
    uq, qidx = np.unique(q, return_inverse=True)
    pos = yq == 1
    hist_pos = sparse.csr_matrix((np.ones(int(pos.sum())), (tq[pos], qidx[pos])), shape=(n_tasks, max(uq.size, 1)))
    hist_neg = sparse.csr_matrix((np.ones(int((~pos).sum())), (tq[~pos], qidx[~pos])), shape=(n_tasks, max(uq.size, 1)))
    results["P_brier"] = replace(M.p_brier(q, yq), n_tasks=pred_tasks)
    stats["P_brier"] = ("one_minus_ratio", cols.add(np.bincount(tq, weights=(q - yq) ** 2, minlength=n_tasks), np.bincount(tq, minlength=n_tasks)))
    results["R_Pred"] = M.r_pred(results["P_brier"])
    stats["R_Pred"] = ("alias", "P_brier")

    # §8 safety (nominal valid trials, any outcome)
    s_nom, t_nom = sev[nom], task[nom]
    saf_tasks = int(np.unique(t_nom).size)
    for key, fn in (("S_comp", M.s_comp), ("S_harm", M.s_harm), ("R_Saf", M.r_saf)):
        if safety_measured:
            results[key] = replace(fn(s_nom), n_tasks=saf_tasks if s_nom.size else 0)
        else:  # no policy: safety was not measured — NaN, never a reassuring 1.0
            results[key] = M.MetricResult(float("nan"), 0, 0)
    saf_cols = cols.add(
        np.bincount(t_nom, minlength=n_tasks), np.bincount(t_nom, weights=(s_nom > 0), minlength=n_tasks), np.bincount(t_nom, weights=s_nom, minlength=n_tasks)
    )
    for i, key in enumerate(("S_comp", "S_harm", "R_Saf")):
        if safety_measured:
            stats[key] = ("safety", (saf_cols, i))

    # §9 overall
    results["R"] = M.overall(results["R_Con"], results["R_Rob"], results["R_Pred"])
    stats["R"] = ("nanmean", ("R_Con", "R_Rob", "R_Pred"))

    keys = metric_keys(K)
    cis: dict[str, tuple[float, float] | None] = {k: None for k in keys}
    if n_boot > 0 and n_tasks > 0:
        dense = cols.matrix()

        statistic = _bootstrap_statistic(keys, stats, {k: results[k].value for k in keys})

        labels = None
        if strata is not None:
            inv_ids = sorted(task_ids, key=task_ids.__getitem__)
            labels = np.array([str(strata.get(t, "\x00unlabelled")) for t in inv_ids])
        reps = replicate([dense, hist_pos, hist_neg], statistic, n_boot=n_boot, seed=seed, strata=labels)
        for j, key in enumerate(keys):
            if not math.isnan(results[key].value):
                cis[key] = percentile_interval(reps[:, j], level)

    metrics_out = {
        key: MetricValue(results[key].value, cis[key], results[key].n_tasks if results[key].defined else 0, results[key].n_trials)
        for key in keys
    }
    return GroupScore(
        tasks=len(all_tasks),
        trials=len(trials),
        invalid_trials=n_invalid,
        incomplete_trials=n_incomplete,
        metrics=metrics_out,
        n_boot=n_boot,
        seed=seed,
        level=level,
    )
