"""In-memory per-task statistics of each live (group, window), kept current from the sync's rows.

The rollups in ClickHouse (:mod:`relyscope.scoring.rollup`) stay the durable truth; this is a
cache of what :meth:`relyscope.scoring.rollup.Rollup.window_stats` would return for each scored
window ending now, so a scoring cycle needs no ClickHouse read of the windows' per-task rows:

- on first use of a group (start, restart, a new group) its windows are loaded from ClickHouse;
- each cycle the contribution rows the sync wrote (``Rollup.rows``: ``−old`` / ``+new`` states)
  are added to every window whose bucket range holds their end time (:meth:`LiveStats.apply`);
- as a window slides (its start moves to a later bucket) the buckets it leaves are read from
  ClickHouse — one bucket range, i.e. that range's traffic, never the history — and subtracted
  (:meth:`LiveStats.advance`);
- :meth:`LiveStats.check` re-reads one window from ClickHouse, compares and replaces (the
  periodic consistency check; the stage also re-reads the long windows at each CI refresh).

What is kept per (group, window): per task the summed columns of
:data:`relyscope.scoring.stats.SUM_COLUMNS` (Int64 columns in an int32 array while they fit, then
int64; Float64 in a float64 array; Int128 / Int256 in int64 while they fit, then Python ints: exact), the latest end time folded in, and the confidence histogram
— per (task, q) for short windows (minute buckets, bootstrapped every cycle), pooled over tasks
(per q) for the long ones (their per-task histogram is only needed by the bootstrap, which reads
the window from ClickHouse at its cadence). Per group, one trajectory sample: the most recent
``traj_sample`` successful nominal valid runs of each task over all time; the sample of a window
ending now is that list cut at the window start (the M most recent runs of a time suffix are the
M most recent runs overall that fall in it), so windows share it. A retracted run that was in a
full list is refilled from ``traj_sample`` (one query per cycle for all such tasks).

Memory: O(tasks × windows × 66 numbers) + O(tasks × M) trajectory entries per group, bounded by
the tasks seen, not the trials. Trajectory rows expired by the ``traj_sample`` TTL (30 days by
write time) stay in memory until the group's next consistency check re-reads them.
Thread-safety: none; the scoring stage calls it under its rescore lock.
"""

from __future__ import annotations

import bisect
import sys
import logging
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from relyscope.scoring.rollup import GroupKey, Rollup, level_for, window_start
from relyscope.scoring.stats import BIG_TYPES, SUM_COLUMNS, TaskStats

__all__ = ["LiveStats", "WindowState", "same_stats"]

log = logging.getLogger("relyscope.scoring.live")

_NCOL: Final = len(SUM_COLUMNS)
_INT: Final = np.array([i for i, (_, t) in enumerate(SUM_COLUMNS) if t == "Int64"], dtype=np.int64)
_FLT: Final = np.array([i for i, (_, t) in enumerate(SUM_COLUMNS) if t == "Float64"], dtype=np.int64)
_BIG: Final = np.array([i for i, (_, t) in enumerate(SUM_COLUMNS) if t in BIG_TYPES], dtype=np.int64)
#: the largest magnitude a window's Int128 / Int256 sum keeps in int64 (:class:`ExactSums`;
#: 2 ** 62: a factor 2 below int64's limit, far above float64's rounding of the bound check)
_BIG_SAFE: Final = float(2**62)
#: the largest magnitude a window's Int64 count keeps in int32 (:meth:`WindowState.add`; 2 ** 30:
#: a factor 2 below int32's limit). Counts in int32 hold the 40 count columns in 160 bytes a task
#: instead of 320 (~10 MiB of the ~30 MiB the windows' rows take at 10 groups × 1 000 tasks)
_I32_SAFE: Final = 2**30
_N_ALL: Final = 0  # n_all is SUM_COLUMNS[0], an Int64 column (index 0 of _INT)
# contrib_log row layout written by Rollup._row: 5 keys, end_ns, sums, q, y, actions, traj, sign, vns
_R_TASK, _R_END, _R_SUMS = 4, 5, 6
_R_Q, _R_Y, _R_ACT, _R_TRAJ, _R_SIGN = (_R_SUMS + _NCOL + i for i in range(5))
_R_TID: Final = 3


#: distinct action sequences the intern table may hold before its first rebuild
_INTERN_MIN: Final = 10_000

