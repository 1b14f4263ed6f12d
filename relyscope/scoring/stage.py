"""The scoring stage: recompute, store and publish the scores of groups whose trials changed.

A group is (agent, version, run kind). The worker marks groups dirty (:meth:`ScoreStage.mark_dirty`)
when it stores their trials; a scorer thread (:meth:`ScoreStage.run`) rescores them every
``score_interval_s``: it loads the group's trials from the store with their outcomes resolved
(metrics.md §6), asks the configured LLM judge about undecided ones, grades and scores them
(:func:`relyscope.scorers.review.score_reviewed`), stores score and grade rows and swaps the
published ``scores`` dict in one reference assignment.

Thread-safety: ``mark_dirty`` may be called from any thread; ``rescore`` is serialized.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import threading
import time
from typing import Callable

from relyscope.config import Settings
from relyscope.model import Trial
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.policy import Policy
from relyscope.scorers.profile import GroupScore
from relyscope.scorers.review import GroupReview, policy_for, review_group, score_reviewed
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.shadow.grading import resolve_replays
from relyscope.scoring.drift import drift as drift_of
from relyscope.scoring.stats import score_stats
from relyscope.scoring.windows import parse_windows, window_name
from relyscope.store import Store, StoreUnavailable

__all__ = ["ScoreStage", "GroupKey", "score_rows", "grade_rows_of"]

log = logging.getLogger("relyscope.scoring")

GroupKey = tuple[str, str, str]  # (agent, version, run_kind)

_REPR = re.compile(r" at 0x[0-9a-fA-F]{6,}>?$")


def _looks_like_repr(name: str) -> bool:
    """``<agents.Agent object at 0x7f3a…>``: a default repr, not a name."""
    return bool(_REPR.search(name))


def _OTHER(run_kind: str) -> GroupKey:
    return ("other", "other", run_kind)


_MAX_DEFER = 5  # scorer cycles a backlogged worker may postpone in a row (ScoreStage.__init__)
_REVIEW_EVERY_S = 60.0  # report sections of a changing group are recomputed at most this often
_REVIEW_RECENT = 5000  # trials (the most recently stored) behind the report sections of a live group


class ScoreStage:
    """Owns the latest scores and the set of groups waiting to be rescored.

    ``store_error`` is called with the :class:`StoreUnavailable` of a failed score/grade write
    (the scores are still published; the write is retried on the next rescore of the group).
    """

    def __init__(self, settings: Settings, store: Store, policy: Policy | None, *,
                 stop: threading.Event | None = None,
                 store_error: Callable[[StoreUnavailable], None] | None = None,
                 busy: Callable[[], bool] | None = None, max_defer: int = _MAX_DEFER):
        self.settings = settings
        # yield to the worker: while ``busy()`` (the pipeline's worker has a backlog of full insert
        # batches) a cycle of the scorer thread is postponed, at most ``max_defer`` in a row, so
        # scores lag by at most (max_defer + 1) * score_interval_s. The scorer shares the worker's
        # core and GIL; it cost a draining worker ~28 % of its wall time (bench_worker_wall.py)
        self._busy = busy
        self.max_defer = max_defer
        self.deferred_cycles = 0  # cycles postponed so far
        self.store = store
        self.policy = policy
        self._stop = stop or threading.Event()
        self._on_store_error = store_error or (lambda e: None)
        self.scores: dict[GroupKey, GroupScore] = {}
        self._dirty_groups: set[GroupKey] = set()
        self._pending_traces: set[str] = set()  # stored by the worker, not yet folded in
        self._score_lock = threading.Lock()
        self._rescore_lock = threading.Lock()
        self._extras: dict[GroupKey, dict] = {}
        windows = parse_windows(settings.score_windows)
        if settings.score_window_s is not None:  # the legacy single window: primary, and scored too
            name = window_name(settings.score_window_s)
            if name not in [n for n, _ in windows]:
                windows.append((name, float(settings.score_window_s)))
            self.primary_window = name
        else:
            self.primary_window = "all" if "all" in [n for n, _ in windows] else windows[-1][0]
        self.windows: list[tuple[str, float | None]] = windows
        #: window name → group → score (offline groups: their all-time score in every window)
        self.window_scores: dict[str, dict[GroupKey, GroupScore]] = {}
        self._rollup: Rollup | None = None
        self._scored_since: dict[tuple[GroupKey, str], int] = {}  # window start last scored
        self._changed: set[GroupKey] = set()  # changed in the rollup, not yet rescored
        self._undecided: collections.OrderedDict[str, Trial] = collections.OrderedDict()
        self._reviewed_at: dict[GroupKey, float] = {}
        self._admitted: set[tuple[str, str]] = set()  # (agent, version) label sets scored as such
        #: run kind → (agent, version) label sets folded into 'other' by the cardinality cap
        self.folded: dict[str, int] = {}
        #: group → metric → Drift of the current vs the reference window (live groups only)
        self.drift: dict[GroupKey, dict] = {}
        self._drift_cur = parse_windows(settings.drift_current)[0][1]
        self._drift_ref = parse_windows(settings.drift_reference)[0][1]

    def mark_dirty(self, groups) -> None:
        """Queue groups (iterable of :data:`GroupKey`) for the next rescore. Any thread."""
        with self._score_lock:
            self._dirty_groups.update(groups)

    def trials_stored(self, trials) -> None:
        """The worker stored (or replaced) these trials: fold their traces in at the next cycle
        (besides the store's watermark, which a wall clock stepping back could mislead). Any
        thread."""
        trials = list(trials)
        with self._score_lock:
            self._dirty_groups.update((t.agent_name, t.agent_version, t.run_kind) for t in trials)
            self._pending_traces.update(t.trace_id for t in trials)

    def run(self) -> None:
        """The scorer thread's body: rescore every ``score_interval_s`` until ``stop`` is set."""
        self._score_loop()

    def _score_loop(self) -> None:
        # at start, score every group already in the store: after a restart the gauges and the
        # report would otherwise stay empty until new spans arrive (dashboards go blank)
        first = True
        deferred = 0
        while first or not self._stop.wait(self.settings.score_interval_s):
            if not first and deferred < self.max_defer and self._busy is not None and self._busy():
                deferred += 1
                self.deferred_cycles += 1
                continue
            deferred = 0
            try:
                self.rescore(all_groups=first)
                first = False
            except Exception:  # noqa: BLE001 - store may be down: retry next interval
                log.exception("scoring failed")
                first = not self.scores
                # a failed first cycle is retried after an interval too: it used to be retried at
                # once, burning a core and logging a traceback every few ms while the store was down
                if first and self._stop.wait(self.settings.score_interval_s):
                    break

    def load_trials(self, **filters) -> list[Trial]:
        """Trials from the store with their outcomes resolved (metrics.md §6). Filters as
        :meth:`relyscope.store.Store.load_trials`."""
        judged = self.store.judgements() if self.settings.judge_url else None
        posted = self.store.outcomes()
        trials = apply_outcomes(self.store.load_trials(**filters), posted, judged)
        return resolve_replays(self.store, trials, posted, judged, self.policy)

    def _windowed_trials(self, **filters) -> list[Trial]:
        """Trials to score: with ``score_window_s`` set, those that ended within the window (rolling
        metrics), except offline imports, which always count; else every stored trial."""
        window = self.settings.score_window_s
        if window is None or filters.get("run_kind") == "offline":
            return self.load_trials(**filters)
        since = time.time_ns() - int(window * 1e9)
        recent = [t for t in self.load_trials(**filters, since_ns=since) if t.run_kind != "offline"]
        if "run_kind" in filters:
            return recent
        return recent + self.load_trials(**{**filters, "run_kind": "offline"})

    def _resolved_trials(self, **filters) -> list[Trial]:
        trials = self._windowed_trials(**filters)
        if self.settings.judge_url:
            undecided = [t for t in trials if t.outcome == "unknown" and t.status == "complete"]
            if undecided and self._judge(undecided):
                trials = self._windowed_trials(**filters)
        return trials

    def _judge(self, trials: list[Trial]) -> int:
        """Ask the configured LLM judge about up to ``judge_max_per_cycle`` undecided trials; store
        the verdicts. Network errors are logged and retried next cycle. Returns verdicts stored."""
        import httpx

        from relyscope.scorers.judge import judge_request, parse_judge_reply

        s = self.settings
        headers = {"Authorization": f"Bearer {s.judge_api_key.get_secret_value()}"} if s.judge_api_key else {}
        url = s.judge_url.rstrip("/") + "/chat/completions"
        stored = 0
        for t in trials[: s.judge_max_per_cycle]:
            try:
                r = httpx.post(url, json=judge_request(t, s.judge_model), headers=headers, timeout=s.judge_timeout_s)
                r.raise_for_status()
                ev = parse_judge_reply(r.json())
            except (httpx.HTTPError, ValueError) as e:
                log.warning("LLM judge call failed: %s", e)
                break
            if ev is not None:
                self.store.insert_judgement(t.trial_id, ev, s.judge_model)
                stored += 1
        return stored

    def report_extras(self, scores: dict) -> dict:
        """Per-group additions to the report (violations, attribution, worst tasks; for live
        groups ``drift``: metric → ``{"delta", "ci", "flagged"}``, current vs reference window)."""
        out = {}
        for g in scores:
            ex = dict(self._extras.get(g, {}))
            if g in self.drift:
                ex["drift"] = {
                    "current": self.settings.drift_current, "reference": self.settings.drift_reference,
                    "threshold": self.settings.drift_threshold,
                    "metrics": {k: {"delta": None if math.isnan(x.delta) else x.delta,
                                    "ci": list(x.ci) if x.ci else None, "flagged": x.flagged}
                                for k, x in self.drift[g].items()}}
            if ex:
                out[g] = ex
        return out

    def rescore(self, *, all_groups: bool = False) -> dict[GroupKey, GroupScore]:
        """Recompute scores of changed groups (or all) from the store; store and publish them.

        Serialized: two overlapping rescores (the scorer thread and a flush) could otherwise
        publish in the wrong order, the older snapshot of the trials overwriting the newer."""
        with self._rescore_lock:
            if self.settings.incremental_scoring:
                return self._rescore_incremental(all_groups)
            return self._rescore(all_groups)

    # ---- incremental scoring from the rollups -------------------------------------------------
    def rollup(self) -> Rollup:
        """The store's rollups (created on first use: the store may be down at start)."""
        if self._rollup is None:
            s = self.settings
            self._rollup = Rollup(self.store, self.policy, judge=bool(s.judge_url), traj_sample=s.traj_sample,
                                  minute_ttl_days=s.rollup_minute_ttl_days, hour_ttl_days=s.rollup_hour_ttl_days,
                                  traj_ttl_days=s.traj_sample_ttl_days)
        return self._rollup

    def _sync(self) -> None:
        ru = self.rollup()
        with self._score_lock:
            pending, self._pending_traces = self._pending_traces, set()
        try:
            self._changed |= ru.sync(pending)
        except BaseException:
            with self._score_lock:
                self._pending_traces |= pending
            raise
        for t in ru.undecided:
            self._undecided[t.trial_id] = t
            self._undecided.move_to_end(t.trial_id)
        while len(self._undecided) > 10_000:  # bounded: the oldest undecided are given up on
            self._undecided.popitem(last=False)
        ru.undecided = []

    def _rescore_incremental(self, all_groups: bool) -> dict[GroupKey, GroupScore]:
        """Fold the changes since the last cycle into the rollups, then rescore each (group,
        window) whose statistics changed or whose window start moved to the next bucket; an
        unchanged window is not recomputed. Cost: the changed trials plus, per rescored window,
        its tasks (× B for the bootstrap) — never the trial history."""
        with self._score_lock:
            self._dirty_groups.clear()  # the rollup's watermarks find every change
        self._sync()
        if self.settings.judge_url and self._undecided:
            pending = list(self._undecided.values())
            if self._judge(pending):
                self._sync()  # fold the verdicts in now
            for t in pending[: self.settings.judge_max_per_cycle]:
                self._undecided.pop(t.trial_id, None)
        ru = self.rollup()
        plan = self._plan(ru)  # published group → pooled (agent, version) members, or None
        changed_pub = {self._published_as(g) for g in self._changed}
        groups = set(plan) if all_groups or not self.window_scores else \
            (set(self.window_scores.get(self.primary_window, {})) | changed_pub) & set(plan)
        now = time.time()
        out = {name: dict(self.window_scores.get(name, {})) for name, _ in self.windows}
        drift = dict(self.drift)
        rows: list[dict] = []
        for g in sorted(groups):
            # all_groups (start, flush, a posted outcome) need not redo unchanged windows: the
            # sync above found every change; only groups never published are new here
            changed = g in changed_pub or g not in out.get(self.primary_window, {})
            members = plan[g]
            measured = policy_for(self.policy, g[0]) is not None
            wins = [("all", None)] if g[2] == "offline" else self.windows
            for name, length in wins:
                since = window_start(now, length)
                if not changed and self._scored_since.get((g, name)) == since:
                    continue
                st = ru.window_stats(g, since, length, members=members)
                gs = score_stats(st, safety_measured=measured,
                                 n_boot=self.settings.n_boot, seed=0, max_k=self.settings.max_k)
                self._scored_since[(g, name)] = since
                targets = [n for n, _ in self.windows] if g[2] == "offline" else [name]
                for n in targets:
                    out[n][g] = gs
                if name == self.primary_window or (g[2] == "offline"):
                    # window end: the latest trial end in it, so rescoring unchanged data
                    # writes the same row (the scores table is a ReplacingMergeTree on it)
                    rows += _window_rows(g, gs, since, st.max_end_ns / 1e9 or now, self.settings.n_boot, name,
                                         stats_digest(st))
            if g[2] != "offline" and (changed or self._scored_since.get((g, "drift")) != window_start(now, 60)):
                drift[g] = self._drift(ru, g, now, measured, members)
                self._scored_since[(g, "drift")] = window_start(now, 60)
            due = all_groups or now - self._reviewed_at.get(g, 0.0) >= _REVIEW_EVERY_S or g not in self._extras
            if changed and due and members is None:
                self._extras[g] = self._review(g, now)
                self._reviewed_at[g] = now
            elif members is not None:
                self._extras[g] = {"warnings": [
                    f"{len(members)} (agent, version) label sets beyond RELYSCOPE_MAX_LABEL_SETS="
                    f"{self.settings.max_label_sets} are scored together as agent=version='other'"
                    + (f"; {sum(_looks_like_repr(a) for a, _ in members)} of their agent names look like an "
                       "object's repr with a memory address (an instrumentation bug: pass the agent's name)"
                       if any(_looks_like_repr(a) for a, _ in members) else "")],
                    "folded_label_sets": len(members)}
        for name in out:  # groups folded since they were published
            for g in [g for g in out[name] if g not in plan]:
                del out[name][g]
        self._changed -= {g for g in self._changed if self._published_as(g) in groups}
        self.window_scores = out
        self.drift = drift
        self.scores = out.get(self.primary_window, {})  # one reference swap per dict
        try:
            self.store.insert_scores(rows)
        except StoreUnavailable as e:
            self._on_store_error(e)
        return dict(self.scores)

    def _plan(self, ru: Rollup) -> dict[GroupKey, list[tuple[str, str]] | None]:
        """Which groups are scored under their own labels and which fold into ``other``: the
        first ``max_label_sets`` (agent, version) pairs to appear (largest first at start) keep
        their labels for the life of the process; later ones are pooled per run kind."""
        sizes = ru.group_sizes()
        cap = self.settings.max_label_sets
        for g, _ in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
            if len(self._admitted) >= cap:
                break
            self._admitted.add((g[0], g[1]))
        plan: dict[GroupKey, list[tuple[str, str]] | None] = {}
        self.folded = {}
        for g in sizes:
            if (g[0], g[1]) in self._admitted:
                plan[g] = None
            else:
                plan.setdefault(_OTHER(g[2]), []).append((g[0], g[1]))
                self.folded[g[2]] = self.folded.get(g[2], 0) + 1
        return plan

    def _published_as(self, g: GroupKey) -> GroupKey:
        return g if (g[0], g[1]) in self._admitted else _OTHER(g[2])

    def _drift(self, ru: Rollup, g: GroupKey, now: float, measured: bool, members=None) -> dict:
        """metrics.md §10: the current window (``drift_current``, default the last 1 h) against
        the reference window just before it (``drift_reference``, default 24 h), both at minute
        buckets so they meet at one boundary. See :func:`relyscope.scoring.drift.drift`."""
        split = int((now - self._drift_cur) // 60 * 60)
        cur = ru.window_stats(g, split, self._drift_cur, level=1, members=members)
        ref = ru.window_stats(g, split - int(self._drift_ref), self._drift_ref, until_s=split, level=1,
                              members=members)
        return drift_of(cur, ref, safety_measured=measured, threshold=self.settings.drift_threshold,
                        n_boot=self.settings.n_boot, seed=0, max_k=self.settings.max_k)

    def _review(self, g: GroupKey, now: float) -> dict:
        """Report sections beyond the metrics (violations, attribution, control rates, worst
        tasks) from the group's most recently stored trials (``_REVIEW_RECENT``; offline imports:
        all of them) — bounded
        by the traffic, not the history; refreshed at most every ``_REVIEW_EVERY_S`` per group.
        (Per-trial grades are stored by the rollup as trials change.)"""
        # the most recent runs stored, not the last hour by timestamp: backfilled or skewed runs
        # (old timestamps) must not vanish from the report's sections
        recent = None if g[2] == "offline" else _REVIEW_RECENT
        trials = self.store.load_trials(agent=g[0], version=g[1], run_kind=g[2],
                                        **({} if recent is None else {"most_recent": recent}))
        trials = self.rollup().resolve(trials)
        return review_group(trials, policy_for(self.policy, g[0])).extras

    def _rescore(self, all_groups: bool) -> dict[GroupKey, GroupScore]:
        with self._score_lock:
            groups = set(self._dirty_groups)
            self._dirty_groups.clear()
        if not all_groups and not groups:
            return dict(self.scores)
        try:
            if all_groups:
                trials = self._resolved_trials()
            else:  # only the groups whose trials changed: the store holds every other one
                trials = [t for g in groups for t in self._resolved_trials(agent=g[0], version=g[1], run_kind=g[2])]
        except Exception:
            with self._score_lock:  # try these groups again next time
                self._dirty_groups.update(groups)
            raise
        by_group: dict[GroupKey, list[Trial]] = collections.defaultdict(list)
        for t in trials:
            by_group[(t.agent_name, t.agent_version, t.run_kind)].append(t)
        if all_groups:
            groups = set(by_group) | set(self.scores)
        rows, grade_rows = [], []
        scores = dict(self.scores)
        for g in groups:
            if g not in by_group:
                # no trial left (e.g. a nested agent scored as a provisional root, superseded when
                # the real root arrived): no ghost group in the report and on /metrics
                scores.pop(g, None)
                self._extras.pop(g, None)
                continue
            gs, rv = score_reviewed(by_group[g], self.policy, n_boot=self.settings.n_boot, seed=0,
                                    max_k=self.settings.max_k)
            scores[g] = gs
            self._extras[g] = rv.extras
            rows += score_rows(g, gs, by_group[g], n_boot=self.settings.n_boot)
            grade_rows += grade_rows_of(g, rv)
        self.scores = scores  # one reference swap: readers never see a dict being changed
        try:
            self.store.insert_scores(rows)
            self.store.insert_grades(grade_rows)
        except StoreUnavailable as e:
            self._on_store_error(e)
        return dict(self.scores)


def grade_rows_of(group: GroupKey, rv: GroupReview) -> list[dict]:
    """Rows for the ``grades`` table: one per trial, the grade as JSON, versioned by time."""
    import dataclasses as _dc
    import json

    from relyscope.semconv import FORMULA_SET

    now = time.time_ns()
    out = []
    for i, (tid, g) in enumerate(sorted(rv.grades.items())):
        d = _dc.asdict(g)
        out.append({"trial_id": tid, "agent": group[0], "version": group[1], "run_kind": group[2],
                    "grade": json.dumps(d, default=str, ensure_ascii=True), "severity": float(g.severity),
                    "attribution": g.attribution.category.value if g.attribution else "",
                    "valid": bool(g.valid), "formula_set": FORMULA_SET, "version_ns": now + i})
    return out


def score_rows(group: GroupKey, gs: GroupScore, trials: list[Trial], *, n_boot: int) -> list[dict]:
    """Rows for the ``scores`` table (one per metric), each naming how it was made."""
    import json
    import math

    from relyscope.semconv import FORMULA_SET

    start = min((t.start_ns for t in trials), default=0) / 1e9
    end = max((t.end_ns for t in trials), default=0) / 1e9
    now = time.time()
    inputs = score_inputs_digest(trials)
    rows = []
    for metric, mv in gs.metrics.items():
        rows.append({
            "formula_set": FORMULA_SET, "agent": group[0], "version": group[1], "run_kind": group[2],
            "metric": metric, "value": None if math.isnan(mv.value) else mv.value,
            "ci_low": mv.ci[0] if mv.ci else None, "ci_high": mv.ci[1] if mv.ci else None,
            "n_tasks": mv.n_tasks, "n_trials": mv.n_trials, "window_start": start,
            "window_end": end, "n_boot": n_boot, "params": json.dumps({"ci": 0.95, "seed": 0}),
            "computed_at": now, "inputs": inputs,
        })
    return rows


def score_inputs_digest(trials: list[Trial]) -> str:
    """A short digest (16 hex) of what a group's scores were computed from: each trial's id,
    revision, status, resolved outcome, outcome score and confidence. Part of the ``scores`` key:
    re-scoring unchanged inputs replaces a row, changed inputs (a late verdict) add one."""
    import hashlib

    h = hashlib.sha256()
    for t in sorted(trials, key=lambda t: t.trial_id):
        h.update(repr((t.trial_id, t.revision, t.status, t.outcome, t.outcome_score,
                       t.confidence)).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def stats_digest(st) -> str:
    """A short digest (16 hex) of the per-task statistics a window's scores were computed from
    (the incremental scorer's ``inputs`` of the ``scores`` key, as :func:`score_inputs_digest` is
    the batch scorer's): unchanged statistics replace a row, changed ones add one."""
    import hashlib

    h = hashlib.sha256()
    h.update(repr((st.task_ids, st.sums.tolist(), st.hist, st.trajectories)).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def _window_rows(group: GroupKey, gs: GroupScore, since_s: int, end_s: float, n_boot: int, window: str,
                 inputs: str = "") -> list[dict]:
    """Rows for the ``scores`` table of one window's scores (window bounds in Unix seconds)."""
    import json
    import math

    from relyscope.semconv import FORMULA_SET

    return [{
        "formula_set": FORMULA_SET, "agent": group[0], "version": group[1], "run_kind": group[2],
        "metric": metric, "value": None if math.isnan(mv.value) else mv.value,
        "ci_low": mv.ci[0] if mv.ci else None, "ci_high": mv.ci[1] if mv.ci else None,
        "n_tasks": mv.n_tasks, "n_trials": mv.n_trials, "window_start": float(since_s), "window_end": end_s,
        "n_boot": n_boot, "params": json.dumps({"ci": 0.95, "seed": 0, "window": window}),
        "computed_at": time.time(), "inputs": inputs,
    } for metric, mv in gs.metrics.items()]
