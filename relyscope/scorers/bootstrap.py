"""Task-clustered percentile bootstrap (metrics.md §10).

Resampling unit = the task: each replicate draws ``n_tasks`` tasks with replacement (within each
stratum when strata are given) and keeps *all* trials of every drawn task. Individual trials are
never resampled (that under-covers when tasks differ in difficulty).

Vectorization: a replicate is a vector of task multiplicities ``w`` (shape ``(n_tasks,)``, sum
``n_tasks``). Every relyscope metric is a function of per-task sufficient statistics — a mean of
per-task values is ``Σ w_t v_t / Σ w_t`` over the defined tasks, a pooled ratio (success rate,
P_brier, P_cal bins, R_x) is a ratio of ``Σ w_t · (per-task sums)`` — so all replicates of all
metrics are one matrix product ``W @ S`` of the ``(B, n_tasks)`` multiplicity matrix with the
``(n_tasks, m)`` per-task column matrix (dense or ``scipy.sparse``), computed in chunks of
replicates to bound memory, then reduced by a vectorized statistic.

Randomness: ``numpy.random.default_rng(seed)``; the same seed and inputs give the same interval.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "DEFAULT_N_BOOT",
    "DEFAULT_LEVEL",
    "BootstrapCI",
    "DeltaCI",
    "resample_weights",
    "replicate",
    "replicate_sums",
    "yielding",
    "percentile_interval",
    "bootstrap_statistic",
    "bootstrap_mean",
    "bootstrap_ratio",
    "shared_tasks",
    "paired_bootstrap",
    "paired_bootstrap_mean",
    "mean_statistic",
    "ratio_statistic",
]

DEFAULT_N_BOOT: Final = 2000
DEFAULT_LEVEL: Final = 0.95
_YIELD = threading.local()  # .fn: this thread's hook between replicate chunks (see yielding)
_CHUNK_ELEMS: Final = 1_000_000  # replicate rows per chunk × max(n_tasks, columns) ≤ this (~8 MB per chunk array)

Statistic = Callable[[list[NDArray[np.float64]]], NDArray[np.float64]]


@dataclass(frozen=True, slots=True)
class BootstrapCI:
    """A point estimate with its percentile interval (``None`` when not computable: estimate NaN,
    or no replicate defined). ``n_boot`` replicates, ``n_defined`` of them gave a value."""

    estimate: float
    ci: tuple[float, float] | None
    n_boot: int
    n_defined: int


@dataclass(frozen=True, slots=True)
class DeltaCI:
    """Paired comparison on shared tasks: ``delta = candidate − baseline`` and its interval."""

    delta: float
    ci: tuple[float, float] | None
    n_tasks: int
    n_boot: int


def _strata_groups(n_tasks: int, strata: ArrayLike | None) -> list[NDArray[np.int64]]:
    if strata is None:
        return [np.arange(n_tasks)]
    lab = np.asarray(strata).reshape(-1)
    if lab.size != n_tasks:
        raise ValueError(f"strata must have one label per task ({n_tasks}), got {lab.size}")
    _, inv = np.unique(lab, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    bounds = np.flatnonzero(np.diff(inv[order])) + 1
    return np.split(order, bounds)


def resample_weights(
    n_tasks: int,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    rng: np.random.Generator,
    strata: ArrayLike | None = None,
    chunk_rows: int | None = None,
) -> Iterator[NDArray[np.float64]]:
    """Yield task multiplicity matrices, chunks of shape ``(b, n_tasks)`` with Σ b = ``n_boot``.

    Row r is one replicate: how many times each task was drawn (with replacement; within each
    stratum, keeping stratum sizes, when ``strata`` — one label per task — is given).
    Raises ValueError for ``n_tasks < 1`` or ``n_boot < 1``.
    """
    if n_tasks < 1 or n_boot < 1:
        raise ValueError("need n_tasks >= 1 and n_boot >= 1")
    groups = _strata_groups(n_tasks, strata)
    rows = chunk_rows or max(1, min(n_boot, _CHUNK_ELEMS // n_tasks))
    done = 0
    while done < n_boot:
        b = min(rows, n_boot - done)
        offsets = (np.arange(b, dtype=np.int64) * n_tasks)[:, None]
        if len(groups) == 1:  # common case: no index remapping, one bincount
            draw = rng.integers(0, n_tasks, size=(b, n_tasks))
            draw += offsets
            flat = np.bincount(draw.reshape(-1), minlength=b * n_tasks).astype(np.float64)
        else:
            flat = np.zeros(b * n_tasks, dtype=np.float64)
            for members in groups:
                draw = members[rng.integers(0, members.size, size=(b, members.size))]
                draw += offsets
                flat += np.bincount(draw.reshape(-1), minlength=b * n_tasks)
        yield flat.reshape(b, n_tasks)
        done += b


def _as_columns(block: Any, n_tasks: int | None) -> Any:
    if hasattr(block, "tocsc"):  # scipy.sparse
        mat = block.tocsr()
    else:
        mat = np.asarray(block, dtype=np.float64)
        if mat.ndim == 1:
            mat = mat[:, None]
        if np.isnan(mat).any():
            raise ValueError("columns must not contain NaN (encode 'undefined' as a 0/1 indicator column)")
    if n_tasks is not None and mat.shape[0] != n_tasks:
        raise ValueError("all column blocks must have one row per task")
    return mat


def replicate(
    blocks: Sequence[Any],
    statistic: Statistic,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    strata: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """Bootstrap replicates of a statistic of per-task column sums.

    Args:
        blocks: column matrices, each ``(n_tasks, m_i)`` dense (no NaN) or ``scipy.sparse``; a 1-D
            array is one column.
        statistic: maps the list of weighted sums ``[(b, m_i) arrays]`` to a ``(b,)`` or ``(b, k)``
            array (NaN allowed where undefined). It is also what a point estimate applies to the
            unweighted sums.
        n_boot: replicates B; seed: int seed or a numpy Generator; strata: one label per task.

    Returns: ``(n_boot,)`` or ``(n_boot, k)`` replicates.
    """
    mats = [_as_columns(b, None) for b in blocks]
    if not mats:
        raise ValueError("need at least one column block")
    n_tasks = mats[0].shape[0]
    for m in mats:
        _as_columns(m, n_tasks)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    width = max([n_tasks] + [m.shape[1] for m in mats])
    rows = max(1, min(n_boot, _CHUNK_ELEMS // max(width, 1)))
    out = []
    pause = getattr(_YIELD, "fn", None)
    for w in resample_weights(n_tasks, n_boot=n_boot, rng=rng, strata=strata, chunk_rows=rows):
        if pause is not None:
            pause()
        sums = [np.asarray((m.T @ w.T).T) if hasattr(m, "tocsc") else w @ m for m in mats]
        out.append(np.asarray(statistic(sums), dtype=np.float64))
    return np.concatenate(out, axis=0)


@contextmanager
def yielding(pause: Callable[[], None]) -> Iterator[None]:
    """Within the block, :func:`replicate` in *this thread* calls ``pause()`` before each chunk of
    replicates (each ≤ ``_CHUNK_ELEMS`` weights): a background bootstrap can hand the core and the
    GIL back to a latency-bound thread while it works (the live scorer's CI thread waits for the
    gap between scoring cycles). ``pause`` returns when the work may go on; the replicates are
    the same with or without it. Other threads are not affected; blocks nest (inner wins)."""
    prev = getattr(_YIELD, "fn", None)
    _YIELD.fn = pause
    try:
        yield
    finally:
        _YIELD.fn = prev


def replicate_sums(
    columns: ArrayLike, *, n_boot: int = DEFAULT_N_BOOT, seed: int | np.random.Generator = 0, strata: ArrayLike | None = None
) -> NDArray[np.float64]:
    """Resampled column sums ``(n_boot, m)`` of a dense per-task column matrix ``(n_tasks, m)``."""
    return replicate([columns], lambda s: s[0], n_boot=n_boot, seed=seed, strata=strata)


def percentile_interval(replicates: ArrayLike, level: float = DEFAULT_LEVEL) -> tuple[float, float] | None:
    """Percentile interval of 1-D replicates, ignoring NaN ones; None if none is defined.
    ``level`` in (0, 1), e.g. 0.95 → the 2.5 % and 97.5 % percentiles (linear interpolation)."""
    if not 0 < level < 1:
        raise ValueError("level must be in (0, 1)")
    r = np.asarray(replicates, dtype=np.float64).reshape(-1)
    r = r[~np.isnan(r)]
    if r.size == 0:
        return None
    alpha = (1.0 - level) / 2.0
    lo, hi = np.percentile(r, [100 * alpha, 100 * (1 - alpha)])
    return (float(lo), float(hi))


def bootstrap_statistic(
    blocks: Sequence[Any],
    statistic: Statistic,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    strata: ArrayLike | None = None,
    level: float = DEFAULT_LEVEL,
) -> BootstrapCI:
    """Point estimate (``statistic`` of the unweighted column sums) and its task-clustered
    percentile interval; ``statistic`` must return one value per row. See :func:`replicate`."""
    mats = [_as_columns(b, None) for b in blocks]
    sums = [np.asarray(m.sum(axis=0)).reshape(1, -1) for m in mats]
    est = float(np.asarray(statistic(sums)).reshape(-1)[0])
    reps = replicate(mats, statistic, n_boot=n_boot, seed=seed, strata=strata).reshape(-1)
    defined = int((~np.isnan(reps)).sum())
    ci = None if math.isnan(est) else percentile_interval(reps, level)
    return BootstrapCI(est, ci, n_boot, defined)


def mean_statistic(sums: list[NDArray[np.float64]]) -> NDArray[np.float64]:
    """Statistic for a block ``[v·d, d]``: the mean of per-task values over defined tasks."""
    s = sums[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s[:, 1] > 0, s[:, 0] / s[:, 1], np.nan)


ratio_statistic = mean_statistic  # a block [numerator, denominator]: Σ num / Σ den


def _mean_block(values: ArrayLike) -> NDArray[np.float64]:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    d = ~np.isnan(v)
    return np.stack([np.where(d, v, 0.0), d.astype(np.float64)], axis=1)


def bootstrap_mean(
    values: ArrayLike,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    strata: ArrayLike | None = None,
    level: float = DEFAULT_LEVEL,
) -> BootstrapCI:
    """Mean over tasks of per-task values ``(n_tasks,)`` (NaN = undefined task, skipped) with its
    task-clustered interval (e.g. pass^k, C_out from their ``*_per_task`` functions)."""
    return bootstrap_statistic([_mean_block(values)], mean_statistic, n_boot=n_boot, seed=seed, strata=strata, level=level)


def bootstrap_ratio(
    numerator: ArrayLike,
    denominator: ArrayLike,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    strata: ArrayLike | None = None,
    level: float = DEFAULT_LEVEL,
) -> BootstrapCI:
    """Pooled ratio ``Σ_t num_t / Σ_t den_t`` of per-task sums (e.g. success rate from c_t, n_t)
    with its task-clustered interval."""
    block = np.stack([np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)], axis=1)
    return bootstrap_statistic([block], ratio_statistic, n_boot=n_boot, seed=seed, strata=strata, level=level)


def shared_tasks(baseline_ids: Sequence[Any], candidate_ids: Sequence[Any]) -> tuple[NDArray[np.int64], NDArray[np.int64], list[Any]]:
    """Positions of the tasks both runs have: ``(idx_baseline, idx_candidate, ids)`` in sorted
    id order (ids must be unique within each side; raises ValueError otherwise)."""
    bpos = {t: i for i, t in enumerate(baseline_ids)}
    cpos = {t: i for i, t in enumerate(candidate_ids)}
    if len(bpos) != len(baseline_ids) or len(cpos) != len(candidate_ids):
        raise ValueError("task ids must be unique")
    ids = sorted(set(bpos) & set(cpos), key=str)
    return (np.array([bpos[t] for t in ids], dtype=np.int64), np.array([cpos[t] for t in ids], dtype=np.int64), ids)


def paired_bootstrap(
    baseline_blocks: Sequence[Any],
    candidate_blocks: Sequence[Any],
    statistic: Statistic,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    strata: ArrayLike | None = None,
    level: float = DEFAULT_LEVEL,
) -> DeltaCI:
    """Paired task-clustered bootstrap of ``Δ = statistic(candidate) − statistic(baseline)``
    (metrics.md §10, A/B on shared tasks). Both sides' blocks must be row-aligned on the same
    shared tasks (see :func:`shared_tasks`); each replicate applies the same task draw to both, so
    task difficulty cancels out of the interval."""
    nb = len(baseline_blocks)
    if nb == 0 or len(candidate_blocks) != nb:
        raise ValueError("need the same non-zero number of blocks on both sides")
    mats = [_as_columns(b, None) for b in (*baseline_blocks, *candidate_blocks)]
    n_tasks = mats[0].shape[0]
    for m in mats:
        _as_columns(m, n_tasks)

    def delta(sums: list[NDArray[np.float64]]) -> NDArray[np.float64]:
        return np.asarray(statistic(sums[nb:]), dtype=np.float64) - np.asarray(statistic(sums[:nb]), dtype=np.float64)

    est = bootstrap_statistic(mats, delta, n_boot=n_boot, seed=seed, strata=strata, level=level)
    return DeltaCI(est.estimate, est.ci, int(n_tasks), n_boot)


def paired_bootstrap_mean(
    baseline_values: ArrayLike,
    candidate_values: ArrayLike,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    strata: ArrayLike | None = None,
    level: float = DEFAULT_LEVEL,
) -> DeltaCI:
    """Paired Δ of task means from row-aligned per-task values (NaN = undefined, skipped on that
    side only)."""
    return paired_bootstrap(
        [_mean_block(baseline_values)], [_mean_block(candidate_values)], mean_statistic, n_boot=n_boot, seed=seed, strata=strata, level=level
    )