#: WindowState's arrays with one row per task (grown and compacted together, with ``bigs``)
_ROW_ARRAYS: Final = ("ints", "flts", "cres", "cres_ok", "tj", "tj_ok")


class ExactSums:
    """Per-task exact integer sums, one column per summed Int128 / Int256 rollup column
    (:data:`_BIG`: resource sums and sums of squares). A column stays int64 while none of its
    values can reach ±:data:`_BIG_SAFE` (counts, tokens, most sums: ~8 bytes per value) and
    becomes exact Python ints (object) for good the first time one could (squares of durations
    in ns or of costs in nano-USD: ~48 bytes per value). Read back as Python ints either way."""

    __slots__ = ("cols",)

    def __init__(self, cols: list[np.ndarray]):
        self.cols = cols

    @classmethod
    def zeros(cls, n_rows: int, n_cols: int) -> "ExactSums":
        return cls([np.zeros(n_rows, np.int64) for _ in range(n_cols)])

    def __len__(self) -> int:
        return len(self.cols[0]) if self.cols else 0

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """``(len(rows), n_cols)`` object array of Python ints."""
        out = np.empty((len(rows), len(self.cols)), dtype=object)
        for j, c in enumerate(self.cols):
            out[:, j] = c[rows]  # int64 → Python ints in an object array
        return out

    def add_at(self, rows: np.ndarray, vals: np.ndarray, sign: int) -> None:
        """Add (``sign`` 1) or subtract (−1) ``vals`` (Python ints, ``(len(rows), n_cols)``;
        ``rows`` may repeat) exactly. An int64 column is promoted before the add when
        |row| + Σ|added| (bounded in float64) could reach :data:`_BIG_SAFE`."""
        touched = inv = None
        for j, c in enumerate(self.cols):
            v = vals[:, j]
            if c.dtype != object:
                try:
                    fv = np.asarray(v, dtype=np.float64)
                except OverflowError:  # beyond float64 itself
                    fv = None
                fits = fv is not None
                if fits:
                    if touched is None:
                        touched, inv = np.unique(rows, return_inverse=True)
                    worst = np.abs(c[touched].astype(np.float64))
                    np.add.at(worst, inv, np.abs(fv))
                    fits = not worst.size or worst.max() < _BIG_SAFE  # False for NaN / inf too
                if fits:
                    a = np.asarray(v, dtype=np.int64)  # from the ints themselves: exact below 2^62
                    if (a == fv).all():  # not so for a fraction, which int64 would cut: kept exact
                        np.add.at(c, rows, a if sign > 0 else -a)
                        continue
                c = self.cols[j] = c.astype(object)
            np.add.at(c, rows, v if sign > 0 else -v)  # object: exact Python ints

    def grown(self, n_rows: int) -> "ExactSums":
        return ExactSums([np.concatenate([c, np.zeros(n_rows - len(c), c.dtype)]) for c in self.cols])

    def take(self, rows: np.ndarray) -> "ExactSums":
        return ExactSums([c[rows].copy() for c in self.cols])


