"""Drift of live scores (metrics.md §10): the current window against a reference window.

For one group and every metric both windows define, ``Δ = value(current) − value(reference)``
with a task-clustered percentile bootstrap interval: each replicate draws tasks with replacement
from the *union* of the two windows' tasks and applies the same draw to both sides (a task
missing from one window contributes nothing there), so a task seen in both windows is paired —
its difficulty cancels out of Δ — and one seen in a single window still counts with its
sampling variability. Both sides are computed exactly as
:func:`relyscope.scoring.stats.score_stats` computes them (same per-task statistics, same
statistic). Drift is *flagged* when the interval excludes 0 and ``|Δ| > threshold`` (the
practical threshold; configuration).

Defaults (``RELYSCOPE_DRIFT_CURRENT`` / ``RELYSCOPE_DRIFT_REFERENCE``): the last 1 h against the
24 h before it, both read at minute resolution so they meet at the same bucket boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse

from relyscope.scorers.bootstrap import DEFAULT_LEVEL, percentile_interval, replicate
from relyscope.scoring.stats import TaskStats, _prepare

__all__ = ["Drift", "drift"]


@dataclass(frozen=True, slots=True)
class Drift:
    """Δ = current − reference of one metric; ``ci`` its 95 % interval (None: not computable);
    ``flagged`` per the rule above; task counts of both windows."""

    delta: float
    ci: tuple[float, float] | None
    flagged: bool
    tasks_current: int
    tasks_reference: int


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


def drift(current: TaskStats, reference: TaskStats, *, safety_measured: bool, threshold: float = 0.05,
          n_boot: int = 2000, seed: int = 0, max_k: int | None = None,
          level: float = DEFAULT_LEVEL) -> dict[str, Drift]:
    """Δ per metric key defined in both windows (metrics.md §11 keys; pass@k / pass^k up to the
    smaller K of the two). ``n_boot = 0``: Δ without intervals (never flagged).
    Raises ValueError for a negative ``threshold`` or ``n_boot``."""
    if threshold < 0 or n_boot < 0:
        raise ValueError("threshold and n_boot must be >= 0")
    from relyscope.scorers.profile import _bootstrap_statistic

    ref = _prepare(reference, safety_measured, max_k)
    cur = _prepare(current, safety_measured, max_k)
    keys = [k for k in cur.keys if k in set(ref.keys)]
    deltas = {k: cur.results[k].value - ref.results[k].value for k in keys}
    cis: dict[str, tuple[float, float] | None] = {k: None for k in keys}
    union = sorted(set(ref.task_ids) | set(cur.task_ids))
    if n_boot > 0 and ref.task_ids and cur.task_ids:
        pos = {t: i for i, t in enumerate(union)}
        blocks = _align(ref.blocks, ref.task_ids, pos, len(union)) + _align(cur.blocks, cur.task_ids, pos, len(union))
        stat_ref, stat_cur = _bootstrap_statistic(ref.keys, ref.stats), _bootstrap_statistic(cur.keys, cur.stats)
        ir = [ref.keys.index(k) for k in keys]
        ic = [cur.keys.index(k) for k in keys]

        def delta_stat(sums):
            return stat_cur(sums[3:])[:, ic] - stat_ref(sums[:3])[:, ir]

        reps = replicate(blocks, delta_stat, n_boot=n_boot, seed=seed)
        for j, k in enumerate(keys):
            if not math.isnan(deltas[k]):
                cis[k] = percentile_interval(reps[:, j], level)
    out = {}
    for k in keys:
        ci, d = cis[k], deltas[k]
        flagged = ci is not None and (ci[0] > 0 or ci[1] < 0) and abs(d) > threshold
        out[k] = Drift(d, ci, bool(flagged), cur.results[k].n_tasks, ref.results[k].n_tasks)
    return out
