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
import concurrent.futures
import heapq
import logging
import marshal
import math
import re
import struct
import threading
import time
from typing import Callable

from relyscope import memory
from relyscope.config import Settings
from relyscope.model import Trial
from relyscope.scorers.bootstrap import yielding
from relyscope.scorers.graders import grade_trial
from relyscope.scorers.policy import Policy
from relyscope.scorers.profile import GroupScore
from relyscope.scorers.review import (GroupReview, TrialFacts, policy_for, review_group, score_reviewed,
                                      sections, trial_facts)
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.shadow.grading import load_resolved
from relyscope.scoring.drift import drift as drift_of
from relyscope.scoring.live import LiveStats, same_stats
from relyscope.scoring.stats import TaskStats, score_stats
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
_FILL_PAGE = 1000  # trials per read when the kept report facts of a group are filled


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
        #: scoring cycles completed (0 until the first one after a start, which loads every
        #: window: a report before it is empty although trials are stored)
        self.cycles_done = 0
        #: wall seconds of each completed cycle, oldest first (drained into the
        #: ``relyscope_score_cycle_seconds`` histogram at scrape; bounded, the oldest are dropped)
        self.cycle_seconds: collections.deque[float] = collections.deque(maxlen=4096)
        #: ``time.time()`` when the last cycle completed and published its scores (None before
        #: the first): ``relyscope_scores_age_seconds`` is the time since
        self.last_cycle_end: float | None = None
        self.store = store
        self.policy = policy
        self._stop = stop or threading.Event()
        self._on_store_error = store_error or (lambda e: None)
        self.scores: dict[GroupKey, GroupScore] = {}
        self._dirty_groups: set[GroupKey] = set()
        self._pending_traces: set[str] = set()  # stored by the worker, not yet folded in
        self._pending_trials: set[str] = set()  # named by a posted outcome or verdict, ditto
        self._score_lock = threading.Lock()
        self._rescore_lock = threading.Lock()
        #: set while no cycle runs: background CI refreshes start only then, in the gap between
        #: cycles, so they do not take the core and the GIL from a cycle (2 cores: they did)
        self._between_cycles = threading.Event()
        self._between_cycles.set()
        self._closed = False
        self._extras: dict[GroupKey, dict] = {}
        windows = parse_windows(settings.score_windows)
        if settings.score_window_s is not None:  # the legacy single window: primary, and scored too
            name = window_name(settings.score_window_s)
            if name not in [n for n, _ in windows]:
                windows.append((name, float(settings.score_window_s)))
            self.primary_window = name
        elif not settings.incremental_scoring:  # the batch scorer scores every stored trial
            self.primary_window = "all"
        else:
            self.primary_window = "all" if "all" in [n for n, _ in windows] else windows[-1][0]
        self.windows: list[tuple[str, float | None]] = windows
        #: the windows whose scores are computed: every window of ``windows`` when incremental;
        #: the batch scorer (``incremental_scoring`` false) scores the primary one only
        self.computed_windows: list[str] = [n for n, _ in windows] if settings.incremental_scoring \
            else [self.primary_window]
        #: window name → group → score (offline groups: their all-time score in every window)
        self.window_scores: dict[str, dict[GroupKey, GroupScore]] = {}
        self._rollup: Rollup | None = None
        self._scored_since: dict[tuple[GroupKey, str], int] = {}  # window start last scored
        self._changed: set[GroupKey] = set()  # changed in the rollup, not yet rescored
        self._undecided: collections.OrderedDict[str, Trial] = collections.OrderedDict()
        self._reviewed_at: dict[GroupKey, float] = {}
        #: trials behind a live group's report sections (the most recently stored), and the facts
        #: kept of them per group (:class:`_RecentFacts`, updated by every sync)
        self.review_recent = _REVIEW_RECENT
        self._facts: dict[GroupKey, _RecentFacts] = {}
        self._facts_gen = 0
        self._admitted: set[tuple[str, str]] = set()  # (agent, version) label sets scored as such
        #: run kind → (agent, version) label sets folded into 'other' by the cardinality cap
        self.folded: dict[str, int] = {}
        #: group → metric → Drift of the current vs the reference window (live groups only)
        self.drift: dict[GroupKey, dict] = {}
        self._drift_cur = parse_windows(settings.drift_current)[0][1]
        self._live: LiveStats | None = None
        self._rows: list[list] = []  # contribution rows synced, not yet folded into memory
        #: CI refreshes (long windows and drift) made by the last rescore, and its seconds per
        #: phase (for benches)
        self.last_refreshes = 0
        self.phase_s: dict[str, float] = {}
        self._live_gen = 0
        self._ver: dict[tuple[GroupKey, str], int] = {}  # in-memory window version last scored
        self._ci_every_cycle = {n for n, _ in parse_windows(settings.score_ci_every_cycle)} \
            if settings.score_ci_every_cycle.strip() else set()
        self._ci_dirty: set = set()  # (group, window | 'drift') changed since its CI was computed
        self._ci_at: dict = {}  # ... → when its CI was last computed
        self._ci_scores: dict[tuple[GroupKey, str], GroupScore] = {}  # ... → the score with those CIs
        self._ci_credit = 0.0
        self._ci_clock = 0.0
        #: (group, window) → (the window's churn, its trials) when its CI was last computed
        self._ci_churn: dict[tuple[GroupKey, str], tuple[int, int]] = {}
        #: background CI / drift refreshes (``score_ci_background``): key → (future, started at,
        #: window start)
        self._ci_jobs: dict = {}
        #: finished refreshes collected by a cycle that has not published yet: key → (score or
        #: drift, started at, window start, latest trial end ns, digest)
        self._ci_unpublished: dict = {}
        self._ci_pool: concurrent.futures.ThreadPoolExecutor | None = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="relyscope-ci")
            if settings.score_ci_background and settings.incremental_scoring else None)
        #: background consistency checks: their own thread, so a check runs as soon as a cycle
        #: ends instead of queueing behind refreshes (a read after the next sync has no verdict)
        self._check_pool: concurrent.futures.ThreadPoolExecutor | None = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="relyscope-check")
            if self._ci_pool is not None else None)
        #: background refreshes published by the last rescore, and the seconds they took
        self.last_background = (0, 0.0)
        self._checked_at: dict[tuple[GroupKey, str], float] = {}
        self._review_dirty: set[GroupKey] = set()  # changed since their report sections were made
        self._check_credit = 0.0
        self._check_clock = 0.0
        #: background consistency checks: (group, window) → (future of a bool (agreed) or None
        #: (a sync came between the snapshot and the read: no verdict), submitted at)
        self._check_jobs: dict[tuple[GroupKey, str], tuple[concurrent.futures.Future, float]] = {}
        #: windows a background check found different from ClickHouse: checked again (and
        #: reloaded) inside the next cycles until a re-check succeeds
        self._recheck: set[tuple[GroupKey, str]] = set()
        #: (group, window) → checks in a row that gave no verdict (the next one runs in the cycle)
        self._check_skips: dict[tuple[GroupKey, str], int] = {}
        self._drift_ref = parse_windows(settings.drift_reference)[0][1]
        #: the buckets the next cycle's window slides leave, read on the check thread after this
        #: cycle: (future of read_slides' answer or None, the plan, Rollup.syncs when planned)
        self._slide_job: tuple | None = None
        self._last_now: float | None = None  # the last cycle's clock (how far the next one is)
        #: window slides made from a read ahead instead of inside the cycle (for the benchmark)
        self.slides_read_ahead = 0

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
            if self.settings.incremental_scoring:  # only the rollup's sync empties it
                self._pending_traces.update(t.trace_id for t in trials)

    def outcome_posted(self, key_kind: str, key: str) -> None:
        """An outcome was stored for ``key`` (``key_kind`` ``trace`` or ``trial``): fold its trials
        in at the next cycle whatever the outcome's ``posted_at`` (a wall clock stepped back since
        the last outcome hides it from the rollup's watermark). Any thread."""
        if not self.settings.incremental_scoring:  # the batch scorer rereads every outcome
            return
        with self._score_lock:
            (self._pending_traces if key_kind == "trace" else self._pending_trials).add(key)

    def run(self) -> None:
        """The scorer thread's body: rescore every ``score_interval_s`` until ``stop`` is set."""
        try:
            self._score_loop()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the background CI thread (a refresh under way is abandoned, not waited for)."""
        self._closed = True
        for pool in (self._ci_pool, self._check_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    # ---- background CI refreshes ----------------------------------------------------------------
    def _wait_between_cycles(self) -> None:
        """Hold a background refresh until the cycle under way ends (at most one interval plus
        a minute, so a cycle that never ends does not stall refreshes for ever; at once on stop)."""
        limit = time.monotonic() + self.settings.score_interval_s + 60.0
        while not self._between_cycles.wait(0.2):
            if self._stop.is_set() or self._closed or time.monotonic() > limit:
                return

    def _ci_window_job(self, g: GroupKey, length: float | None, since: int, snap, measured: bool):
        self._wait_between_cycles()
        t0 = time.perf_counter()
        st = snap if snap is not None else self.rollup().window_stats(g, since, length)
        s = self.settings
        # a cycle that starts meanwhile gets the GIL back at the next chunk of replicates: the
        # time spent waiting is not work (excluded from the figure returned)
        with yielding(self._paused()):
            gs = score_stats(st, safety_measured=measured, n_boot=s.n_boot, seed=0, max_k=s.max_k)
        return gs, st.max_end_ns, stats_digest(st), time.perf_counter() - t0 - self._ci_waited

    def _ci_drift_job(self, g: GroupKey, now: float, measured: bool, members):
        self._wait_between_cycles()
        t0 = time.perf_counter()
        with yielding(self._paused()):
            d = self._drift(self.rollup(), g, now, measured, members)
        return d, time.perf_counter() - t0 - self._ci_waited

    def _paused(self):
        """The CI thread's hook between bootstrap chunks: wait out a cycle under way, adding the
        wait to ``_ci_waited`` (reset here: one job at a time runs on the single CI thread)."""
        self._ci_waited = 0.0

        def pause() -> None:
            if not self._between_cycles.is_set():
                w0 = time.perf_counter()
                self._wait_between_cycles()
                self._ci_waited += time.perf_counter() - w0
        return pause

    def _collect_ci_jobs(self, out: dict, drift: dict) -> list[dict]:
        """Publish the background refreshes that finished: each window's CI joins its published
        point estimates (and is kept for the next ones), drift replaces the group's. Returns the
        ``scores`` rows of refreshed primary windows. A failed refresh stays due (logged)."""
        rows: list[dict] = []
        n, secs = 0, 0.0
        for key, (fut, started, since) in list(self._ci_jobs.items()):
            if not fut.done():
                continue
            del self._ci_jobs[key]
            g, name = key
            try:
                res = fut.result()
            except Exception:  # noqa: BLE001 - e.g. the store went down: due again next cycle
                log.exception("background CI refresh of %s %s failed", g, name)
                self._ci_dirty.add(key)
                # the churn noted at submission is not a refresh: without this the retry waited
                # for another score_ci_min_change of changes (or score_ci_max_age_s)
                self._ci_churn.pop(key, None)
                continue
            n += 1
            self._ci_at[key] = started
            if name == "drift":
                d, took = res
                secs += took
                self._ci_unpublished[key] = (d, started, since, 0, None)
                continue
            gs, max_end_ns, digest, took = res
            secs += took
            self._ci_scores[key] = gs
            self._ci_unpublished[key] = (gs, started, since, max_end_ns, digest)
        # also those collected by a cycle that failed after (cleared once a cycle publishes)
        for (g, name), (res, started, since, max_end_ns, digest) in self._ci_unpublished.items():
            if name == "drift":
                drift[g] = res
                continue
            if g in out.get(name, {}):
                out[name][g] = _with_cis(out[name][g], res, self.settings.n_boot, started)
            if name == self.primary_window:
                rows += _window_rows(g, res, since, max_end_ns / 1e9 or started, self.settings.n_boot, name, digest)
        self.last_background = (n, secs)
        return rows

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
        return load_resolved(self.store, self.policy, judge=bool(self.settings.judge_url), **filters)

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
                if s.incremental_scoring:  # folded in by name: judged_at is a wall-clock stamp too
                    with self._score_lock:
                        self._pending_trials.add(t.trial_id)
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
            self._between_cycles.clear()
            started = time.monotonic()
            try:
                if self.settings.incremental_scoring:
                    out = self._rescore_incremental(all_groups)
                else:
                    out = self._rescore(all_groups)
                self.cycles_done += 1
                self.cycle_seconds.append(time.monotonic() - started)
                self.last_cycle_end = time.time()
                # what the cycles keep (windows, samples) leaves the collector's full scans
                memory.settle_gc_if_due(self.settings.gc_freeze_interval_s)
                return out
            finally:
                self._between_cycles.set()

    # ---- incremental scoring from the rollups -------------------------------------------------
    def rollup(self) -> Rollup:
        """The store's rollups (created on first use: the store may be down at start)."""
        if self._rollup is None:
            s = self.settings
            self._rollup = Rollup(self.store, self.policy, judge=bool(s.judge_url), traj_sample=s.traj_sample,
                                  minute_ttl_days=s.rollup_minute_ttl_days, hour_ttl_days=s.rollup_hour_ttl_days,
                                  traj_ttl_days=s.traj_sample_ttl_days)
        return self._rollup

    def live(self) -> LiveStats:
        """The in-memory window statistics (created with the rollups)."""
        if self._live is None:
            self._live = LiveStats(self.rollup(), [w for w in self.windows])
            self._live_gen = self.rollup().generation
        return self._live

    def _sync(self) -> None:
        """Fold the store's changes into the rollups; the contribution rows written (also those
        of a sync that failed part way: they are in ClickHouse) wait in ``_rows`` for the next
        rescore to fold them into the in-memory windows."""
        ru = self.rollup()
        with self._score_lock:
            pending, self._pending_traces = self._pending_traces, set()
            named, self._pending_trials = self._pending_trials, set()
        try:
            self._changed |= ru.sync(pending, named)
        except BaseException:
            with self._score_lock:
                self._pending_traces |= pending
                self._pending_trials |= named
            raise
        finally:
            self._rows += ru.rows
            ru.rows = []
            self._drain_facts(ru)
        for t in ru.undecided:
            self._undecided[t.trial_id] = t
            self._undecided.move_to_end(t.trial_id)
        while len(self._undecided) > 10_000:  # bounded: the oldest undecided are given up on
            self._undecided.popitem(last=False)
        ru.undecided = []

    def _refresh_set(self, groups: set[GroupKey], all_groups: bool, now: float) -> set:
        """The (group, window | 'drift') keys whose CIs are recomputed this cycle: every changed
        one never computed or (``all_groups``: also those with a background refresh pending;
        interval 0) all changed; else the stalest of those
        due (CI older than ``score_ci_interval_s``), at the rate that refreshes each once per
        interval (a credit of items × elapsed / interval, spent one refresh at a time)."""
        interval = self.settings.score_ci_interval_s
        if all_groups:  # a pending background refresh is superseded (its result is dropped)
            return {k for k in self._ci_dirty | set(self._ci_jobs) if k[0] in groups}
        cands = [k for k in self._ci_dirty if k[0] in groups and k not in self._ci_jobs]
        if interval <= 0:
            return set(cands)
        out = {k for k in cands if k not in self._ci_at}
        due = sorted((k for k in cands if k in self._ci_at and _due(self._ci_at[k], now, interval)
                      and self._changed_enough(k, now)), key=lambda k: self._ci_at[k])
        dt = max(0.0, now - self._ci_clock) if self._ci_clock else self.settings.score_interval_s
        self._ci_clock = now
        n_items = len(set(self._ci_at) | set(cands))
        self._ci_credit = min(self._ci_credit + n_items * dt / interval, float(max(1, len(due))))
        take = min(len(due), int(self._ci_credit))
        self._ci_credit -= take
        return out | set(due[:take])

    def _note_ci(self, key: tuple[GroupKey, str]) -> None:
        ws = self._live.find(*key) if self._live is not None else None
        if ws is not None:
            self._ci_churn[key] = (ws.churn, ws.trials())

    def _changed_enough(self, key: tuple[GroupKey, str], now: float) -> bool:
        """Whether a window whose CI is ``score_ci_interval_s`` old is due: at least
        ``score_ci_min_change`` of its trials (at the last refresh) changed since, or the CI is
        ``score_ci_max_age_s`` old. Drift, pooled 'other' groups and windows not in memory: yes."""
        then = self._ci_churn.get(key)
        ws = self._live.find(*key) if self._live is not None and key[1] != "drift" else None
        if then is None or ws is None:
            return True
        if ws.churn < then[0]:  # reloaded since: no record of what changed
            return True
        return (ws.churn - then[0] >= self.settings.score_ci_min_change * max(then[1], 1)
                or _due(self._ci_at[key], now, self.settings.score_ci_max_age_s))

    def _check_some(self, live: LiveStats, groups: set[GroupKey], now: float, background: bool = False) -> None:
        """The periodic consistency check: compare the stalest in-memory windows with the
        rollups (each at least every ``live_check_interval_s``, spread over the cycles).

        ``background`` (a check thread exists and the stage is open): the comparison runs on
        the check thread (:meth:`_check_job`) from a copy of the window's memory taken now, so the
        cycle pays the copy, not the ClickHouse read; a window it finds different is checked
        again — and reloaded — inside the next cycle. A window whose background check gave no
        verdict twice in a row is checked in the cycle."""
        self._collect_checks(live, now)
        keys = [(g, name) for g in live.groups() if g in groups for name, _ in live._windows_of(g)]
        if not keys:
            return
        dt = max(0.0, now - self._check_clock) if self._check_clock else self.settings.score_interval_s
        self._check_clock = now
        self._check_credit = min(self._check_credit + len(keys) * dt / self.settings.live_check_interval_s,
                                 float(len(keys)))
        keys.sort(key=lambda k: self._checked_at.get(k, 0.0))
        while self._check_credit >= 1 and keys:
            key = keys.pop(0)
            if key in self._check_jobs:
                continue
            self._check_credit -= 1
            g, name = key
            if background and self._check_skips.get(key, 0) < 2:
                ru = self.rollup()
                ws = live.window(g, name)
                self._check_jobs[key] = (self._check_pool.submit(
                    self._check_job, ru, g, ws.since, ws.length, ws.pooled, live.stats(g, name), ru.syncs), now)
            else:
                live.check(g, name, now)
                self._check_skips.pop(key, None)
            self._checked_at[key] = now

    def _check_job(self, ru: Rollup, g: GroupKey, since: int, length: float | None, pooled: bool,
                   mine: TaskStats, syncs: int) -> bool | None:
        """A background consistency check: ``mine`` (the window's memory when the cycle ended)
        against ClickHouse read under the rollup's lock, if no sync has run since (``syncs``, the
        rollup's :attr:`Rollup.syncs` then); None if one has (the two would not describe the same
        rows). Returns whether they agreed. Raises StoreUnavailable."""
        self._wait_between_cycles()
        with ru._lock:  # no sync can start during the read
            if ru.syncs != syncs:
                return None
            fresh = ru.window_stats(g, since, length)
        return same_stats(mine, fresh, pooled=pooled)

    def _collect_checks(self, live: LiveStats, now: float) -> None:
        """The background checks that finished: a difference is checked again (and the window
        reloaded) now; no verdict or a failure leaves the window due again, and gives back the
        check's share of the budget (``live_check_interval_s`` counts verdicts)."""
        for key, (fut, submitted) in list(self._check_jobs.items()):
            if not fut.done():
                continue
            del self._check_jobs[key]
            g, name = key
            try:
                ok = None if fut.cancelled() else fut.result()
            except Exception:  # noqa: BLE001 - e.g. the store went down: due again
                log.exception("background consistency check of %s %s failed", g, name)
                ok = None
            fresher = self._checked_at.get(key, 0.0) != submitted  # checked (or reloaded) since
            if ok is None:
                self._check_skips[key] = self._check_skips.get(key, 0) + 1
                if not fresher:
                    self._checked_at[key] = 0.0
                    self._check_credit += 1
                continue
            self._check_skips.pop(key, None)
            if not ok:
                log.info("background check of %s window %s found a difference: checking it again", g, name)
                self._recheck.add(key)
        for key in sorted(self._recheck):  # until a re-check succeeds (a failed read raises: kept)
            g, name = key
            if live.find(g, name) is not None:
                live.check(g, name, now)
                self._checked_at[key] = now
            self._recheck.discard(key)

    def _rescore_incremental(self, all_groups: bool) -> dict[GroupKey, GroupScore]:
        """Fold the changes since the last cycle into the rollups and into the in-memory window
        statistics (:mod:`relyscope.scoring.live`), then rescore each (group, window) whose
        statistics changed or whose window slid; an unchanged window is not recomputed.

        Windows of ``score_ci_every_cycle`` (default 5m, 1h) are scored with their bootstrap CIs
        from memory every cycle. The others (24h, 7d, all) get point estimates from memory every
        cycle, published with the CIs of their last refresh; a refresh (a ClickHouse read of the
        window, which is also a consistency check of the memory, then the bootstrap) comes at most
        every ``score_ci_interval_s`` per window, spread over the cycles (stalest first); drift
        (metrics.md §10) likewise. ``all_groups`` (start, flush, a posted outcome) refreshes every
        changed window's CI at once. Cost per cycle: the changed trials, the tasks of changed
        windows (× B for the every-cycle CIs), plus a share of the refreshes — never the history."""
        with self._score_lock:
            self._dirty_groups.clear()  # the rollup's watermarks find every change
        t_sync = time.perf_counter()
        syncs_before = self._rollup.syncs if self._rollup is not None else None
        self._sync()
        if self.settings.judge_url and self._undecided:
            pending = list(self._undecided.values())
            if self._judge(pending):
                self._sync()  # fold the verdicts in now
            for t in pending[: self.settings.judge_max_per_cycle]:
                self._undecided.pop(t.trial_id, None)
        ru = self.rollup()
        live = self.live()
        if ru.generation != self._live_gen:  # rebuilt: every in-memory window reloads
            live.drop()
            self._live_gen = ru.generation
        rows_in, self._rows = self._rows, []
        clk = time.perf_counter
        t0 = clk()
        self._slide_ahead(live, syncs_before)  # before apply: the read describes the memory until now
        live.apply(rows_in)
        ph = self.phase_s = {"sync": t0 - t_sync, "apply": clk() - t0}
        plan = self._plan(ru)  # published group → pooled (agent, version) members, or None
        changed_pub = {self._published_as(g) for g in self._changed}
        groups = set(plan) if all_groups or not self.window_scores else \
            (set(self.window_scores.get(self.primary_window, {})) | changed_pub) & set(plan)
        now = time.time()
        s = self.settings
        out = {name: dict(self.window_scores.get(name, {})) for name, _ in self.windows}
        drift = dict(self.drift)
        rows: list[dict] = self._collect_ci_jobs(out, drift)
        background = self._ci_pool is not None and not all_groups and not self._closed
        for g in list(live.groups()):
            if g not in plan or plan[g] is not None:
                live.drop(g)  # gone, or folded into 'other' (scored from ClickHouse)
        # 1. memory to now; which windows changed
        t0 = clk()
        todo: list[tuple[GroupKey, str, float | None]] = []
        changed_of: dict[GroupKey, bool] = {}
        for g in sorted(groups):
            if plan[g] is None and not live.loaded(g):
                live.load(g, now)
                for name, _ in live._windows_of(g):
                    self._checked_at[(g, name)] = now
        live.advance_all([g for g in sorted(groups) if plan[g] is None], now)
        for g in sorted(groups):
            members = plan[g]
            changed = changed_of[g] = g in changed_pub or g not in out.get(self.primary_window, {})
            wins = [("all", None)] if g[2] == "offline" else self.windows
            for name, length in wins:
                key = (g, name)
                if members is None:
                    ver = live.window(g, name).version
                    if ver == self._ver.get(key) and g in out[name]:
                        continue
                    self._ver[key] = ver
                elif not changed and self._scored_since.get(key) == window_start(now, length) and g in out[name]:
                    continue
                todo.append((g, name, length))
            if g[2] != "offline" and (changed or self._scored_since.get((g, "drift")) != window_start(now, 60)):
                self._ci_dirty.add((g, "drift"))
                self._scored_since[(g, "drift")] = window_start(now, 60)
        every = self._ci_every_cycle
        for g, name, _ in todo:
            if name not in every or plan[g] is not None:
                self._ci_dirty.add((g, name))
        ph["advance"] = clk() - t0
        # 2. which CIs are refreshed this cycle
        refresh = self._refresh_set(groups, all_groups, now)
        for key in refresh & set(self._ci_jobs):  # all_groups: computed now instead
            self._ci_jobs.pop(key)[0].cancel()
        self.last_refreshes = len(refresh)
        queued = {(g, name) for g, name, _ in todo}
        lengths = dict(self.windows) | {"all": None}
        for g, name in sorted(refresh):  # a stale CI of a window unchanged since: refresh it too
            if name != "drift" and (g, name) not in queued:
                todo.append((g, name, lengths[name]))
        # 3. score
        t0 = clk()
        ph["refresh"] = 0.0
        for g, name, length in todo:
            members = plan[g]
            measured = policy_for(self.policy, g[0]) is not None
            key = (g, name)
            since = window_start(now, length)
            self._scored_since[key] = since
            full = key in refresh or (members is None and name in every)
            t1 = clk()
            if background and key in refresh and members is None and name not in every and g[2] != "offline":
                # on the CI thread: a long window reads ClickHouse there; a minute-level one is
                # bootstrapped from a copy of its memory taken now
                if key not in self._ci_jobs:
                    self._note_ci(key)
                    snap = None if live.window(g, name).pooled else live.stats(g, name)
                    self._ci_jobs[key] = (self._ci_pool.submit(self._ci_window_job, g, length, since, snap, measured),
                                          now, since)
                self._ci_dirty.discard(key)
                full = False
            if members is not None or (full and name not in every):
                # pooled 'other' group, or a CI refresh: read the window from ClickHouse
                st = ru.window_stats(g, since, length, members=members)
                if members is None:
                    live.check(g, name, now, fresh=st)
                    self._checked_at[key] = now
            else:
                # a CI from memory digests the sample; point estimates need neither it nor the
                # per-task histogram
                st = live.stats(g, name, trajectories=full, points_only=not full)
            if full or members is not None:
                gs = score_stats(st, safety_measured=measured, n_boot=s.n_boot, seed=0, max_k=s.max_k)
                self._ci_at[key] = now
                self._note_ci(key)
                self._ci_dirty.discard(key)
                self._ci_scores[key] = gs
            else:
                gs = _with_cis(score_stats(st, safety_measured=measured, n_boot=0, seed=0, max_k=s.max_k),
                               self._ci_scores.get(key), s.n_boot, self._ci_at.get(key))
            targets = [n for n, _ in self.windows] if g[2] == "offline" else [name]
            for n in targets:
                out[n][g] = gs
            if (full or members is not None) and (name == self.primary_window or g[2] == "offline"):
                # window end: the latest trial end in it, so rescoring unchanged data
                # writes the same row (the scores table is a ReplacingMergeTree on it)
                rows += _window_rows(g, gs, since, st.max_end_ns / 1e9 or now, s.n_boot, name, stats_digest(st))
            if key in refresh:
                ph["refresh"] += clk() - t1
        ph["score"] = clk() - t0 - ph["refresh"]
        t0 = clk()
        for g in sorted(groups):
            key = (g, "drift")
            if g[2] != "offline" and key in refresh:
                measured = policy_for(self.policy, g[0]) is not None
                if background:
                    if key not in self._ci_jobs:
                        self._ci_jobs[key] = (self._ci_pool.submit(self._ci_drift_job, g, now, measured, plan[g]),
                                              now, 0)
                else:
                    drift[g] = self._drift(ru, g, now, measured, plan[g])
                    self._ci_at[key] = now
                self._ci_dirty.discard(key)
        ph["drift"] = clk() - t0
        t0 = clk()
        self._check_some(live, groups, now, background=background)
        ph["check"] = clk() - t0
        t0 = clk()
        # report sections: a changed group's are refreshed when new, on all_groups, else at most
        # one group per cycle (the stalest whose sections are _REVIEW_EVERY_S old): a review
        # aggregates the facts of _REVIEW_RECENT trials, more than a cycle's own work
        self._review_dirty |= {g for g in groups if changed_of[g] and plan[g] is None}
        self._review_dirty &= {g for g in plan if plan[g] is None}
        now_due = sorted((g for g in self._review_dirty if g in groups and (
            all_groups or g not in self._extras
            or _due(self._reviewed_at.get(g, 0.0), now, _REVIEW_EVERY_S))),
            key=lambda g: (g in self._extras, self._reviewed_at.get(g, 0.0)))
        if not all_groups:
            now_due = [g for g in now_due if g not in self._extras] or now_due[:1]
        self._forget_facts(plan)
        for g in now_due:
            self._extras[g] = self._review(g, now)
            self._reviewed_at[g] = now
            self._review_dirty.discard(g)
        for g in sorted(groups):
            members = plan[g]
            if members is not None:
                self._extras[g] = {"warnings": [
                    f"{len(members)} (agent, version) label sets beyond RELYSCOPE_MAX_LABEL_SETS="
                    f"{self.settings.max_label_sets} are scored together as agent=version='other'"
                    + (f"; {sum(_looks_like_repr(a) for a, _ in members)} of their agent names look like an "
                       "object's repr with a memory address (an instrumentation bug: pass the agent's name)"
                       if any(_looks_like_repr(a) for a, _ in members) else "")],
                    "folded_label_sets": len(members)}
        ph["review"] = clk() - t0
        for name in out:  # groups folded since they were published
            for g in [g for g in out[name] if g not in plan]:
                del out[name][g]
        for g in [g for g in drift if g not in plan]:  # gone or folded: a kept flag would fire for ever
            del drift[g]
        for d in (self._ci_scores, self._ci_at, self._ver, self._scored_since, self._checked_at, self._check_skips):
            for key in [k for k in d if k[0] not in plan]:
                del d[key]
        self._changed -= {g for g in self._changed if self._published_as(g) in groups}
        self.window_scores = out
        self.drift = drift
        self.scores = out.get(self.primary_window, {})  # one reference swap per dict
        self._ci_unpublished = {}
        try:
            self.store.insert_scores(rows)
        except StoreUnavailable as e:
            self._on_store_error(e)
        if background:  # a cycle of the loop (a flush's clock would make the next step's guess short)
            self._read_slides_ahead(live, ru, [g for g in live.groups() if plan.get(g, ()) is None], now)
            self._last_now = now
        return dict(self.scores)

    # ---- window slides read ahead -------------------------------------------------------------
    def _read_slides_ahead(self, live: LiveStats, ru: Rollup, groups: list[GroupKey], now: float) -> None:
        """Queue on the check thread the read of the buckets the windows of ``groups`` will leave
        by the next cycle (its clock guessed as far ahead as this one came after the last), so
        that cycle slides them without a ClickHouse read of its own (a slide read ~0.1–0.2 s at
        10⁶ stored trials: bench/README.md, issue 9)."""
        step = now - self._last_now if self._last_now is not None and now > self._last_now \
            else self.settings.score_interval_s
        plan = live.slide_plan(groups, now + step)
        if plan:
            self._slide_job = (self._check_pool.submit(self._slides_job, ru, live, plan, ru.syncs), plan, ru.syncs)

    def _slides_job(self, ru: Rollup, live: LiveStats, plan: list[tuple], syncs: int) -> list | None:
        """:meth:`LiveStats.read_slides` under the rollup's lock if no sync has run since the plan
        (``syncs``); None if one has (the memory and the read would not describe the same rows)."""
        self._wait_between_cycles()
        with ru._lock:
            if ru.syncs != syncs:
                return None
            return live.read_slides(plan)

    def _slide_ahead(self, live: LiveStats, syncs_before: int | None) -> None:
        """Make the slides the last cycle read ahead, if that read is done and no sync came
        between it and this cycle's (``syncs_before``: :attr:`Rollup.syncs` before this cycle
        synced); called before this cycle's rows are applied, so memory and read agree. Whatever
        it does not slide, :meth:`LiveStats.advance_all` does as before."""
        job, self._slide_job = self._slide_job, None
        if job is None:
            return
        fut, plan, syncs = job
        if syncs_before != syncs or not fut.done():
            fut.cancel()
            return
        try:
            gone = None if fut.cancelled() else fut.result()
        except Exception:  # noqa: BLE001 - e.g. the store went down: this cycle reads them itself
            log.exception("reading the next window slides ahead failed")
            return
        if gone is not None:
            self.slides_read_ahead += live.slide_from(plan, gone, time.time())

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
                        n_boot=self.settings.n_boot, seed=0, max_k=self.settings.max_k,
                        alert_level=self.settings.drift_alert_level, min_trials=self.settings.drift_min_trials)

    def _review(self, g: GroupKey, now: float) -> dict:
        """Report sections beyond the metrics (violations, attribution, control rates, worst
        tasks) from the group's ``review_recent`` (5 000) most recently stored trials (offline
        imports: all of them) — bounded by the traffic, not the history; refreshed at most every
        ``_REVIEW_EVERY_S`` per group. A live group's come from the facts kept in memory
        (:class:`_RecentFacts`: filled from the store on first use, then updated by each sync
        from the trials it re-resolved and graded), so a refresh costs the aggregation of
        ``review_recent`` small records, not a reload and regrade of the trials. Equal to
        :func:`relyscope.scorers.review.review_group` of
        ``Store.load_trials(most_recent=review_recent)`` resolved (tests/test_live_review.py)."""
        # the most recent runs stored, not the last hour by timestamp: backfilled or skewed runs
        # (old timestamps) must not vanish from the report's sections
        if g[2] == "offline":
            trials = self.rollup().resolve(self.store.load_trials(agent=g[0], version=g[1], run_kind=g[2]))
            return review_group(trials, policy_for(self.policy, g[0])).extras
        ru = self.rollup()
        if ru.generation != self._facts_gen:
            self._facts.clear()
            self._facts_gen = ru.generation
        rec = self._facts.get(g)
        if rec is None or rec.short(self.review_recent):
            rec = self._facts[g] = self._load_facts(g)
            ru.graded[g] = []
        return sections(rec.top(self.review_recent))

    def _load_facts(self, g: GroupKey) -> "_RecentFacts":
        """The facts of ``g``'s ``review_recent`` + 10 % most recently stored trials, from the
        store (what ``Store.load_trials(most_recent=…)`` selects: latest row per trial, no
        tombstones, by ``version_ns``), resolved and graded as the rollup's sync does."""
        n = self.review_recent + _slack(self.review_recent)
        vers = {r[0]: int(r[1]) for r in self.store.query(
            "SELECT trial_id, version_ns FROM {db}.trials FINAL WHERE agent = %(a)s AND version = %(v)s "
            "AND run_kind = %(k)s AND status != 'superseded' ORDER BY version_ns DESC LIMIT %(n)s",
            {"a": g[0], "v": g[1], "k": g[2], "n": n})}
        rec = _RecentFacts(complete=len(vers) < n)
        if not vers:
            return rec
        pol = policy_for(self.policy, g[0])
        # in pages (whole trials, steps included, are transient), and packed only once every page
        # is read: kept records allocated between transient ones would pin the heap's pages
        ids, got = sorted(vers), []
        for i in range(0, len(ids), _FILL_PAGE):
            loaded = [t for t in self.store.load_trials(agent=g[0], version=g[1], run_kind=g[2],
                                                        trial_ids=ids[i:i + _FILL_PAGE]) if t.trial_id in vers]
            resolved = {t.trial_id: t for t in self.rollup().resolve(loaded)}
            # a trial re-finalized since the first read: its next sync re-puts it
            got += [(t.trial_id, trial_facts(r, grade_trial(r, pol)) if (r := resolved.get(t.trial_id)) else None)
                    for t in loaded]
            del loaded, resolved
        for tid, facts in got:
            rec.put(tid, vers[tid], facts)
        return rec

    def _drain_facts(self, ru: Rollup) -> None:
        """Fold what the last sync graded (:attr:`Rollup.graded`) into the kept facts."""
        if ru.generation != self._facts_gen:  # rebuilt: every group reloads on its next review
            self._facts.clear()
            self._facts_gen = ru.generation
        cap = self.review_recent + _slack(self.review_recent)
        for g, events in list(ru.graded.items()):
            rec = self._facts.get(g)
            if rec is None:
                del ru.graded[g]
                continue
            if events:
                ru.graded[g] = []
                for tid, vns, facts in events:
                    if vns == 0:
                        rec.drop(tid)
                    else:
                        rec.put(tid, vns, facts)
                rec.trim(cap)

    def _forget_facts(self, plan: dict) -> None:
        """Drop the kept facts of groups gone or pooled into 'other' (not reviewed as such)."""
        for g in [g for g in self._facts if plan.get(g, ()) is not None]:
            del self._facts[g]
            self.rollup().graded.pop(g, None)

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


