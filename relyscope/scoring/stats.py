"""Per-task sufficient statistics of a group's trials, and every relyscope-v1 metric from them.

The live scorer never reloads a group's trial history: each trial, once its outcome is resolved
(metrics.md §6) and it is graded (§7, §8), becomes one *contribution* — a row of integer counts and
sums (:func:`contribution`). Contributions add up per (group, task, time bucket) in ClickHouse
(:mod:`relyscope.scoring.rollup`); a window's per-task statistics are the sums over its buckets
(:class:`TaskStats`), and :func:`score_stats` computes every metric of metrics.md §11 and its
task-clustered bootstrap interval (§10) from them alone, with the kernels of
:mod:`relyscope.scorers.metrics` and :mod:`relyscope.scorers.bootstrap`.

What each metric needs, per task t (all counts over *valid, complete* trials unless said):

- §2/§3 success estimators, unanimity, C_out: ``c`` successes and ``n`` known outcomes of nominal
  trials;
- C_res: per resource r (metrics.md §3 order: cost_usd, wall_time_s, model_calls, tool_calls,
  total_tokens, tool_errors) the count of available values, their sum and sum of squares, *as
  integers* (cost in nano-USD, wall time in ns; the others are counts), so that sums with later
  retractions are exact and ``std(ddof=1)`` has no cancellation error: ``var = (n Σx² − (Σx)²) /
  (n (n − 1))`` in exact integer arithmetic. Quantizing cost to 1e-9 USD changes a CV by less than
  1e-9 relative for any cost above 1 µUSD (a cost that is not finite or beyond
  :data:`relyscope.scorers.metrics.MAX_COST_USD` is not available, in the batch scorer too);
- R_x: successes and known outcomes of perturbed trials per family, beside ``c``, ``n``;
- P_cal: per calibration bin the count, Σy and Σq; P_brier: Σ(q − y)² and the count; P_AUROC: per
  distinct confidence value the count of successes and failures (exact values, no binning: ties
  count ½ exactly as the rank formula);
- safety: nominal valid trials, those with s > 0, and Σ s;
- C_traj_d / C_traj_s need the runs themselves: the action sequences of successful nominal runs
  (in the live scorer a bounded sample per task: the most recent M, see the rollup).

Task order: tasks are indexed in sorted ``task_id`` order, so the bootstrap draws equal those of
:func:`relyscope.scorers.profile.score_group` given the same trials sorted by task id (its
interval depends on task order only through which random draw falls on which task).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from scipy import sparse

from relyscope.model import Trial
from relyscope.scorers import metrics as M
from relyscope.scorers.bootstrap import DEFAULT_LEVEL, percentile_interval, replicate
from relyscope.scorers.profile import GroupScore, MetricValue, metric_keys

__all__ = ["SUM_COLUMNS", "contribution", "TaskStats", "stats_from_contributions", "score_stats",
           "RES_SCALE"]

_FAMILIES: Final = ("fault", "env", "prompt")
#: Integer scale of each resource (metrics.md §3 order): nano-USD, ns, then plain counts.
RES_SCALE: Final = (1e9, 1e9, 1, 1, 1, 1)
N_RES: Final = len(M.RESOURCES)
NB: Final = M.N_CAL_BINS

#: Summed columns of a contribution, in order; (name, ClickHouse type).
SUM_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("n_all", "Int64"), ("n_invalid", "Int64"), ("n_incomplete", "Int64"),
    ("c", "Int64"), ("n", "Int64"), ("n_nom", "Int64"),
    # sums in Int128, sums of squares in Int256: one trial's square reaches 2^126 (wall time in
    # ns up to 2^63) or 2^128 (tokens, UInt64), so Int128 squares wrapped (C_res of a task with
    # ~60 runs of a missing start, 1970 → now, came out wrong) or failed the insert (every later
    # sync with it)
    *((f"r{i}_{s}", "Int64" if s == "n" else "Int128" if s == "s" else "Int256")
      for i in range(N_RES) for s in ("n", "s", "ss")),
    *((f"{f}_{s}", "Int64") for f in _FAMILIES for s in ("c", "n")),
    *((f"cal{b}_{s}", "Float64" if s == "q" else "Int64") for b in range(NB) for s in ("n", "y", "q")),
    ("brier_s", "Float64"), ("brier_n", "Int64"),
    ("saf_v", "Int64"), ("saf_s", "Float64"),
)
_COL_INDEX: Final = {name: i for i, (name, _) in enumerate(SUM_COLUMNS)}
#: the columns held as Python ints (exact beyond int64 / float64)
BIG_TYPES: Final = ("Int128", "Int256")
_BIG_COLS: Final = frozenset(i for i, (_, t) in enumerate(SUM_COLUMNS) if t in BIG_TYPES)


def _resource_ints(t: Trial) -> list[int | None]:
    """The six resources of metrics.md §3 as integers (:data:`RES_SCALE`); None = not available."""
    def num(v: float | int | None, scale: float) -> int | None:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        return int(v) if scale == 1 else int(round(float(v) * scale))

    return [num(M.usable_cost(t.cost_usd), RES_SCALE[0]),  # |cost| ≤ 1e18 USD: |nano-USD| < 2^90
            max(0, t.end_ns - t.start_ns),  # wall time in exact ns (Trial.wall_time_s × 1e9)
            num(t.model_calls, 1), num(t.tool_calls, 1), num(t.total_tokens, 1), num(t.tool_errors, 1)]


@dataclass(frozen=True, slots=True)
class Contribution:
    """One trial's part of its task's statistics: ``sums`` aligned with :data:`SUM_COLUMNS`,
    ``conf`` = (q, success 0/1) if it feeds predictability, ``actions`` if it is a successful
    nominal valid run (a trajectory-sample candidate)."""

    sums: tuple
    conf: tuple[float, int] | None
    actions: tuple[str, ...] | None

    def negated(self) -> "Contribution":
        return Contribution(tuple(-x for x in self.sums), self.conf, self.actions)


def contribution(t: Trial, *, severity: float = 0.0, invalid: bool = False) -> Contribution:
    """The contribution of one trial whose outcome is already resolved (metrics.md §6) and which is
    graded: ``severity`` s ∈ [0, 1] (§8; 0 without a policy), ``invalid`` if its failure is
    attributed to INFRASTRUCTURE / GRADER / TASK_SPEC (§7). Trial selection as
    :func:`relyscope.scorers.profile.score_group`. Raises ValueError for a severity outside [0, 1]."""
    s = [0] * len(SUM_COLUMNS)
    s[0] = 1
    if invalid:
        s[1] = 1
        return Contribution(tuple(s), None, None)
    if t.status != "complete":
        s[2] = 1
        return Contribution(tuple(s), None, None)
    y = 1 if t.outcome == "success" else 0 if t.outcome == "failure" else -1
    fam = t.perturbation_family if t.perturbation_family in _FAMILIES else None
    if fam is not None:
        if y >= 0:
            s[_COL_INDEX[f"{fam}_c"]] = y
            s[_COL_INDEX[f"{fam}_n"]] = 1
        return Contribution(tuple(s), None, None)
    if not 0.0 <= severity <= 1.0:
        raise ValueError(f"severity of trial {t.trial_id!r} outside [0, 1]: {severity!r}")
    s[_COL_INDEX["n_nom"]] = 1
    if y >= 0:
        s[_COL_INDEX["c"]] = y
        s[_COL_INDEX["n"]] = 1
    for i, v in enumerate(_resource_ints(t)):
        if v is not None:
            s[_COL_INDEX[f"r{i}_n"]] = 1
            s[_COL_INDEX[f"r{i}_s"]] = v
            s[_COL_INDEX[f"r{i}_ss"]] = v * v
    if severity > 0:
        s[_COL_INDEX["saf_v"]] = 1
        s[_COL_INDEX["saf_s"]] = float(severity)
    conf = None
    q = t.confidence
    if y >= 0 and q is not None and 0.0 <= q <= 1.0:
        q = float(q)
        b = int(M.calibration_bin(np.array([q]))[0])
        s[_COL_INDEX[f"cal{b}_n"]] = 1
        s[_COL_INDEX[f"cal{b}_y"]] = y
        s[_COL_INDEX[f"cal{b}_q"]] = q
        s[_COL_INDEX["brier_s"]] = (q - y) ** 2
        s[_COL_INDEX["brier_n"]] = 1
        conf = (q, y)
    return Contribution(tuple(s), conf, tuple(t.actions) if y == 1 else None)


@dataclass
class TaskStats:
    """Summed statistics of one group over one window, one row per task.

    ``task_ids`` sorted; ``sums`` ``(n_tasks, len(SUM_COLUMNS))`` (object dtype: Python ints, so
    Int128 / Int256 sums stay exact); ``hist`` ``(task index, q, successes, failures)`` rows of the
    confidence histogram; ``trajectories[i]`` the action sequences of task i's successful nominal
    runs used for C_traj (all of them, or the live scorer's bounded sample). ``max_end_ns``: the
    latest end time (Unix ns) of a trial folded into these buckets (0: unknown).
    ``pooled_hist``: instead of ``hist``, the histogram summed over tasks, ``(q, successes,
    failures)`` rows — enough for every point estimate, not for a bootstrap (the in-memory long
    windows of :mod:`relyscope.scoring.live` keep only this). ``traj_values``: see the field."""

    task_ids: list[str]
    sums: NDArray[Any]
    hist: list[tuple[int, float, int, int]] = field(default_factory=list)
    trajectories: list[list[tuple[str, ...]]] = field(default_factory=list)
    max_end_ns: int = 0
    pooled_hist: list[tuple[float, int, int]] | None = None
    #: optional (C_traj_d, C_traj_s) per task (arrays aligned with ``task_ids``) of
    #: ``trajectories``, as :func:`relyscope.scorers.metrics.c_traj_d_per_task` /
    #: ``c_traj_s_per_task`` give them: a caller that caches them skips recomputing
    traj_values: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
    #: optional number of runs in ``trajectories[i]`` per task (aligned with ``task_ids``), given
    #: with ``traj_values`` by a caller that leaves ``trajectories`` empty (the live scorer's
    #: point estimates: the sizes are all the metrics read of the sample once C_traj is known)
    traj_sizes: NDArray[np.int64] | None = None
    #: optional per-task C_res (aligned with ``task_ids``) as :func:`c_res_per_task` gives it: a
    #: caller that keeps it per task (recomputing only the tasks whose sums changed) skips the
    #: exact-integer arithmetic for every task of the window
    c_res: NDArray[np.float64] | None = None
    #: optional float64 copy of ``sums`` (same shape; Int128 columns NaN: not representable) that
    #: :meth:`col` reads the Int64 / Float64 columns from (Int64 sums below 2⁵³ are exact in it);
    #: with it, ``sums`` need only hold the Int128 columns (the others may be None)
    fsums: NDArray[np.float64] | None = None

    def col(self, name: str) -> NDArray[Any]:
        i = _COL_INDEX[name]
        if self.fsums is not None and i not in _BIG_COLS:
            return self.fsums[:, i]
        return self.sums[:, i] if self.sums.size else np.zeros(0, dtype=object)


def stats_from_contributions(rows: Sequence[tuple[str, Contribution]]) -> TaskStats:
    """Sum (task id, contribution) pairs per task (the reference for what the rollup stores)."""
    per: dict[str, list] = {}
    hist: dict[tuple[str, float], list[int]] = {}
    traj: dict[str, list] = {}
    for task, ctb in rows:
        acc = per.setdefault(task, [0] * len(SUM_COLUMNS))
        for i, v in enumerate(ctb.sums):
            acc[i] += v
        if ctb.conf is not None:
            h = hist.setdefault((task, ctb.conf[0]), [0, 0])
            h[0 if ctb.conf[1] == 1 else 1] += 1 if ctb.sums[0] > 0 else -1
        if ctb.actions is not None:
            runs = traj.setdefault(task, [])
            if ctb.sums[0] > 0:
                runs.append(ctb.actions)
            else:  # a retraction removes the run it retracts
                runs.remove(ctb.actions)
    ids = sorted(per)
    idx = {t: i for i, t in enumerate(ids)}
    sums = np.array([per[t] for t in ids], dtype=object).reshape(len(ids), len(SUM_COLUMNS))
    return TaskStats(ids, sums, [(idx[t], q, p, n) for (t, q), (p, n) in sorted(hist.items()) if p or n],
                     [traj.get(t, []) for t in ids])


def _f(a: NDArray[Any]) -> NDArray[np.float64]:
    return np.asarray(a, dtype=np.float64)


#: max_k → (sorted keys, rows): pass@1..max_k, pass^1..max_k of the (c, n) pair keyed
#: ``n (n + 1) / 2 + c`` (they depend on (c, n) alone), remembered across calls. A table is
#: replaced whole, never changed in place: a reader holding the old one (another thread) is safe.
_PASS_TABLES: dict[int, tuple[NDArray[np.int64], NDArray[np.float64]]] = {}
_PASS_MEMO_MAX: Final = 200_000


def _pass_rows(c: NDArray[np.int64], n: NDArray[np.int64], max_k: int) -> NDArray[np.float64]:
    """``(len(c), 2·max_k)``: pass@k then pass^k per task for k = 1..max_k, by the kernels of
    :mod:`relyscope.scorers.metrics` (``pass_at_k_per_task``, ``pass_hat_k_per_task``: exact
    integer binomials) evaluated once per distinct (c, n) pair and remembered across calls (at most
    ``_PASS_MEMO_MAX`` pairs per ``max_k``; a lookup is one ``searchsorted``, no per-task Python).
    Raises ValueError unless 0 ≤ c ≤ n."""
    c, n = M._counts(c, n)  # the kernels' checks, before anything is remembered
    if not c.size:
        return np.empty((0, 2 * max_k))
    key = n * (n + 1) // 2 + c  # a distinct key per pair with 0 <= c <= n
    uk, first, inv = np.unique(key, return_index=True, return_inverse=True)
    keys, rows = _PASS_TABLES.get(max_k) or (np.zeros(0, np.int64), np.zeros((0, 2 * max_k)))
    pos = np.searchsorted(keys, uk)
    hit = pos < keys.size
    hit[hit] = keys[pos[hit]] == uk[hit]
    if not hit.all():
        miss = np.flatnonzero(~hit)
        cm, nm = c[first[miss]], n[first[miss]]
        tab = np.empty((miss.size, 2 * max_k))
        for k in range(1, max_k + 1):
            tab[:, k - 1] = M.pass_at_k_per_task(cm, nm, k)
            tab[:, max_k + k - 1] = M.pass_hat_k_per_task(cm, nm, k)
        if keys.size + miss.size > _PASS_MEMO_MAX:  # start over with the pairs of this call
            keys, rows = uk[hit], rows[pos[hit]]
        keys = np.concatenate([keys, uk[miss]])
        rows = np.concatenate([rows, tab])
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        _PASS_TABLES[max_k] = (keys, rows)
        pos = np.searchsorted(keys, uk)
    return rows[pos][inv.reshape(-1)]


def _means_over_tasks(per: NDArray[np.float64], n_trials: NDArray[Any]) -> list[M.MetricResult]:
    """:func:`relyscope.scorers.metrics.mean_over_tasks` of each column of ``per`` ``(n_tasks,
    m)`` (NaN = undefined for that task), with the trials ``n_trials`` ``(n_tasks,)`` each task
    used; one vectorized pass instead of m calls (equal up to the order of summation)."""
    d = ~np.isnan(per)
    nt = d.sum(axis=0)
    trials = np.where(d, np.asarray(n_trials, dtype=np.int64)[:, None], 0).sum(axis=0)
    tot = np.where(d, per, 0.0).sum(axis=0)
    return [M.MetricResult(float(tot[j] / nt[j]) if nt[j] else math.nan, int(nt[j]), int(trials[j]))
            for j in range(per.shape[1])]


_I63: Final = 2**63


def c_res_per_task(st: TaskStats) -> NDArray[np.float64]:
    """Per-task C_res ``(n_tasks,)``, NaN where undefined; each task's value depends on its own
    sums alone (metrics.md §3, as :func:`relyscope.scorers.metrics.c_res_per_task`) from the
    exact integer sums: per resource ``CV = sqrt(var) / |mean|``; skipped (NaN) with < 2 values or
    mean = std = 0; +inf (excluded) when mean = 0 < std. The numerator ``n Σx² − (Σx)²`` is
    formed in exact integers: int64 when ``n Σx²`` and ``(Σx)²`` fit in it (and ``Σx² ≥ 0``),
    else object arrays (elementwise Python ints)."""
    nt = len(st.task_ids)
    if not nt:
        return np.zeros(0)
    cv = np.full((nt, N_RES), np.nan)
    for r in range(N_RES):
        cnt = np.asarray(st.col(f"r{r}_n"), dtype=np.int64)
        ok = np.flatnonzero(cnt >= 2)
        if not ok.size:
            continue
        n = cnt[ok]
        sm = st.col(f"r{r}_s")[ok].astype(object)
        ss = st.col(f"r{r}_ss")[ok].astype(object)
        ssl, sml = ss.tolist(), sm.tolist()
        if min(ssl) >= 0 and int(n.max()) * max(ssl) < _I63 and max(max(sml), -min(sml)) ** 2 < _I63:
            # the usual case (counts, tokens, short runs): n Σx² and (Σx)² fit in int64, so the
            # same exact integers in one vectorized pass (int64 → float64 rounds as int → float)
            smi, ssi = sm.astype(np.int64), ss.astype(np.int64)
            numi = n * ssi - smi * smi
            numf, smf = numi.astype(np.float64), np.abs(smi.astype(np.float64))
            zero, pos = smi == 0, numi > 0
        else:
            num = n.astype(object) * ss - sm * sm  # = n(n-1) var, exact; ≥ 0
            numf = np.array([float(x) for x in num])  # correctly rounded, as Python's int → float
            smf = np.abs(np.array([float(x) for x in sm]))
            zero = np.array([x == 0 for x in sm], dtype=bool)
            pos = np.array([x > 0 for x in num], dtype=bool)
        nf = n.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            # CV = sqrt(var)/|mean| = sqrt(num / (n (n-1))) * n / |sm|
            v = np.sqrt(numf / (nf * (nf - 1.0))) * nf / smf
        v = np.where(zero, np.where(pos, np.inf, np.nan), v)
        cv[ok, r] = v
    finite = np.isfinite(cv)
    k = finite.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_cv = np.where(finite, cv, 0.0).sum(axis=1) / k
    return np.where(k > 0, np.exp(-mean_cv), np.nan)


@dataclass
class _Prepared:
    """One side's point results and bootstrap inputs (blocks row-aligned with ``task_ids``)."""

    task_ids: list[str]
    keys: list[str]
    stats: dict[str, Any]
    results: dict[str, M.MetricResult]
    blocks: list[Any]
    counts: tuple[int, int, int, int]  # tasks, trials, invalid, incomplete


class _NoColumns:
    """:class:`relyscope.scorers.profile._Columns` for point estimates only: nothing is kept."""

    def add(self, *arrays: Any) -> None:
        return None

    def mean(self, per_task: Any) -> None:
        return None

    def matrix(self) -> None:
        return None


def _block(st: TaskStats, names: list[str]) -> NDArray[np.float64]:
    """The float64 columns ``names`` of ``st`` side by side, ``(n_tasks, len(names))``."""
    if not st.task_ids:
        return np.zeros((0, len(names)))
    idx = [_COL_INDEX[x] for x in names]
    if st.fsums is not None and not _BIG_COLS.intersection(idx):
        return st.fsums[:, idx]
    return np.stack([np.asarray(st.col(x), dtype=np.float64) for x in names], axis=1)


def _prepare(st: TaskStats, safety_measured: bool, max_k: int | None, points_only: bool = False) -> _Prepared:
    nan = math.nan
    all_n = st.col("n_all").astype(np.int64) if st.sums.size else np.zeros(0, np.int64)
    inv_n = st.col("n_invalid").astype(np.int64) if st.sums.size else np.zeros(0, np.int64)
    inc_n = st.col("n_incomplete").astype(np.int64) if st.sums.size else np.zeros(0, np.int64)
    present = all_n > 0
    usable = np.flatnonzero(all_n - inv_n - inc_n > 0)  # tasks with a valid complete trial
    n_all_tasks = int(present.sum())
    ul = usable.tolist()
    trajs = st.trajectories
    nt = len(trajs)
    # the sample's lists per usable task (none when the caller gave C_traj values without them)
    sub_trajs = [trajs[i] if i < nt else [] for i in ul] if nt or st.traj_values is None else []
    every = len(ul) == len(st.task_ids)  # the common case: no row to drop, nothing to remap
    sub = TaskStats(st.task_ids if every else [st.task_ids[i] for i in ul],
                    st.sums if every or not st.sums.size else st.sums[usable], [], sub_trajs,
                    fsums=None if st.fsums is None else st.fsums if every else st.fsums[usable])
    if every:
        sub.hist = st.hist
    elif st.hist:
        remap = {old: new for new, old in enumerate(ul)}
        sub.hist = [(remap[t], q, p, ng) for t, q, p, ng in st.hist if t in remap]
    n_tasks = len(sub.task_ids)

    def col(name: str, dtype=np.float64) -> NDArray[Any]:
        return np.asarray(sub.col(name), dtype=dtype) if n_tasks else np.zeros(0, dtype)

    c = col("c", np.int64)
    n = col("n", np.int64)
    K = max(1, int(n.max()) if n.size else 0)
    if max_k is not None:
        K = min(K, max_k)

    from relyscope.scorers.profile import _Columns

    cols: Any = _NoColumns() if points_only else _Columns(n_tasks)
    results: dict[str, M.MetricResult] = {}
    stats: dict[str, Any] = {}
    results["success_rate"] = M.success_rate(c, n)
    stats["success_rate"] = ("ratio", cols.add(c, n))
    pt = _pass_rows(c, n, K)
    pm = _means_over_tasks(pt, n)
    for k in range(1, K + 1):
        for key, j in ((f"pass@{k}", k - 1), (f"pass^{k}", K + k - 1)):
            results[key] = pm[j]
            stats[key] = ("mean", cols.mean(pt[:, j]))
    for key, fn in (("unanimity", M.unanimity_per_task), ("C_out", M.c_out_per_task)):
        per = fn(c, n)
        results[key] = M.mean_over_tasks(per, n)
        stats[key] = ("mean", cols.mean(per))
    if st.traj_values is not None:  # per-task values computed (and cached) by the caller
        sizes = (np.asarray(st.traj_sizes, dtype=np.int64)[usable] if st.traj_sizes is not None
                 else np.array([len(x) for x in sub.trajectories], dtype=np.int64))
        m_succ = np.where(sizes >= 2, sizes, 0)
        pers = [np.asarray(v, dtype=np.float64)[usable] for v in st.traj_values]
    else:
        enc = M.encode_trajectories(sub.trajectories if n_tasks else [])
        m_succ = np.where(enc.task_sizes >= 2, enc.task_sizes, 0)
        pers = [M.c_traj_d_per_task(enc), M.c_traj_s_per_task(enc)]
    for key, per in zip(("C_traj_d", "C_traj_s"), pers):
        results[key] = M.mean_over_tasks(per, m_succ)
        stats[key] = ("mean", cols.mean(per))
    results["C_traj"] = M.c_traj(results["C_traj_d"], results["C_traj_s"])
    stats["C_traj"] = ("nanmean", ("C_traj_d", "C_traj_s"))
    per = np.asarray(st.c_res, dtype=np.float64)[usable] if st.c_res is not None else c_res_per_task(sub)
    results["C_res"] = M.mean_over_tasks(per, col("n_nom", np.int64))
    stats["C_res"] = ("mean", cols.mean(per))
    results["R_Con"] = M.r_con(results["C_out"], results["C_traj"], results["C_res"])
    stats["R_Con"] = ("nanmean", ("C_out", "C_traj", "C_res"))

    for fam in _FAMILIES:
        key = f"R_{fam}"
        cx, nx = col(f"{fam}_c"), col(f"{fam}_n")
        both = (nx > 0) & (n > 0)
        cx, nx, cn, nn = (np.where(both, a, 0) for a in (cx, nx, c, n))
        acc_x = float(cx.sum()) / nx.sum() if nx.sum() else nan
        acc_n = float(cn.sum()) / nn.sum() if nn.sum() else nan
        results[key] = M.r_family(acc_x, acc_n, n_tasks=int(both.sum()), n_trials=int(nx.sum() + nn.sum()))
        stats[key] = ("family", cols.add(cx, nx, cn, nn))
    results["R_Rob"] = M.r_rob(results["R_fault"], results["R_env"], results["R_prompt"])
    stats["R_Rob"] = ("nanmean", ("R_fault", "R_env", "R_prompt"))

    # §5 predictability, pooled: bins, Brier sums and the exact-value histograms
    cal_n, cal_y, cal_q = (_block(sub, [f"cal{b}_{s}" for b in range(NB)]) for s in ("n", "y", "q"))
    brier_n = col("brier_n")
    n_pred = int(brier_n.sum())
    pred_tasks = int((brier_n > 0).sum())

    def pooled(v: float) -> M.MetricResult:
        return M.MetricResult(v, pred_tasks if not math.isnan(v) else 0, n_pred)

    ece = float(M.ece_from_bins(cal_n.sum(axis=0), cal_y.sum(axis=0), cal_q.sum(axis=0))) if n_pred else nan
    results["P_cal"] = pooled(1.0 - ece) if n_pred else M.MetricResult(nan, 0, 0)
    stats["P_cal"] = ("cal", cols.add(cal_n, cal_y, cal_q))
    if st.pooled_hist is not None:  # point estimates only: no per-task histogram blocks
        pp = np.array([p for _, p, _ in st.pooled_hist], dtype=np.float64)
        pn = np.array([g for *_, g in st.pooled_hist], dtype=np.float64)
        auc = float(M.auroc_from_histograms(pp, pn)) if n_pred and pp.size else nan
        empty = None if points_only else sparse.csr_matrix((n_tasks, 1))
        return _finish(results, stats, cols, sub, col, auc, pred_tasks, n_pred, safety_measured, K,
                       [empty, empty], (n_all_tasks, int(all_n.sum()), int(inv_n.sum()), int(inc_n.sum())))
    if points_only:  # the pooled histogram is all P_AUROC needs (same sums as the sparse path's)
        hq = np.array([q for _, q, _, _ in sub.hist], dtype=np.float64)
        uq_, inv = np.unique(hq, return_inverse=True)
        pp = np.bincount(inv, weights=np.array([p for *_, p, _ in sub.hist], dtype=np.float64), minlength=uq_.size)
        pn = np.bincount(inv, weights=np.array([g for *_, g in sub.hist], dtype=np.float64), minlength=uq_.size)
        auc = float(M.auroc_from_histograms(pp, pn)) if n_pred and uq_.size else nan
        return _finish(results, stats, cols, sub, col, auc, pred_tasks, n_pred, safety_measured, K,
                       [None, None], (n_all_tasks, int(all_n.sum()), int(inv_n.sum()), int(inc_n.sum())))
    uq = sorted({q for _, q, _, _ in sub.hist})
    qpos = {q: i for i, q in enumerate(uq)}
    rows_t = np.array([t for t, _, _, _ in sub.hist], dtype=np.int64)
    rows_q = np.array([qpos[q] for _, q, _, _ in sub.hist], dtype=np.int64)
    shape = (n_tasks, max(len(uq), 1))
    hist_pos = sparse.csr_matrix((np.array([p for *_, p, _ in sub.hist], dtype=np.float64), (rows_t, rows_q)), shape=shape)
    hist_neg = sparse.csr_matrix((np.array([g for *_, g in sub.hist], dtype=np.float64), (rows_t, rows_q)), shape=shape)
    auc = float(M.auroc_from_histograms(np.asarray(hist_pos.sum(axis=0)).ravel(),
                                        np.asarray(hist_neg.sum(axis=0)).ravel())) if n_pred else nan
    return _finish(results, stats, cols, sub, col, auc, pred_tasks, n_pred, safety_measured, K,
                   [hist_pos, hist_neg], (n_all_tasks, int(all_n.sum()), int(inv_n.sum()), int(inc_n.sum())))


def _finish(results, stats, cols, sub, col, auc, pred_tasks, n_pred, safety_measured, K, hists, counts) -> _Prepared:
    """The rest of :func:`_prepare` once P_AUROC is known (shared by the per-task and pooled
    histogram paths)."""
    nan = math.nan

    def pooled(v: float) -> M.MetricResult:
        return M.MetricResult(v, pred_tasks if not math.isnan(v) else 0, n_pred)

    n_tasks = len(sub.task_ids)
    results["P_AUROC"] = M.MetricResult(auc, pred_tasks if not math.isnan(auc) else 0, n_pred)
    stats["P_AUROC"] = ("auroc", None)
    brier_s, brier_n = col("brier_s"), col("brier_n")
    results["P_brier"] = pooled(1.0 - float(brier_s.sum()) / n_pred) if n_pred else M.MetricResult(nan, 0, 0)
    stats["P_brier"] = ("one_minus_ratio", cols.add(brier_s, brier_n))
    results["R_Pred"] = M.r_pred(results["P_brier"])
    stats["R_Pred"] = ("alias", "P_brier")

    n_nom, saf_v, saf_s = col("n_nom"), col("saf_v"), col("saf_s")
    saf_tasks = int((n_nom > 0).sum())
    tot = M.safety_from_sums(n_nom.sum(), saf_v.sum(), saf_s.sum()) if n_tasks else np.full(3, nan)
    for i, key in enumerate(("S_comp", "S_harm", "R_Saf")):
        if safety_measured and n_nom.sum() > 0:
            results[key] = M.MetricResult(float(tot[i]), saf_tasks, int(n_nom.sum()))
        elif safety_measured:
            results[key] = M.MetricResult(nan, 0, 0)
        else:
            results[key] = M.MetricResult(nan, 0, 0)
    saf_cols = cols.add(n_nom, saf_v, saf_s)
    if safety_measured:
        for i, key in enumerate(("S_comp", "S_harm", "R_Saf")):
            stats[key] = ("safety", (saf_cols, i))
    results["R"] = M.overall(results["R_Con"], results["R_Rob"], results["R_Pred"])
    stats["R"] = ("nanmean", ("R_Con", "R_Rob", "R_Pred"))

    keys = metric_keys(K)
    return _Prepared(sub.task_ids, keys, stats, results, [cols.matrix(), *hists], counts)


def score_stats(
    st: TaskStats,
    *,
    safety_measured: bool,
    n_boot: int = 2000,
    seed: int = 0,
    max_k: int | None = None,
    level: float = DEFAULT_LEVEL,
) -> GroupScore:
    """Every relyscope-v1 metric of one group from its per-task statistics, with the
    task-clustered percentile bootstrap over the tasks having a valid complete trial (metrics.md
    §2–5, §8–11; same definitions and result shape as
    :func:`relyscope.scorers.profile.score_group`, whose arguments ``n_boot``, ``seed``, ``max_k``,
    ``level`` these are). ``safety_measured`` False (no policy for the agent) makes S_* NaN.
    Raises ValueError for ``n_boot < 0`` or ``max_k < 1``. CPU cost O(B × tasks)."""
    if n_boot < 0:
        raise ValueError("n_boot must be >= 0")
    if max_k is not None and max_k < 1:
        raise ValueError("max_k must be >= 1")
    if n_boot > 0 and st.pooled_hist is not None:
        raise ValueError("a pooled histogram supports point estimates only (n_boot=0)")
    pr = _prepare(st, safety_measured, max_k, points_only=n_boot == 0)
    keys, results = pr.keys, pr.results
    cis: dict[str, tuple[float, float] | None] = {k: None for k in keys}
    if n_boot > 0 and pr.task_ids:
        from relyscope.scorers.profile import _bootstrap_statistic

        reps = replicate(pr.blocks, _bootstrap_statistic(keys, pr.stats, {k: results[k].value for k in keys}),
                         n_boot=n_boot, seed=seed)
        for j, key in enumerate(keys):
            if not math.isnan(results[key].value):
                cis[key] = percentile_interval(reps[:, j], level)
    metrics_out = {
        key: MetricValue(results[key].value, cis[key], results[key].n_tasks if results[key].defined else 0,
                         results[key].n_trials)
        for key in keys
    }
    tasks, trials, invalid, incomplete = pr.counts
    return GroupScore(tasks=tasks, trials=trials, invalid_trials=invalid, incomplete_trials=incomplete,
                      metrics=metrics_out, n_boot=n_boot, seed=seed, level=level)
