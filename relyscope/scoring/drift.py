"""Drift of live scores (metrics.md §10): the current window against a reference window.

For one group and every metric both windows define, ``Δ = value(current) − value(reference)``
with a task-clustered bootstrap: each replicate draws tasks with replacement from the *union* of
the two windows' tasks and applies the same draw to both sides (a task missing from one window
contributes nothing there), so a task seen in both windows is paired — its difficulty cancels out
of Δ — and one seen in a single window still counts with its sampling variability. Both sides are
computed exactly as :func:`relyscope.scoring.stats.score_stats` computes them (same per-task
statistics, same statistic). ``ci`` is the 95 % percentile interval of those replicates (metrics.md
§10, what the report and ``relyscope_drift_ci_*`` show).

The *flag* (the alerting decision) — deviation from the letter of §10, measured in
bench/bench_drift_power.py (bench/README.md): the sidecar evaluates the test every minute on
overlapping windows, so "the 95 % percentile interval excludes 0" raised 3–6 % false alarms *per
evaluation* below 400 trials/h and the alert on most stable simulated days. The level, the minimum
and the alert's ``for: 15m`` were chosen by the simulated false alarms per day and time to detect a
10-point drop. Drift is flagged when all of

- the *alerting interval* ``Δ ± z · se`` excludes 0, where ``se`` is the standard deviation of the
  same bootstrap replicates times the small-sample (CR1) factor ``sqrt(T / (T − 1))`` (T = tasks
  in the union; the bootstrap variance of a mean of T clusters is (T − 1)/T of the unbiased one)
  and ``z`` the ``1 − (1 − alert_level) / 2`` quantile of Student's t with T − 1 degrees of
  freedom (default ``alert_level`` 0.9998: z = 4.02 at 50 tasks, 3.75 at 500, → 3.72; CR1 with
  t(G − 1) is the usual small-cluster correction, Cameron & Miller 2015, J. Human Resources 50(2)
  §VI; with 10 tasks the normal quantile alarmed on 3 of 100 stable simulated days). An
  interval from the bootstrap SE, not percentiles: the 0.01 % tail percentile of B = 2000
  replicates is beyond the most extreme replicate, while their SD is accurate to ~1.6 %;
- ``|Δ| > threshold`` (the practical threshold of §10);
- the current window holds at least ``min_trials`` valid complete trials.

An SE of 0 (every replicate equal: every task changed the same way) flags any Δ ≠ 0 beyond the
threshold, as the degenerate interval [Δ, Δ] excludes 0.

Defaults (``RELYSCOPE_DRIFT_CURRENT`` / ``RELYSCOPE_DRIFT_REFERENCE``): the last 1 h against the
24 h before it, both read at minute resolution so they meet at the same bucket boundary.

:func:`outcome_drift_batch` evaluates the same decision, for ``success_rate``, ``pass^1`` and
``C_out`` of outcome-only traffic, on many (current, reference) window pairs at once with the
*same* bootstrap draws (equality with :func:`drift` is a unit test): what the day-level simulation
of the bench uses.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.stats import t as student_t

from relyscope.scorers.bootstrap import _CHUNK_ELEMS, DEFAULT_LEVEL, percentile_interval, replicate, resample_weights
from relyscope.scoring.stats import TaskStats, _prepare

__all__ = ["Drift", "drift", "outcome_drift_batch", "critical_value", "DEFAULT_ALERT_LEVEL", "DEFAULT_MIN_TRIALS"]

#: Two-sided level of the alerting interval (t quantile, T − 1 df); see the module docstring.
DEFAULT_ALERT_LEVEL = 0.9998
#: Valid complete trials the current window needs before anything is flagged.
DEFAULT_MIN_TRIALS = 100


@dataclass(frozen=True, slots=True)
class Drift:
    """Δ = current − reference of one metric; ``ci`` its 95 % percentile interval (None: not
    computable); ``flagged`` per the rule above; task counts of both windows; ``se`` the
    small-sample-corrected bootstrap SE of Δ the flag uses (None without replicates);
    ``trials_current`` valid complete trials of the current window."""

    delta: float
    ci: tuple[float, float] | None
    flagged: bool
    tasks_current: int
    tasks_reference: int
    se: float | None = None
    trials_current: int = 0


def _align(blocks: list[Any], ids: list[str], pos: dict[str, int], n: int) -> list[Any]:
    rows = np.array([pos[t] for t in ids], dtype=np.int64)
    dense = np.zeros((n, blocks[0].shape[1]))
    if rows.size:
        dense[rows] = blocks[0]
    out: list[Any] = [dense]
    for h in blocks[1:]:
        coo = h.tocoo()
        out.append(sparse.csr_matrix((coo.data, (rows[coo.row] if rows.size else coo.row, coo.col)),
                                     shape=(n, h.shape[1])))
    return out


def _check_level(alert_level: float) -> None:
    if not 0 < alert_level < 1:
        raise ValueError("alert_level must be in (0, 1)")


@functools.lru_cache(maxsize=4096)
def critical_value(alert_level: float, n_tasks: int) -> float:
    """z of the alerting interval: the ``1 − (1 − alert_level)/2`` quantile of Student's t with
    ``n_tasks − 1`` degrees of freedom (NaN below 2 tasks). Raises ValueError for a level outside
    (0, 1)."""
    _check_level(alert_level)
    if n_tasks < 2:
        return math.nan
    return float(student_t.ppf(1 - (1 - alert_level) / 2, n_tasks - 1))


def _se(reps: NDArray[np.float64], n_union: int) -> NDArray[np.float64]:
    """Per column of ``(B, m)`` replicates: SD (ddof 1, NaN replicates skipped) × sqrt(T/(T−1));
    NaN where fewer than 2 replicates are defined or T < 2."""
    ok = ~np.isnan(reps)
    k = ok.sum(axis=0)
    x = np.where(ok, reps, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = x.sum(axis=0) / k
        var = (np.where(ok, reps - mean, 0.0) ** 2).sum(axis=0) / (k - 1)
    sd = np.sqrt(np.maximum(var, 0.0))
    # an SD that is rounding noise around one repeated value is 0 (the degenerate interval)
    scale = np.where(ok, np.abs(reps), 0.0).max(axis=0, initial=0.0)
    sd = np.where(sd <= 1e-12 * np.maximum(scale, 1.0), 0.0, sd)
    corr = math.sqrt(n_union / (n_union - 1)) if n_union >= 2 else math.nan
    return np.where(k >= 2, sd * corr, np.nan)


def _decide(delta: NDArray[np.float64], se: NDArray[np.float64], trials_current: NDArray[np.int64] | int, *,
            z: NDArray[np.float64] | float, threshold: float, min_trials: int) -> NDArray[np.bool_]:
    """The flag (module docstring), elementwise."""
    delta = np.asarray(delta, dtype=np.float64)
    se = np.asarray(se, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        excl = np.where(se > 0, np.abs(delta) > z * se, (se == 0) & (delta != 0))
        return excl & (np.abs(delta) > threshold) & (np.asarray(trials_current) >= min_trials) & ~np.isnan(delta)


def drift(current: TaskStats, reference: TaskStats, *, safety_measured: bool, threshold: float = 0.05,
          n_boot: int = 2000, seed: int = 0, max_k: int | None = None,
          level: float = DEFAULT_LEVEL, alert_level: float = DEFAULT_ALERT_LEVEL,
          min_trials: int = DEFAULT_MIN_TRIALS) -> dict[str, Drift]:
    """Δ per metric key defined in both windows (metrics.md §11 keys; pass@k / pass^k up to the
    smaller K of the two), its ``level`` percentile interval and the flag of the module docstring
    (``alert_level``, ``threshold``, ``min_trials``). ``n_boot = 0``: Δ without intervals (never
    flagged). Raises ValueError for a negative ``threshold``, ``n_boot`` or ``min_trials``, or an
    ``alert_level`` outside (0, 1). CPU cost O(B × tasks)."""
    if threshold < 0 or n_boot < 0 or min_trials < 0:
        raise ValueError("threshold, n_boot and min_trials must be >= 0")
    _check_level(alert_level)
    from relyscope.scorers.profile import _bootstrap_statistic

    ref = _prepare(reference, safety_measured, max_k)
    cur = _prepare(current, safety_measured, max_k)
    keys = [k for k in cur.keys if k in set(ref.keys)]
    deltas = {k: cur.results[k].value - ref.results[k].value for k in keys}
    cis: dict[str, tuple[float, float] | None] = {k: None for k in keys}
    ses: dict[str, float | None] = {k: None for k in keys}
    union = sorted(set(ref.task_ids) | set(cur.task_ids))
    _, trials, invalid, incomplete = cur.counts
    n_cur = trials - invalid - incomplete
    if n_boot > 0 and ref.task_ids and cur.task_ids:
        pos = {t: i for i, t in enumerate(union)}
        blocks = _align(ref.blocks, ref.task_ids, pos, len(union)) + _align(cur.blocks, cur.task_ids, pos, len(union))
        # each side's composites (R, R_Con …) keep the components of its point estimate
        stat_ref = _bootstrap_statistic(ref.keys, ref.stats, {k: ref.results[k].value for k in ref.keys})
        stat_cur = _bootstrap_statistic(cur.keys, cur.stats, {k: cur.results[k].value for k in cur.keys})
        ir = [ref.keys.index(k) for k in keys]
        ic = [cur.keys.index(k) for k in keys]

        def delta_stat(sums):
            return stat_cur(sums[3:])[:, ic] - stat_ref(sums[:3])[:, ir]

        reps = replicate(blocks, delta_stat, n_boot=n_boot, seed=seed)
        se = _se(reps.reshape(n_boot, len(keys)), len(union))
        for j, k in enumerate(keys):
            if not math.isnan(deltas[k]):
                cis[k] = percentile_interval(reps[:, j], level)
                ses[k] = None if math.isnan(se[j]) else float(se[j])
    out = {}
    for k in keys:
        ci, d, s = cis[k], deltas[k], ses[k]
        flagged = ci is not None and s is not None and bool(
            _decide(np.array([d]), np.array([s]), n_cur, z=critical_value(alert_level, len(union)),
                    threshold=threshold, min_trials=min_trials)[0])
        out[k] = Drift(d, ci, bool(flagged), cur.results[k].n_tasks, ref.results[k].n_tasks, s, n_cur)
    return out


# ------------------------------------------------------------------------------------------------
# Batch evaluation for outcome-only traffic (the bench's day-level simulation)

OUTCOME_KEYS = ("success_rate", "pass^1", "C_out")


def _outcome_columns(c: NDArray[np.float64], n: NDArray[np.float64]) -> dict[str, tuple[NDArray, NDArray]]:
    """(numerator, denominator) per task of each key, as ``_prepare`` builds them: success_rate
    ``[c, n]``; pass^1 ``[c/n, 1]`` over tasks with n ≥ 1; C_out ``[(2c/n − 1)², 1]`` over n ≥ 2."""
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(n > 0, c / np.maximum(n, 1), 0.0)
    d1 = (n >= 1).astype(np.float64)
    d2 = (n >= 2).astype(np.float64)
    return {"success_rate": (c, n), "pass^1": (p * d1, d1), "C_out": ((2 * p - 1) ** 2 * d2, d2)}


def _ratio(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


_W_CACHE: dict[tuple[int, int, int], NDArray[np.float64]] = {}


def _weights(n_tasks: int, n_boot: int, seed: int) -> NDArray[np.float64]:
    """The multiplicity matrix ``(n_boot, n_tasks)`` :func:`replicate` draws for ``seed`` (one
    chunk of rows, as in :func:`drift` when ``n_tasks`` and the column count are ≤ 4 M / B)."""
    key = (n_tasks, n_boot, seed)
    if key not in _W_CACHE:
        if n_boot * n_tasks > _CHUNK_ELEMS:
            raise ValueError("outcome_drift_batch supports n_boot × tasks ≤ 4 M (one chunk of draws)")
        rng = np.random.default_rng(seed)
        _W_CACHE[key] = next(resample_weights(n_tasks, n_boot=n_boot, rng=rng, chunk_rows=n_boot))
    return _W_CACHE[key]


def outcome_drift_batch(c_cur: NDArray[Any], n_cur: NDArray[Any], c_ref: NDArray[Any], n_ref: NDArray[Any], *,
                        threshold: float = 0.05, n_boot: int = 2000, seed: int = 0,
                        level: float = DEFAULT_LEVEL, alert_level: float = DEFAULT_ALERT_LEVEL,
                        min_trials: int = DEFAULT_MIN_TRIALS, keys: tuple[str, ...] = OUTCOME_KEYS,
                        percentiles: bool = True) -> dict[str, dict[str, NDArray[np.float64]]]:
    """:func:`drift` of ``keys`` ⊆ (success_rate, pass^1, C_out) for E window pairs of
    outcome-only traffic (every trial nominal, valid, complete, with a known outcome; no
    trajectories or resources), all at once.

    Args: per-task successes and trials, shape ``(E, T)`` each, current and reference windows, task
    j being the j-th task id in sorted order (a task with no trial in either window of a pair is
    absent from it). ``percentiles`` False skips the 95 % interval (the flag does not use it).

    Returns: key → ``{"delta", "ci_low", "ci_high", "se", "flagged"}``, arrays ``(E,)``; equal to
    :func:`drift`'s fields on the same windows (same draws: the union's tasks get the rows of
    ``W`` for their count). Raises ValueError on mismatched shapes.
    """
    arrs = [np.asarray(a, dtype=np.float64) for a in (c_cur, n_cur, c_ref, n_ref)]
    if len({a.shape for a in arrs}) != 1 or arrs[0].ndim != 2:
        raise ValueError("c_cur, n_cur, c_ref, n_ref must share one (E, T) shape")
    c_cur, n_cur, c_ref, n_ref = arrs
    E, _ = c_cur.shape
    _check_level(alert_level)
    cols_c, cols_r = _outcome_columns(c_cur, n_cur), _outcome_columns(c_ref, n_ref)
    trials_cur = n_cur.sum(axis=1)
    out = {k: {f: np.full(E, np.nan) for f in ("delta", "ci_low", "ci_high", "se")} for k in keys}
    present = (n_cur + n_ref) > 0
    size = present.sum(axis=1)
    crit = np.array([critical_value(alert_level, int(T)) for T in size])
    has_both = (n_cur.sum(axis=1) > 0) & (n_ref.sum(axis=1) > 0)
    for k in keys:
        nc, dc = cols_c[k]
        nr, dr = cols_r[k]
        out[k]["delta"] = _ratio(nc.sum(1), dc.sum(1)) - _ratio(nr.sum(1), dr.sum(1))
    for T in np.unique(size[has_both]):
        W = _weights(int(T), n_boot, seed)
        rows = np.flatnonzero(has_both & (size == T))
        for start in range(0, rows.size, 256):  # bound memory: B × 256 × 4 columns per key
            r = rows[start:start + 256]
            # the union's tasks in sorted order, compacted to columns 0..T−1
            order = np.argsort(~present[r], axis=1, kind="stable")[:, :T]
            take = lambda a: np.take_along_axis(a[r], order, axis=1)  # noqa: E731
            for k in keys:
                nc, dc = cols_c[k]
                nr, dr = cols_r[k]
                M = np.stack([take(nc), take(dc), take(nr), take(dr)], axis=2)  # (e, T, 4)
                S = (W @ M.transpose(1, 0, 2).reshape(int(T), -1)).reshape(n_boot, r.size, 4)
                reps = _ratio(S[..., 0], S[..., 1]) - _ratio(S[..., 2], S[..., 3])  # (B, e)
                defined = ~np.isnan(out[k]["delta"][r])
                out[k]["se"][r] = np.where(defined, _se(reps, int(T)), np.nan)
                if percentiles:
                    q = [50 * (1.0 - level), 100 - 50 * (1.0 - level)]
                    if np.isnan(reps).any():
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", RuntimeWarning)
                            lo, hi = np.nanpercentile(reps, q, axis=0)
                    else:
                        lo, hi = np.percentile(reps, q, axis=0)
                    out[k]["ci_low"][r] = np.where(defined, lo, np.nan)
                    out[k]["ci_high"][r] = np.where(defined, hi, np.nan)
    for k in keys:
        se = out[k]["se"]
        out[k]["flagged"] = _decide(out[k]["delta"], se, trials_cur, z=crit, threshold=threshold,
                                    min_trials=min_trials) & ~np.isnan(se)
    return out