def _slack(n: int) -> int:
    """Facts kept beyond the ``n`` reviewed: retractions (re-keyed, tombstoned trials) eat into it
    before a group must reload from the store."""
    return max(16, n // 10)


class _RecentFacts:
    """The :class:`TrialFacts` of one live group's most recently stored trials: trial id → a
    packed record (:func:`_pack`: ``version_ns`` of the trial's latest stored row, then its
    facts, or none for a stored trial the outcome resolution leaves out). Invariant: it holds
    every stored trial of the group whose version is above ``floor`` (``complete``: every one),
    so its ``n`` highest versions are the group's ``n`` most recently stored trials while at
    least ``n`` are held (:meth:`short` says when not). Memory: :meth:`trim` keeps at most
    1.1 × (``n`` + :func:`_slack`) records, ~250 B each (bench/bench_review_facts.py)."""

    __slots__ = ("items", "floor", "complete")

    def __init__(self, *, complete: bool) -> None:
        self.items: dict[str, bytes] = {}
        self.floor = 0
        self.complete = complete

    def put(self, tid: str, vns: int | None, facts: TrialFacts | None) -> None:
        """``vns`` None: the trial's stored row did not change (only its outcome): updated if
        held, else it is below the kept range (ignored)."""
        cur = self.items.get(tid)
        if cur is None and (vns is None or (not self.complete and vns <= self.floor)):
            return
        self.items[tid] = _pack(max(vns or 0, _VER.unpack_from(cur)[0] if cur else 0), facts)

    def drop(self, tid: str) -> None:
        self.items.pop(tid, None)

    def trim(self, cap: int) -> None:
        """Keep the ``cap`` most recent records once more than ``cap`` + 10 % are held: a sort of
        every record per group every cycle (to drop the ~100 a cycle adds) was ~3 % of the sync."""
        if len(self.items) <= cap + max(16, cap // 10):
            return
        order = sorted(self.items, key=lambda tid: _VER.unpack_from(self.items[tid])[0], reverse=True)
        for tid in order[cap:]:
            self.floor = max(self.floor, _VER.unpack_from(self.items.pop(tid))[0])
        self.complete = False

    def short(self, n: int) -> bool:
        """Fewer than ``n`` held although older trials exist: reload."""
        return not self.complete and len(self.items) < n

    def top(self, n: int) -> list[TrialFacts]:
        """Facts of the ``n`` most recently stored trials, by trial id (the store's order)."""
        tids = list(self.items)
        if len(tids) > n:
            tids = heapq.nlargest(n, tids, key=lambda tid: _VER.unpack_from(self.items[tid])[0])
        out = []
        for tid in sorted(tids):
            f = _unpack(tid, self.items[tid])
            if f is not None:
                out.append(f)
        return out


_VER = struct.Struct(">Q")
assert TrialFacts._fields[:2] == ("trial_id", "trace_id")


def _pack(vns: int, facts: TrialFacts | None) -> bytes:
    """``vns`` (8 bytes) + the facts' fields but the trial id (the map's key) as a ``marshal``
    tuple; the trace id as its length when the trial id starts with it (the trajectory builder's
    ``<trace id>:<root span id>``). ~2.5× smaller than the object with its strings."""
    if facts is None:
        return _VER.pack(vns)
    trace = facts.trace_id
    return _VER.pack(vns) + marshal.dumps(
        (len(trace) if facts.trial_id.startswith(trace) else trace,
         *facts[2:]))


def _unpack(tid: str, blob: bytes) -> TrialFacts | None:
    if len(blob) == _VER.size:
        return None
    v = marshal.loads(memoryview(blob)[_VER.size:])
    return TrialFacts(tid, tid[:v[0]] if isinstance(v[0], int) else v[0], *v[1:])


def _due(stamp: float, now: float, every_s: float) -> bool:
    """Whether something done at ``stamp`` (Unix s) is due again at ``now``: ``every_s`` passed, or
    the stamp lies after now (the wall clock stepped back since: its age is unknown)."""
    return not 0 <= now - stamp < every_s


def _with_cis(point: GroupScore, ci_from: GroupScore | None, n_boot: int, as_of: float | None = None) -> GroupScore:
    """Point estimates ``point`` (scored with n_boot = 0) published with the intervals of the
    last CI refresh ``ci_from`` (a metric it lacks, or one undefined now, has none), computed on
    the window's state at ``as_of`` (unix seconds). A metric whose value has changed since is
    marked ``ci_stale``, and the score carries ``ci_as_of`` / ``ci_trials`` when any is (or when
    the trial count changed), so reports can say the interval is older than the value; with no
    refresh yet (``ci_from`` None) it is marked ``ci_pending``."""
    import dataclasses as _dc

    prev = ci_from.metrics if ci_from is not None else {}
    metrics = {}
    any_stale = False
    for k, mv in point.metrics.items():
        old = prev.get(k)
        ci = old.ci if old is not None and not math.isnan(mv.value) else None
        stale = ci is not None and (math.isnan(old.value) or abs(old.value - mv.value) > 1e-12)
        any_stale |= stale
        metrics[k] = _dc.replace(mv, ci=ci, ci_stale=stale)
    older = ci_from is not None and (any_stale or ci_from.trials != point.trials)
    return _dc.replace(point, metrics=metrics, n_boot=n_boot,
                       ci_as_of=as_of if older else None, ci_trials=ci_from.trials if older else None,
                       ci_pending=ci_from is None and n_boot > 0)


def grade_rows_of(group: GroupKey, rv: GroupReview) -> list[dict]:
    """Rows for the ``grades`` table: one per trial, the grade as JSON (orjson: dataclasses as
    objects, enums by value, NaN as null), versioned by time."""
    import orjson

    from relyscope.semconv import FORMULA_SET

    now = time.time_ns()
    out = []
    for i, (tid, g) in enumerate(sorted(rv.grades.items())):
        out.append({"trial_id": tid, "agent": group[0], "version": group[1], "run_kind": group[2],
                    "grade": orjson.dumps(g, default=str, option=orjson.OPT_NON_STR_KEYS).decode(),
                    "severity": float(g.severity),
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