@dataclass
class WindowState:
    """One window's per-task sums from ``since`` (Unix s, bucket-aligned) on, at ``level``.
    ``pooled``: histogram kept per q over tasks (long windows) instead of per (task, q)."""

    name: str
    length: float | None
    level: int
    size: int
    since: int
    pooled: bool
    ids: dict[str, int] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)
    #: the Int64 sums (counts): int32 until one could reach ±:data:`_I32_SAFE`, then int64 for good
    ints: np.ndarray = field(default_factory=lambda: np.zeros((0, len(_INT)), np.int32))
    flts: np.ndarray = field(default_factory=lambda: np.zeros((0, len(_FLT)), np.float64))
    #: the Int128 / Int256 sums, exact (:class:`ExactSums`: int64 columns where they fit)
    bigs: ExactSums = field(default_factory=lambda: ExactSums.zeros(0, len(_BIG)))
    hist: dict = field(default_factory=dict)  # (task, q) → [pos, neg], or q → [pos, neg] if pooled
    #: not pooled: the same histogram pooled over tasks (q → [pos, neg]), kept beside ``hist`` so
    #: point estimates need not walk every (task, q) entry (P_AUROC pools over tasks)
    phist: dict = field(default_factory=dict)
    max_end_ns: int = 0
    version: int = 0  # bumped on every change (the stage rescores a window whose version moved)
    #: per row: the task's C_res (:func:`relyscope.scoring.stats.c_res_per_task`) and whether it
    #: is current (``add`` clears a row's flag)
    cres: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cres_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: per row: runs of the task's trajectory sample in this window, its C_traj_d, C_traj_s
    #: (``tj``), and which rows hold them for the current sample and window start (``tj_ok``;
    #: cleared by the sample's changes and by the window sliding)
    tj: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    tj_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: trials added or removed so far (Σ |n_all| of every add and subtraction: a re-graded trial
    #: counts twice), what the stage's CI refresh rule measures change by
    churn: int = 0
    #: :meth:`live_rows`' last answer, (alive rows in row order, ids, rows): reused while the same
    #: rows are alive (a long window's task set rarely changes; its ids need no sort every cycle)
    _live_memo: tuple | None = field(default=None, repr=False, compare=False)

    def _rows_for(self, tasks: list[str]) -> np.ndarray:
        out = np.empty(len(tasks), np.int64)
        new = 0
        for i, t in enumerate(tasks):
            r = self.ids.get(t)
            if r is None:
                t = sys.intern(t)  # one string per task id across windows and groups
                r = self.ids[t] = len(self.tasks)
                self.tasks.append(t)
                new += 1
            out[i] = r
        if new:
            n = len(self.tasks)
            if n > self.ints.shape[0]:
                # the first fill (a window's load: all its tasks at once) exact; later growth
                # 1.25× (amortized): rows are ~0.35 KiB each, in every window
                cap = max(16, n) if not self.ints.shape[0] else max(16, n + n // 4)
                for name in _ROW_ARRAYS:  # zeros: 0 sums, and per-task values not current
                    a = getattr(self, name)
                    setattr(self, name, np.concatenate([a, np.zeros((cap - a.shape[0], *a.shape[1:]), a.dtype)]))
                self.bigs = self.bigs.grown(cap)
        return out

    def add(self, tasks: list[str], sums: np.ndarray, sign: int = 1) -> None:
        """Add (``sign`` 1) or subtract (−1) per-task sums: ``sums`` ``(len(tasks), n_cols)`` object."""
        if not tasks:
            return
        rows = self._rows_for(tasks)
        ints = np.asarray(sums[:, _INT].astype(np.int64))
        flts = np.asarray(sums[:, _FLT].astype(np.float64))
        if sign < 0:
            ints, flts = -ints, -flts
        if self.ints.dtype != np.int64:
            # |row| + Σ|added to any row| bounds every result (rows may repeat): int32 wraps
            # silently, so a window whose counts could reach 2^30 is promoted before the add
            worst = (int(np.abs(self.ints[rows]).max(initial=0))
                     + int(np.abs(ints).sum(axis=0).max(initial=0)))
            if worst >= _I32_SAFE:
                self.ints = self.ints.astype(np.int64)
            else:
                ints = ints.astype(self.ints.dtype)
        np.add.at(self.ints, rows, ints)
        self.churn += int(np.abs(ints[:, _N_ALL]).sum())
        np.add.at(self.flts, rows, flts)
        self.cres_ok[rows] = False
        self.bigs.add_at(rows, sums[:, _BIG], sign)
        self.version += 1

    def add_hist(self, task: str, q: float, pos: int, neg: int) -> None:
        key = q if self.pooled else (task, q)
        h = self.hist.get(key)
        if h is None:
            h = self.hist[key] = [0, 0]
        h[0] += pos
        h[1] += neg
        if not h[0] and not h[1]:
            del self.hist[key]
        if not self.pooled:
            h = self.phist.get(q)
            if h is None:
                h = self.phist[q] = [0, 0]
            h[0] += pos
            h[1] += neg
            if not h[0] and not h[1]:
                del self.phist[q]

    def traj_changed(self, task: str) -> None:
        """The task's trajectory sample changed: its C_traj values here are recomputed on read."""
        r = self.ids.get(task)
        if r is not None:
            self.tj_ok[r] = False

    def trials(self) -> int:
        """Trials in the window now (Σ n_all)."""
        return int(self.ints[: len(self.tasks), _N_ALL].sum())

    def live_rows(self) -> tuple[list[str], np.ndarray]:
        """Task ids (sorted) with a trial (n_all != 0) and their row numbers (the caller must
        not modify them: while the same rows are alive, the same two objects are returned)."""
        n = len(self.tasks)
        alive = np.flatnonzero(self.ints[:n, _N_ALL] != 0)
        memo = self._live_memo
        if memo is not None and np.array_equal(memo[0], alive):
            return memo[1], memo[2]
        ids = [self.tasks[i] for i in alive]
        order = sorted(range(len(ids)), key=ids.__getitem__)
        out = [ids[i] for i in order], alive[np.array(order, dtype=np.int64)] if order else alive[:0]
        self._live_memo = (alive, *out)
        return out

    def compact(self) -> None:
        """Drop tasks left without trials (after they slid out of the window)."""
        ids, rows = self.live_rows()
        if len(ids) * 2 >= len(self.tasks):
            return
        for name in _ROW_ARRAYS:
            setattr(self, name, getattr(self, name)[rows].copy())
        self.bigs = self.bigs.take(rows)
        self.tasks = ids
        self.ids = {t: i for i, t in enumerate(ids)}
        self._live_memo = None  # row numbers changed
        if not self.pooled:
            self.hist = {k: v for k, v in self.hist.items() if k[0] in self.ids}


class LiveStats:
    """The in-memory windows of every loaded group (see the module docstring).

    ``windows``: (name, length seconds or None) as :func:`relyscope.scoring.windows.parse_windows`;
    windows at minute buckets (up to 6 h) keep a per-task histogram (they are bootstrapped from
    memory), longer ones a pooled one. ``traj_sample``: M of the rollup."""

    def __init__(self, rollup: Rollup, windows: list[tuple[str, float | None]]):
        self.rollup = rollup
        self.windows = list(windows)
        self.m = rollup.traj_sample
        self._win: dict[GroupKey, dict[str, WindowState]] = {}
        #: group → task → [(end_ns, trial_id, actions)] sorted most recent first (ties: trial id)
        self._traj: dict[GroupKey, dict[str, list[tuple[int, str, tuple[str, ...]]]]] = {}
        #: (action sequences of a task's runs in a window) → (runs, C_traj_d, C_traj_s) computed
        #: since the last :meth:`apply` (they depend on the runs alone)
        self._tj_memo: dict[tuple, tuple[int, float, float]] = {}
        self._refill: dict[GroupKey, set[str]] = {}
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._intern_cap = _INTERN_MIN
        #: consistency checks that found the memory different from ClickHouse (logged, replaced)
        self.mismatches = 0

    # ---- loading -------------------------------------------------------------------------------
    def loaded(self, group: GroupKey) -> bool:
        return group in self._win

    def groups(self) -> list[GroupKey]:
        return list(self._win)

    def drop(self, group: GroupKey | None = None) -> None:
        """Forget one group (or all): the next use reloads it from ClickHouse."""
        if group is None:
            self._win.clear()
            self._traj.clear()
            self._refill.clear()
        else:
            self._win.pop(group, None)
            self._traj.pop(group, None)
            self._refill.pop(group, None)

    def _set_traj(self, group: GroupKey, traj: dict[str, list]) -> None:
        self._traj[group] = traj
        for ws in self._win.get(group, {}).values():
            ws.tj_ok[:] = False

    def _windows_of(self, group: GroupKey) -> list[tuple[str, float | None]]:
        return [("all", None)] if group[2] == "offline" else self.windows

    def _read(self, group: GroupKey, name: str, length: float | None, now_s: float) -> WindowState:
        level, size = level_for(length)
        since = window_start(now_s, length)
        ws = WindowState(name, length, level, size, since, pooled=level != 1)
        st = self.rollup.window_stats(group, since, length, trajectories=False)
        self._fill(ws, st)
        return ws

    @staticmethod
    def _fill(ws: WindowState, st: TaskStats) -> None:
        if st.task_ids:
            ws.add(st.task_ids, st.sums)
        for t, q, p, n in st.hist:
            ws.add_hist(st.task_ids[t], q, p, n)
        ws.max_end_ns = st.max_end_ns

    def _read_traj(self, group: GroupKey, tasks: list[str] | None = None) -> dict[str, list]:
        out: dict[str, list] = {}
        for task, end_ns, tid, actions in self.rollup.traj_runs(group, tasks):
            out.setdefault(task, []).append((int(end_ns), tid, self._intern(tuple(actions))))
        return out

    def _intern(self, actions: tuple[str, ...]) -> tuple[str, ...]:
        """One tuple per distinct action sequence across the samples. The table also keeps the
        sequences of runs since dropped from every sample: when it doubles past what the samples
        hold it is rebuilt from them, so it stays proportional to the samples, not the traffic."""
        if len(self._interned) > self._intern_cap:
            self._interned = {e[2]: e[2] for traj in self._traj.values() for runs in traj.values() for e in runs}
            self._intern_cap = max(_INTERN_MIN, 2 * len(self._interned))
        return self._interned.setdefault(actions, actions)

    def load(self, group: GroupKey, now_s: float) -> None:
        """(Re)load every window of ``group`` ending at ``now_s`` from ClickHouse."""
        self._win[group] = {name: self._read(group, name, length, now_s)
                            for name, length in self._windows_of(group)}
        self._set_traj(group, self._read_traj(group))
        self._refill.pop(group, None)

    # ---- updates -------------------------------------------------------------------------------
    def apply(self, rows: list[list]) -> set[GroupKey]:
        """Fold the contribution rows one sync wrote (already in ClickHouse) into the loaded
        groups' windows; rows of groups not loaded are skipped (a load reads them). Returns the
        groups touched."""
        self._tj_memo.clear()  # once per cycle: bounded by the tasks one cycle's reads recompute
        by_group: dict[GroupKey, list[list]] = {}
        for r in rows:
            by_group.setdefault((r[0], r[1], r[2]), []).append(r)
        touched = set()
        for g, rs in by_group.items():
            wins = self._win.get(g)
            if wins is None:
                continue
            touched.add(g)
            tasks = [r[_R_TASK] for r in rs]
            ends = np.array([r[_R_END] for r in rs], dtype=np.int64)
            sums_all = np.array([r[_R_SUMS:_R_SUMS + _NCOL] for r in rs], dtype=object).reshape(len(rs), _NCOL)
            with_q = [i for i, r in enumerate(rs) if r[_R_Q] is not None]
            for ws in wins.values():
                # the bucket (at this window's level) of each row's end time, from the window's start on
                keep = (ends // 10**9 // ws.size * ws.size if ws.size else np.zeros(len(rs), np.int64)) >= ws.since
                if not keep.any():
                    continue
                sel = np.flatnonzero(keep)
                ws.add([tasks[i] for i in sel.tolist()], sums_all[sel])
                for i in with_q:
                    if keep[i]:
                        r = rs[i]
                        y, sign = r[_R_Y], r[_R_SIGN]
                        ws.add_hist(r[_R_TASK], float(r[_R_Q]), sign if y == 1 else 0, sign if y == 0 else 0)
                ws.max_end_ns = max(ws.max_end_ns, int(ends[sel].max()))
            traj = self._traj[g]
            for r in rs:
                if not r[_R_TRAJ]:
                    continue
                task, entry = r[_R_TASK], (int(r[_R_END]), r[_R_TID], self._intern(tuple(r[_R_ACT])))
                for ws in wins.values():
                    ws.traj_changed(task)
                runs = traj.setdefault(task, [])
                if r[_R_SIGN] < 0:
                    for i, e in enumerate(runs):
                        if e[1] == entry[1]:
                            if len(runs) >= self.m:  # a full list lost a run: the next one is in ClickHouse
                                self._refill.setdefault(g, set()).add(task)
                            del runs[i]
                            break
                else:
                    keys = [(-e[0], e[1]) for e in runs]
                    i = bisect.bisect_left(keys, (-entry[0], entry[1]))
                    if i < self.m:
                        runs.insert(i, entry)
                        del runs[self.m:]
        for g, tasks in list(self._refill.items()):
            if g in self._traj and tasks:
                fresh = self._read_traj(g, sorted(tasks))
                for t in tasks:
                    self._traj[g][t] = fresh.get(t, [])
                    for ws in self._win.get(g, {}).values():
                        ws.traj_changed(t)
            self._refill.pop(g, None)
        return touched

    def advance(self, group: GroupKey, now_s: float) -> set[str]:
        """Slide ``group``'s windows to end at ``now_s`` (see :meth:`advance_all`). Returns the
        names of windows that changed."""
        return self.advance_all([group], now_s).get(group, set())

    def advance_all(self, groups: list[GroupKey], now_s: float) -> dict[GroupKey, set[str]]:
        """Slide the windows of ``groups`` to end at ``now_s``: subtract the buckets each window
        left — read from ClickHouse in one query per bucket level for all windows and groups — or reload a window
        whose start moved back (a clock step) or by more than its length. Returns group → names
        of the windows that changed."""
        out: dict[GroupKey, set[str]] = {}
        moves = []
        for g in groups:
            wins = self._win[g]
            for name, ws in list(wins.items()):
                since = window_start(now_s, ws.length)
                if since == ws.since:
                    continue
                out.setdefault(g, set()).add(name)
                if since < ws.since or ws.length is None or since - ws.since >= ws.length:
                    wins[name] = self._read(g, name, ws.length, now_s)
                    continue
                moves.append((g, name, ws, ws.version, ws.since, since))
        for (g, _, ws, _, _, since), gone in zip(moves, self.read_slides(moves), strict=True):
            self._slide(g, ws, since, gone)
        return out

    # ---- slides read ahead ---------------------------------------------------------------------
    def slide_plan(self, groups: list[GroupKey], now_s: float) -> list[tuple]:
        """The slides :meth:`advance_all` ``(groups, now_s)`` would make by subtracting buckets
        (not the reloads): ``(group, window name, window, its version, start now, start then)``
        each. What :meth:`read_slides` reads ahead and :meth:`slide_from` applies."""
        out = []
        for g in groups:
            for name, ws in self._win.get(g, {}).items():
                since = window_start(now_s, ws.length)
                if ws.length is not None and ws.since < since < ws.since + ws.length:
                    out.append((g, name, ws, ws.version, ws.since, since))
        return out

    def read_slides(self, plan: list[tuple]) -> list[TaskStats]:
        """The buckets each slide of ``plan`` leaves, [start now, start then), read from
        ClickHouse as :meth:`advance_all` reads them (one read per level): one TaskStats per
        entry, in order. Reads only (any thread). Raises StoreUnavailable."""
        by_level: dict[int, dict[tuple[int, int], list[tuple[int, GroupKey]]]] = {}
        for i, (g, _, ws, _, old, new) in enumerate(plan):
            by_level.setdefault(ws.level, {}).setdefault((old, new), []).append((i, g))
        out: list[TaskStats | None] = [None] * len(plan)
        for level, ranges in by_level.items():
            rs = sorted(ranges)
            got = self.rollup.ranges_stats(sorted({g for r in rs for _, g in ranges[r]}), level, rs)
            for j, r in enumerate(rs):
                for i, g in ranges[r]:
                    out[i] = got[(g, j)]
        return out

    def slide_from(self, plan: list[tuple], gone: list[TaskStats], now_s: float) -> int:
        """Make the slides of ``plan`` with the buckets :meth:`read_slides` read for them, where
        still right: the window is the one planned, unchanged since (same version and start), and
        ending at ``now_s`` starts at or after where planned (any further step is
        :meth:`advance_all`'s). Exact only if the rollups have not changed between
        that read and the memory's state now — call it before :meth:`apply` folds in a later sync's
        rows (those of the buckets left are then skipped, as for any row before a window's start).
        The others are left to :meth:`advance_all`. Returns the slides made."""
        made = 0
        for (g, name, ws, ver, old, new), st in zip(plan, gone, strict=True):
            if (self._win.get(g, {}).get(name) is not ws or ws.version != ver or ws.since != old
                    or window_start(now_s, ws.length) < new):
                continue
            self._slide(g, ws, new, st)
            made += 1
        return made

    def _slide(self, g: GroupKey, ws: WindowState, since: int, gone: TaskStats | None) -> None:
        """Slide window ``ws`` of group ``g`` to start at ``since``, past the buckets it left
        (``gone``: :meth:`read_slides`' statistics of them)."""
        if gone is not None and gone.task_ids:
            ws.add(gone.task_ids, gone.sums, -1)
            for t, q, p, n in gone.hist:
                ws.add_hist(gone.task_ids[t], q, -p, -n)
        self._slid_traj(g, ws, since)
        ws.since = since
        ws.version += 1
        if ws.max_end_ns < since * 10**9:
            ws.max_end_ns = 0
        ws.compact()

    def _slid_traj(self, group: GroupKey, ws: WindowState, since_s: int) -> None:
        """Before ``ws`` slides to start at ``since_s``: clear ``tj_ok`` of the tasks whose
        trajectory runs in the window drop (the oldest of the ``m`` runs counted in it ends before
        the new start; a task's runs are most recent first, so that run is the only one to look
        at); the others keep their C_traj values."""
        n = len(ws.tasks)
        ok = np.flatnonzero(ws.tj_ok[:n] & (ws.tj[:n, 0] > 0))
        if not ok.size:
            return
        traj = self._traj.get(group, {})
        since_ns = since_s * 10**9
        stale = []
        for r, m in zip(ok.tolist(), ws.tj[ok, 0].astype(np.int64).tolist()):
            sample = traj.get(ws.tasks[r], ())
            if len(sample) < m or sample[m - 1][0] < since_ns:
                stale.append(r)
        if stale:
            ws.tj_ok[stale] = False

    # ---- reads ---------------------------------------------------------------------------------
    def window(self, group: GroupKey, name: str) -> WindowState:
        return self._win[group][name]

    def find(self, group: GroupKey, name: str) -> WindowState | None:
        """The window if that group is loaded and has it, else None."""
        return self._win.get(group, {}).get(name)

    def stats(self, group: GroupKey, name: str, *, trajectories: bool = True,
              points_only: bool = False) -> TaskStats:
        """The window's statistics as :meth:`Rollup.window_stats` returns them (same task order,
        sums as Python ints / floats, trajectories most recent first). A long window's histogram
        is pooled: ``hist`` is empty and ``pooled_hist`` holds (q, successes, failures) — enough
        for point estimates (:func:`relyscope.scoring.stats.score_stats` with ``n_boot=0``).

        Carries the per-task values the metrics need beyond the sums, kept per task and
        recomputed only for the tasks whose sums (or trajectory sample) changed since the last
        read: ``traj_values`` / ``traj_sizes`` (C_traj_d, C_traj_s) and ``c_res``.
        ``trajectories`` False
        leaves the sample's action lists out (``trajectories`` empty; what scoring reads of
        them is in ``traj_values`` / ``traj_sizes``): cost O(tasks) array copies plus the changed
        tasks' work, not O(tasks × M). ``points_only``: for point estimates only — the histogram
        comes pooled (``pooled_hist``) for every window, from the pooled twin kept beside the
        per-task one (every histogram entry comes from a valid, complete, nominal trial with an
        outcome, so the per-task histogram restricted to the usable tasks is all of it)."""
        from relyscope.scoring.stats import c_res_per_task

        ws = self._win[group][name]
        ids, rows = ws.live_rows()
        if trajectories:
            sums = self._sums(ws, rows)
        else:  # the Int128 / Int256 sums only (the others are read from fsums)
            sums = np.empty((len(rows), _NCOL), dtype=object)
            if len(rows):
                sums[:, _BIG] = ws.bigs.rows(rows)
        fsums = np.full((len(rows), _NCOL), np.nan)
        if len(rows):
            fsums[:, _INT] = ws.ints[rows]
            fsums[:, _FLT] = ws.flts[rows]
        # C_res for the rows whose sums changed since it was computed
        stale = rows[~ws.cres_ok[rows]] if len(rows) else rows
        if stale.size:
            ws.cres[stale] = c_res_per_task(TaskStats([ws.tasks[i] for i in stale.tolist()], self._sums(ws, stale)))
            ws.cres_ok[stale] = True
        since_ns = ws.since * 10**9
        traj = self._traj.get(group, {})
        # per-task sample sizes, C_traj_d, C_traj_s: recomputed only for tasks whose sample changed
        stale_t = rows[~ws.tj_ok[rows]] if len(rows) else rows
        if stale_t.size:
            from relyscope.scorers import metrics as M

            # C_traj depends on the runs alone: the windows of a group mostly cut a task's sample
            # at the same place (all M runs), so what one window computed this cycle the next reuses
            memo = self._tj_memo
            vals = np.empty((stale_t.size, 3))
            todo: list[tuple[int, tuple]] = []
            for j, r in enumerate(stale_t.tolist()):
                sample = traj.get(ws.tasks[r], ())
                m = 0
                for e in sample:  # most recent first: the runs in the window are a prefix
                    if e[0] < since_ns:
                        break
                    m += 1
                key = tuple(e[2] for e in sample[:m])
                got = memo.get(key)
                if got is None:
                    todo.append((j, key))
                else:
                    vals[j] = got
            if todo:
                enc = M.encode_trajectories([key for _, key in todo])
                d, sv = M.c_traj_d_per_task(enc), M.c_traj_s_per_task(enc)
                for i, (j, key) in enumerate(todo):
                    vals[j] = memo[key] = (len(key), d[i], sv[i])
            ws.tj[stale_t] = vals
            ws.tj_ok[stale_t] = True
        tj = ws.tj[rows] if len(rows) else np.zeros((0, 3))
        d, sv, sizes = tj[:, 1].copy(), tj[:, 2].copy(), tj[:, 0].astype(np.int64)
        lists = ([[e[2] for e in traj.get(t, ())[: sizes[i]]] for i, t in enumerate(ids)]
                 if trajectories else [])
        extra = dict(max_end_ns=ws.max_end_ns, traj_values=(d, sv), traj_sizes=sizes,
                     c_res=ws.cres[rows] if len(rows) else np.zeros(0), fsums=fsums)
        if ws.pooled or points_only:
            pooled = sorted((q, p, n) for q, (p, n) in (ws.hist if ws.pooled else ws.phist).items() if p or n)
            return TaskStats(ids, sums, [], lists, pooled_hist=pooled, **extra)
        idx = {t: i for i, t in enumerate(ids)}
        hist = sorted((idx[t], q, p, n) for (t, q), (p, n) in ws.hist.items() if t in idx and (p or n))
        return TaskStats(ids, sums, hist, lists, **extra)

    @staticmethod
    def _sums(ws: WindowState, rows: np.ndarray) -> np.ndarray:
        sums = np.empty((len(rows), _NCOL), dtype=object)
        if len(rows):
            sums[:, _INT] = ws.ints[rows].astype(object)
            sums[:, _FLT] = ws.flts[rows].astype(object)
            sums[:, _BIG] = ws.bigs.rows(rows)
        return sums

    def check(self, group: GroupKey, name: str, now_s: float, *, fresh: TaskStats | None = None) -> bool:
        """Compare one window (and the group's trajectory sample as that window sees it) with
        ClickHouse (``fresh``: a read of it already made, e.g. for a CI refresh, at the window's
        current start); on a difference log it, count it in ``mismatches`` and replace the memory.
        Returns True when they agreed."""
        ws = self._win[group][name]
        if fresh is None:
            fresh = self.rollup.window_stats(group, ws.since, ws.length)
        mine = self.stats(group, name)
        ok = same_stats(mine, fresh, pooled=ws.pooled)
        if not ok:
            self.mismatches += 1
            log.warning("in-memory statistics of %s window %s differed from the rollups: reloaded", group, name)
            new = WindowState(ws.name, ws.length, ws.level, ws.size, ws.since, ws.pooled, version=ws.version + 1)
            self._fill(new, fresh)
            self._win[group][name] = new
            self._set_traj(group, self._read_traj(group))
        return ok


def same_stats(a: TaskStats, b: TaskStats, *, pooled: bool = False, rel: float = 1e-9) -> bool:
    """Whether two window statistics agree: task ids, integer sums exactly, float sums to
    ``rel``, the histogram (pooled over tasks if ``pooled``) and the trajectory samples."""
    if a.task_ids != b.task_ids:
        return False
    if a.task_ids:
        ia, ib = a.sums[:, _INT].astype(np.int64), b.sums[:, _INT].astype(np.int64)
        if not np.array_equal(ia, ib):
            return False
        if any(int(x) != int(y) for x, y in zip(a.sums[:, _BIG].ravel(), b.sums[:, _BIG].ravel())):
            return False
        fa, fb = a.sums[:, _FLT].astype(np.float64), b.sums[:, _FLT].astype(np.float64)
        if not np.allclose(fa, fb, rtol=rel, atol=1e-9):
            return False
    ha, hb = (_pool(a), _pool(b)) if pooled else (sorted(a.hist), sorted(b.hist))
    if ha != hb:
        return False
    return [list(t) for t in a.trajectories] == [list(t) for t in b.trajectories]


def _pool(st: TaskStats) -> list[tuple[float, int, int]]:
    if st.pooled_hist is not None:
        return sorted(st.pooled_hist)
    acc: dict[float, list[int]] = {}
    for _, q, p, n in st.hist:
        h = acc.setdefault(q, [0, 0])
        h[0] += p
        h[1] += n
    return sorted((q, p, n) for q, (p, n) in acc.items() if p or n)
