"""Per-task rollups in ClickHouse: what the live scorer reads instead of the trial history.

Data flow (all tables in the store's database; DDL in :data:`ROLLUP_SCHEMA`):

- ``contrib_log`` (engine ``Null``: nothing is kept) receives one row per trial change:
  ``+contribution`` of the trial's new state and ``−contribution`` of the state it replaces
  (:func:`relyscope.scoring.stats.contribution`; sums are integers except a few float sums, so a
  retraction cancels exactly for counts and resources), all changes of one sync batch in one INSERT.
- Materialized views fan each row out to three resolutions (``level`` 1: minute buckets, 2: hour
  buckets, 3: one all-time bucket) into ``task_stats`` and ``conf_stats``
  (``SummingMergeTree``, ordered by group, level, bucket, task). A window's per-task statistics
  are ``sum(...) GROUP BY task_id`` over its buckets at the coarsest level that fits it, so a query
  reads at most ~360 rows per task whatever the history (:func:`level_for`).
- ``contrib`` (``ReplacingMergeTree``, keyed by trial id and group — the store's key of a trial:
  one trial id may be a trial of several groups —, fed by a view) holds each trial's current
  contribution: what to retract when the trial changes.
- ``traj_sample`` (``ReplacingMergeTree``, fed by a view) holds the action sequences of successful nominal valid
  runs for C_traj_d / C_traj_s; a window reads the most recent ``M`` per task (``LIMIT M BY``).
- ``scoring_state`` holds the watermarks (trials ``version_ns``, outcome ``posted_at``, judgement
  ``judged_at``) up to which changes have been folded in, so a restart continues where it stopped.

Outcome resolution (metrics.md §6) happens *before* rolling up: a trial's contribution is made from
the trial with its outcome resolved and its grade (§7 validity, §8 severity). Every input that can
change a resolved trial is watched: a new or re-finalized trial (a newer row in ``trials``; a
re-keyed one leaves a ``superseded`` tombstone, whose old id is then retracted), a posted outcome
(``outcomes``, by trial or trace id), a judge verdict (``judgements``). Each change re-resolves only
the trials it names and replaces their contribution (−old, +new). Watermarks are read with an
overlap (:data:`OVERLAP_NS`) because concurrent writers may commit slightly out of time order;
re-folding a trial whose contribution did not change writes nothing.

Cost of :meth:`Rollup.sync`: proportional to the trials changed since the last sync (plus the
overlap), never to the history. Raises :class:`relyscope.store.StoreUnavailable`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Final, Iterable

import numpy as np

from relyscope.model import Evaluation, Trial
from relyscope.scorers.graders import grade_trial
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.policy import Policy
from relyscope.scorers.replay_outcome import is_sandbox_miss
from relyscope.scorers.review import GroupReview, policy_for, trial_facts
from relyscope.shadow.grading import rekeyed_of, resolve_replays
from relyscope.scoring.stats import SUM_COLUMNS, Contribution, TaskStats, contribution
from relyscope.store import Store

__all__ = ["Rollup", "ROLLUP_SCHEMA", "LEVELS", "level_for", "OVERLAP_NS", "GroupKey"]

log = logging.getLogger("relyscope.scoring.rollup")

GroupKey = tuple[str, str, str]

#: level → bucket size in seconds (0: one all-time bucket at the epoch).
LEVELS: Final = {1: 60, 2: 3600, 3: 0}
#: Re-read this much before each watermark (writers may commit slightly out of time order).
OVERLAP_NS: Final = 30 * 10**9
_MAX_BUCKETS: Final = 360  # a window uses the finest level with at most this many buckets
_BATCH: Final = 5000  # trials re-resolved per store round trip
#: the four views fed by one ``contrib_log`` insert run side by side (ClickHouse's default is one
#: after the other); on 2 cores the insert took ~20 % less (bench/README.md, bench_live_scoring)
_PARALLEL_VIEWS: Final = {"parallel_view_processing": 1}
#: rows per primary-index granule of the bucket rollups (ClickHouse's default is 8192): a sliding
#: window's step reads the one bucket it left, ~100 rows per group, but every column (~0.7 KiB a
#: row: the Int256 sums of squares) of each granule that bucket touches — ~15 granules of 8192 at
#: 1 000 000 stored trials. At 1024 a one-minute read took 68 ms instead of 84 ms (one merged
#: part, bench/README.md) for a primary index 8× larger (~1 000 marks per million rows)
_GRANULE: Final = 1024
#: compressed blocks of the bucket rollups: one granule each (1024 rows of an 8-byte column are
#: 8 KiB), where ClickHouse's default (a block once 64 KiB are written) packs 8 granules into one
#: block, all decompressed to read one of them. A window's slide reads one bucket per group from
#: each part that holds it: at 8 parts a one-minute read of 10 groups took 47 ms instead of 78 ms
#: (bench/README.md, issue 9) for ~5 % more on disk. Set on stores made before too (:func:`_small_blocks`:
#: parts written from then on, merges included)
_BLOCKS: Final = "min_compress_block_size = 4096, max_compress_block_size = 65536"

_SUMS = ", ".join(f"{name} {typ}" for name, typ in SUM_COLUMNS)
_SUM_NAMES = [name for name, _ in SUM_COLUMNS]
_LEVEL_ARRAY = ("[(toUInt8(1), toStartOfInterval(end_time, INTERVAL 60 SECOND)), "
                "(toUInt8(2), toStartOfInterval(end_time, INTERVAL 3600 SECOND)), "
                "(toUInt8(3), toDateTime(0, 'UTC'))]")

#: the group of a ``contrib`` row as one string (a quoted tuple: injective, whatever the names hold)
_GKEY: Final = "toString(tuple(agent, version, run_kind))"

_LOG_COLS: Final = ["agent", "version", "run_kind", "trial_id", "task_id", "end_time", *_SUM_NAMES,
                    "q", "y", "actions", "traj", "sign", "version_ns"]

ROLLUP_SCHEMA: Final = [
    # one row per change of a trial's contribution: sign −1 (sums already negated) retracts the
    # old state, +1 adds the new one; one INSERT feeds every view below
    f"""CREATE TABLE IF NOT EXISTS {{db}}.contrib_log (
        agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
        trial_id String, task_id String, end_time DateTime64(9, 'UTC'), {_SUMS},
        q Nullable(Float64), y Int8, actions Array(String), traj Bool, sign Int8, version_ns UInt64
    ) ENGINE = Null""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.task_stats (
        agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
        level UInt8, bucket DateTime('UTC'), task_id String, {_SUMS},
        max_end SimpleAggregateFunction(max, DateTime64(9, 'UTC'))
    ) ENGINE = SummingMergeTree
    ORDER BY (agent, version, run_kind, level, bucket, task_id)
    SETTINGS index_granularity = {_GRANULE}, {_BLOCKS}""",
    f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.task_stats_mv TO {{db}}.task_stats AS
        SELECT agent, version, run_kind, lv.1 AS level, lv.2 AS bucket, task_id, {", ".join(_SUM_NAMES)},
               end_time AS max_end
        FROM {{db}}.contrib_log ARRAY JOIN {_LEVEL_ARRAY} AS lv""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.conf_stats (
        agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
        level UInt8, bucket DateTime('UTC'), task_id String, q Float64, pos Int64, neg Int64
    ) ENGINE = SummingMergeTree
    ORDER BY (agent, version, run_kind, level, bucket, task_id, q)
    SETTINGS index_granularity = {_GRANULE}, {_BLOCKS}""",
    f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.conf_stats_mv TO {{db}}.conf_stats AS
        SELECT agent, version, run_kind, lv.1 AS level, lv.2 AS bucket, task_id, assumeNotNull(q) AS q,
               toInt64(if(y = 1, sign, 0)) AS pos, toInt64(if(y = 0, sign, 0)) AS neg
        FROM {{db}}.contrib_log ARRAY JOIN {_LEVEL_ARRAY} AS lv WHERE q IS NOT NULL""",
    """CREATE TABLE IF NOT EXISTS {db}.traj_sample (
        agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
        hour DateTime('UTC'), task_id String, trial_id String, end_time DateTime64(9, 'UTC'),
        actions Array(String), alive Bool, version_ns UInt64
    ) ENGINE = ReplacingMergeTree(version_ns)
    ORDER BY (agent, version, run_kind, hour, task_id, trial_id)""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.traj_sample_mv TO {db}.traj_sample AS
        SELECT agent, version, run_kind, toStartOfHour(end_time) AS hour, task_id, trial_id, end_time,
               actions, sign > 0 AS alive, version_ns
        FROM {db}.contrib_log WHERE traj""",
    # the current contribution of each trial (what to retract next time); a retraction without a
    # new state leaves a row with alive = 0
    f"""CREATE TABLE IF NOT EXISTS {{db}}.contrib (
        agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
        trial_id String, task_id String, end_time DateTime64(9, 'UTC'), {_SUMS},
        q Nullable(Float64), y Int8, actions Array(String), traj Bool, alive Bool, version_ns UInt64,
        gkey String
    ) ENGINE = ReplacingMergeTree(version_ns)
    ORDER BY (trial_id, gkey)""",
    f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.contrib_mv TO {{db}}.contrib AS
        SELECT agent, version, run_kind, trial_id, task_id, end_time, {", ".join(_SUM_NAMES)},
               q, y, actions, traj, sign > 0 AS alive, version_ns, {_GKEY} AS gkey
        FROM {{db}}.contrib_log""",
    # the rollup looks trials up by trace id and by version: skip indexes keep these lookups
    # from scanning the trials table (parts written before the index existed are still scanned)
    "ALTER TABLE {db}.trials ADD INDEX IF NOT EXISTS rs_trace_bf trace_id TYPE bloom_filter GRANULARITY 1",
    "ALTER TABLE {db}.trials ADD INDEX IF NOT EXISTS rs_version_mm version_ns TYPE minmax GRANULARITY 1",
    """CREATE TABLE IF NOT EXISTS {db}.scoring_state (
        name String, value Int64, updated_ns UInt64
    ) ENGINE = ReplacingMergeTree(updated_ns) ORDER BY name""",
]

#: Tables holding rollup data (emptied by :meth:`Rollup.rebuild`).
ROLLUP_TABLES: Final = ("task_stats", "conf_stats", "traj_sample", "contrib", "scoring_state")


#: the longest span read at minute buckets: windows up to 6 h, and drift's 1 h + 24 h
_MINUTE_LEVEL_MAX_S: Final = 25 * 3600


def cluster_schema(cluster: str, *, zk_path: str = "/clickhouse/tables/{shard}/{database}/{table}") -> list[str]:
    """The rollups' part of :func:`relyscope.store.schema.cluster_schema` (NOT run against a
    server here; chDB has no clusters): every statement ``ON CLUSTER``; stored tables on
    ``Replicated*MergeTree`` (with ``zk_path`` and ``{replica}`` macros); ``contrib_log`` stays
    ``Null`` on every node with its views, and a ``contrib_log_dist`` Distributed table sharded by
    trial id takes the inserts so both rows of a change (−old, +new) and a trial's ``contrib`` rows
    land on one shard; reads go through ``<table>_dist`` Distributed tables (the per-task sums add
    up across shards). :class:`Rollup` itself still reads and writes the local names."""
    from relyscope.store.schema import Retention
    from relyscope.store.schema import cluster_schema as full

    mine = {re.match(r"\s*CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS \{db\}\.(\w+)", d).group(1)
            for d in ROLLUP_SCHEMA if d.lstrip().startswith("CREATE")}
    mine |= {f"{t}_dist" for t in mine}
    return [d for d in full(cluster, Retention(), zk_path=zk_path)
            if (m := re.match(r"\s*CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS \{db\}\.(\w+)", d))
            and m.group(1) in mine]


def level_for(window_s: float | None) -> tuple[int, int]:
    """(level, bucket seconds) a window of ``window_s`` seconds is read at: the finest with at
    most 360 buckets; ``None`` (all time) → level 3."""
    if window_s is None:
        return 3, 0
    for level, size in LEVELS.items():
        if size and window_s / size <= _MAX_BUCKETS:
            return level, size
    return 2, LEVELS[2]


def window_start(now_s: float, window_s: float | None) -> int:
    """Start (Unix seconds) of the window ending at ``now_s``: ``now − window`` rounded *down* to
    the bucket size of its level, so the window covers whole buckets (it may reach up to one bucket
    further back than ``window_s``). 0 for all time."""
    level, size = level_for(window_s)
    if not size:
        return 0
    return int((now_s - window_s) // size) * size


@dataclass(frozen=True, slots=True)
class _Current:
    task_id: str
    end_ns: int
    ctb: Contribution


class Rollup:
    """Keeps the rollups of one store up to date and reads window statistics from them.

    ``policy``: the sidecar's safety policy (applied per agent as the batch scorer does; None:
    safety not measured). ``judge``: whether LLM-judge verdicts count (a judge is configured).
    ``traj_sample``: M, the most recent successful runs per task used for C_traj (default 50).
    ``write_grades``: also store each changed trial's grade in the ``grades`` table.
    Retention (:func:`relyscope.store.schema.rollup_ttls`, reconciled at every start so a changed
    setting takes effect, altered only where it differs):
    minute buckets are kept ``minute_ttl_days``, hour buckets ``hour_ttl_days``, the all-time
    bucket and the current contributions for ever, trajectory-sample rows ``traj_ttl_days``.
    After the first successful :meth:`sync` (every trial stored until then is rolled up) it
    applies the store's own retention to the tables the rollups are made from
    (:meth:`relyscope.store.Store.apply_retention`; nothing when the store has none).
    Raises ValueError when the minute buckets would expire before the windows that read them.
    Thread-safety: ``sync`` is serialized; reads may run beside it.
    """

    def __init__(self, store: Store, policy: Policy | None = None, *, judge: bool = False,
                 traj_sample: int = 50, write_grades: bool = True, minute_ttl_days: float = 2,
                 hour_ttl_days: float = 400, traj_ttl_days: float = 30):
        from relyscope.store.schema import check_ttl_days

        for name, v in (("minute_ttl_days", minute_ttl_days), ("hour_ttl_days", hour_ttl_days),
                        ("traj_ttl_days", traj_ttl_days)):
            check_ttl_days(name, v, nullable=False)  # finite, ≤ MAX_TTL_DAYS: DateTime + interval wraps past 2106
        if minute_ttl_days * 86400 < _MINUTE_LEVEL_MAX_S or hour_ttl_days <= 0 or traj_ttl_days <= 0:
            raise ValueError(f"minute rollups must be kept at least {_MINUTE_LEVEL_MAX_S / 86400:.2f} days "
                             "(the longest window read at minute buckets) and the others > 0 days")
        if traj_sample < 2:
            raise ValueError("traj_sample must be >= 2 (C_traj needs two runs of a task)")
        self.store = store
        self.policy = policy
        self.judge = judge
        self.traj_sample = traj_sample
        self.write_grades = write_grades
        self._seen: dict[tuple, int] = {}  # (trial id, group) → version folded, within the overlap
        self._ledger_seen: dict[str, int] = {}  # production trial id → latest ledger version checked
        self._retention_applied = False  # the store's TTLs of trials & co. (after the first sync)
        self._last_stamp: int | None = None  # the last version stamp written (_stamp)
        self._lock = threading.Lock()
        #: syncs (and rebuilds) begun: a reader holding ``_lock`` compares it with the count
        #: it saw earlier to know whether the rollups may have changed since
        self.syncs = 0
        #: complete trials left with outcome unknown by the last syncs (for an LLM judge); the
        #: caller empties it
        self.undecided: list[Trial] = []
        #: every contribution row written to ``contrib_log`` by the syncs since the caller last
        #: emptied it (layout :data:`_LOG_COLS`; a row is appended once ClickHouse took its
        #: insert, so a sync that fails later still reports what it wrote) — what the in-memory
        #: windows (:mod:`relyscope.scoring.live`) are updated from
        self.rows: list[list] = []
        #: bumped by :meth:`rebuild` (in-memory copies of the rollups must reload)
        self.generation = 0
        #: group → what the syncs graded in it since the caller last emptied its list, for the
        #: groups the caller registered (set a key to ``[]``; nothing is kept for the others, so a
        #: first sync or a rebuild of the whole history holds no list of it): per re-resolved
        #: trial ``(trial_id, version_ns, TrialFacts)`` — ``version_ns`` of its latest stored row
        #: if that row is within this sync's read (new or re-finalized), else None (only its
        #: outcome changed) —; ``(trial_id, version_ns, None)`` for a stored trial the resolution
        #: leaves out (a cut-off replay attempt: still among the most recently stored, as
        #: :meth:`relyscope.store.Store.load_trials` ``most_recent`` counts it); per trial id
        #: retracted (tombstoned, gone, moved to another group) ``(trial_id, 0, None)`` (to every
        #: registered group: a tombstone names no group). What the scoring stage keeps its report
        #: sections up to date from (:func:`relyscope.scorers.review.sections`).
        self.graded: dict[GroupKey, list[tuple[str, int | None, object]]] = {}
        self._versions: dict[str, int] = {}  # trial id → latest version_ns read by this sync
        _key_contrib_by_group(store)  # before the views' DDL: ClickHouse checks a view's query
        for ddl in ROLLUP_SCHEMA:     # against its target even when the view exists
            _command(store, ddl)
        _widen_sum_columns(store)
        _small_blocks(store)
        # only where the TTL differs: a MODIFY TTL rewrites the table's parts on a server
        from relyscope.store.schema import apply_retention, rollup_ttls

        with store._lock:
            apply_retention(store._ready_client(), store.db,
                            rollup_ttls(minute_ttl_days, hour_ttl_days, traj_ttl_days))

    # ---- watermarks -----------------------------------------------------------------------------
    def _state(self) -> dict[str, int]:
        rows = self.store.query("SELECT name, value FROM {db}.scoring_state FINAL")
        return {r[0]: int(r[1]) for r in rows}

    def _save_state(self, st: dict[str, int]) -> None:
        now = self._stamp(len(st))
        self.store._insert("scoring_state", [[k, v, now + i] for i, (k, v) in enumerate(st.items())],
                           ["name", "value", "updated_ns"])

    def _stamp(self, n: int) -> int:
        """The first of ``n`` consecutive version stamps for ``contrib_log`` (→ ``contrib``,
        ``traj_sample``) and ``scoring_state`` rows: the wall clock, but above every stamp written
        before — by this process, or found ahead of the clock at the first call. Wall-clock
        stamps went back with the clock: a trial's new contribution then had a lower version than
        the one it replaced, ``contrib`` kept the old one, and the trial's next change retracted a
        state already retracted (sums wrong from then on); saved watermarks lost to older ones."""
        now = time.time_ns()
        if self._last_stamp is None:
            self._last_stamp = max(int(r[0] or 0) for r in self.store.query(
                "SELECT max(version_ns) FROM {db}.contrib WHERE version_ns > %(now)s UNION ALL "
                "SELECT max(updated_ns) FROM {db}.scoring_state WHERE updated_ns > %(now)s", {"now": now}))
        base = max(now, self._last_stamp + 1)
        self._last_stamp = base + max(n, 1) - 1
        return base

    # ---- sync -----------------------------------------------------------------------------------
    def sync(self, trace_ids: Iterable[str] = (), trial_ids: Iterable[str] = ()) -> set[GroupKey]:
        """Fold every change since the last sync into the rollups, and the trials of
        ``trace_ids`` and ``trial_ids`` (known to have changed, e.g. told by the worker, the
        outcome API or the judge) whatever their versions and stamps: the watermarks follow the
        writers' wall clocks, and a clock that stepped back hides what was written after the step
        from them. Returns the groups whose statistics changed. Raises StoreUnavailable (nothing
        is lost: the watermarks advance only after the rollups are written)."""
        told = set(trace_ids)
        with self._lock:
            self.syncs += 1  # before any write: a reader holding the lock sees whether one began
            st = self._state()
            wt, wo, wj = st.get("trials_wm", 0), st.get("outcomes_wm", 0), st.get("judge_wm", 0)
            wl = st.get("ledger_wm", 0)
            q = self.store.query
            # the shadow ledger decides which replay attempt of a trial counts (a re-run after a
            # crash or a stop gets a new trace id): production trials whose replays it changed
            lrows = q("SELECT shadow_of, max(version_ns) FROM {db}.shadow_replays WHERE version_ns > %(w)s "
                      "GROUP BY shadow_of", {"w": max(0, wl - OVERLAP_NS)})
            ledger_prods = {r[0] for r in lrows if self._ledger_seen.get(r[0]) != int(r[1])}
            new_wl = max([wl] + [int(r[1]) for r in lrows])
            rows = q("SELECT trial_id, trace_id, version_ns, agent, version, run_kind, shadow_of FROM {db}.trials "
                     "WHERE version_ns > %(w)s", {"w": max(0, wt - OVERLAP_NS)})
            # rows of the overlap already folded by this process need no second pass
            fresh = [r for r in rows if self._seen.get((r[0], *r[3:6])) != int(r[2])]
            self._versions = {}
            for r in rows:  # the latest row of each trial read (for the report sections' order)
                self._versions[r[0]] = max(int(r[2]), self._versions.get(r[0], 0))
            trace_ids = {r[1] for r in fresh} | told
            new_wt = max([wt] + [int(r[2]) for r in rows])
            orows = q("SELECT key_kind, key, toUnixTimestamp64Nano(posted_at) FROM {db}.outcomes "
                      "WHERE posted_at > fromUnixTimestamp64Nano(%(w)s)", {"w": max(0, wo - OVERLAP_NS)})
            new_wo = max([wo] + [int(r[2]) for r in orows])
            trace_ids |= {r[1] for r in orows if r[0] == "trace"}
            by_trial = {r[1] for r in orows if r[0] == "trial"} | set(trial_ids)
            new_wj = wj
            if self.judge:
                jrows = q("SELECT trial_id, toUnixTimestamp64Milli(judged_at) FROM {db}.judgements "
                          "WHERE judged_at > fromUnixTimestamp64Milli(%(w)s)", {"w": max(0, wj - OVERLAP_NS // 10**6)})
                by_trial |= {r[0] for r in jrows}
                new_wj = max([wj] + [int(r[1]) for r in jrows])
            named = {r[1] for r in orows if r[0] == "trace"}
            if by_trial:
                named |= {r[0] for r in q("SELECT DISTINCT trace_id FROM {db}.trials WHERE trial_id IN %(ids)s",
                                          {"ids": sorted(by_trial)})}
                trace_ids |= named
            # traces whose rows are all recent and that nothing else names (no posted outcome,
            # verdict or replay): loaded from the recent rows alone (no FINAL over the table)
            wmin = max(0, wt - OVERLAP_NS)
            fast: dict[str, set[str]] = {}
            for r in rows:  # trace → its recent (trial id, group) keys
                fast.setdefault(r[1], set()).add((r[0], (r[3], r[4], r[5])))
            slow = (trace_ids - set(fast)) | (named & set(fast))
            if trace_ids:  # replays of changed production runs resolve against them (§6 item 4)
                ids = sorted({k[0] for t in trace_ids - slow for k in fast[t]})
                replays = {r[0] for r in q("SELECT DISTINCT trace_id FROM {db}.trials WHERE shadow_of IN %(ids)s",
                                           {"ids": ids or [""]})} if ids else set()
                if slow:
                    replays |= {r[0] for r in q(
                        "SELECT DISTINCT trace_id FROM {db}.trials WHERE shadow_of IN "
                        "(SELECT trial_id FROM {db}.trials WHERE trace_id IN %(t)s)", {"t": sorted(slow)})}
                slow |= replays
                trace_ids |= replays
            # a new experiment on a trial (`shadow start --again`) or a re-run of a cut-off replay
            # attempt supersedes earlier replays: their contributions are retracted as soon as the
            # ledger or the new replays say so
            # the production trials the recent-only traces replay are in their recent rows (a
            # trace is a replay of one trial or none): looked up only for the others
            recent_of: dict[str, set[str]] = {t: set() for t in fast if t not in slow}
            for r in rows:
                if r[6] and r[1] in recent_of:
                    recent_of[r[1]].add(r[6])
            superseded = self._superseded_replays(trace_ids, ledger_prods, recent_of)
            slow |= superseded
            trace_ids |= superseded
            fast = {t: v for t, v in fast.items() if t in trace_ids and t not in slow}
            changed: set[GroupKey] = set()
            tids = sorted(trace_ids)
            for i in range(0, len(tids), _BATCH):
                changed |= self._refold(tids[i:i + _BATCH], fast, wmin)
            self._save_state({"trials_wm": new_wt, "outcomes_wm": new_wo, "judge_wm": new_wj, "ledger_wm": new_wl})
            if not self._retention_applied:
                # every trial stored before this sync is folded in now: only from here may the
                # tables the rollups are made from expire (a store older than its rollups would
                # otherwise lose its old trials at the first start, never rolled up)
                self.store.apply_retention()
                self._retention_applied = True
            self._seen.update(((r[0], *r[3:6]), int(r[2])) for r in fresh)
            horizon = new_wt - OVERLAP_NS
            self._seen = {k: v for k, v in self._seen.items() if v > horizon}
            self._ledger_seen.update((r[0], int(r[1])) for r in lrows)
            lh = new_wl - OVERLAP_NS
            self._ledger_seen = {k: v for k, v in self._ledger_seen.items() if v > lh}
            return changed

    def _superseded_replays(self, trace_ids: set[str], prods: set[str] = frozenset(),
                            known: dict[str, set[str]] | None = None) -> set[str]:
        """Trace ids of stored replays that the shadow ledger no longer counts
        (:meth:`relyscope.store.shadow.ShadowLedger.replay_traces`: a later experiment on the same
        production trial, or a later attempt of the same replay — a re-run after a crash or a stop
        gets a new trace id), among the replays of ``prods`` and of the production trials the
        replays among ``trace_ids`` copy. ``known``: trace id → the ``shadow_of`` values of its
        rows, already read (those traces are not looked up). Cost: lookups by these ids only."""
        from relyscope.store.shadow import ShadowLedger

        q = self.store.query
        prods = set(prods)
        known = known or {}
        for t in trace_ids:
            prods.update(known.get(t, ()))
        look = [t for t in trace_ids if t not in known]
        if look:
            prods |= {r[0] for r in q("SELECT DISTINCT shadow_of FROM {db}.trials WHERE trace_id IN %(t)s "
                                      "AND shadow_of IS NOT NULL AND shadow_of != ''", {"t": sorted(look)})}
        if not prods:
            return set()
        current = ShadowLedger(self.store).replay_traces(prods)
        if not current:
            return set()
        return {tid for tid, so in q("SELECT DISTINCT trace_id, shadow_of FROM {db}.trials WHERE shadow_of IN %(p)s",
                                     {"p": sorted(current)})
                if tid not in current[so]}

    def _refold(self, trace_ids: list[str], fast: dict[str, set] | None = None,
                min_version_ns: int = 0) -> set[GroupKey]:
        """Re-resolve the trials of ``trace_ids`` and replace their contributions (−old, +new, in
        one insert); retract those of the (trial id, group) keys these traces no longer have
        (superseded). A trial is keyed as the store keys it, by trial id *and* group: the same id
        in two groups is two trials. ``fast``: trace → (trial id, group) keys of its rows stored
        after ``min_version_ns``, for traces whose change is those rows alone (read from the
        recent rows; the others from the whole table)."""
        q = self.store.query
        fast = fast or {}
        quick = [t for t in trace_ids if t in fast]
        slow = [t for t in trace_ids if t not in fast]
        trials = self.store.load_trials(trace_ids=quick, min_version_ns=min_version_ns) if quick else []
        if slow:
            trials += self.store.load_trials(trace_ids=slow)
        loaded = {(t.trial_id, (t.agent_name, t.agent_version, t.run_kind)) for t in trials}
        # every (trial id, group) these traces ever had (a re-keyed trial leaves a tombstone row,
        # recent when the re-keying is); the same trial id in a group of another trace is not theirs
        all_keys = {k for t in quick for k in fast[t]} | loaded
        if slow:
            all_keys |= {(r[0], (r[1], r[2], r[3])) for r in q(
                "SELECT DISTINCT trial_id, agent, version, run_kind FROM {db}.trials WHERE trace_id IN %(t)s",
                {"t": slow})}
        resolved = self.resolve(trials)
        prev = {k: v for k, v in self._current({k[0] for k in all_keys}).items() if k in all_keys}
        new_state: dict[tuple[str, GroupKey], tuple[GroupKey, _Current] | None] = {k: None for k in prev}
        grades: dict[GroupKey, dict] = {}
        facts: list[tuple[GroupKey, tuple]] = []
        for t in resolved:
            # only for a judge: without one nobody empties the stage's queue of them, and it held
            # up to 10 000 whole trials (steps too), growing with the history (bench_memory.py)
            if self.judge and t.outcome == "unknown" and t.status == "complete":
                self.undecided.append(t)
            pol = policy_for(self.policy, t.agent_name)
            g = grade_trial(t, pol)
            # a replay the sandbox could not answer measures the sandbox: invalid (as review_group)
            ctb = contribution(t, severity=g.severity if pol is not None else 0.0,
                               invalid=not g.valid or is_sandbox_miss(t))
            group = (t.agent_name, t.agent_version, t.run_kind)
            new_state[(t.trial_id, group)] = (group, _Current(t.task_id, t.end_ns, ctb))
            grades.setdefault(group, {})[t.trial_id] = g
            if self.graded and group in self.graded:  # every resolved trial: its facts may change with an equal contribution
                facts.append((group, (t.trial_id, self._versions.get(t.trial_id), trial_facts(t, g))))
        now = self._stamp(2 * len(new_state))
        rows: list[list] = []
        changed: set[GroupKey] = set()
        for i, (key, new) in enumerate(sorted(new_state.items())):
            old, tid = prev.get(key), key[0]
            if old == new:
                continue  # nothing changed: write nothing
            if old is not None:
                rows.append(self._row(old[0], tid, old[1], -1, now + 2 * i))
                changed.add(old[0])
            if new is not None:
                rows.append(self._row(new[0], tid, new[1], +1, now + 2 * i + 1))
                changed.add(new[0])
        # one INSERT: the rollups, the trajectory sample and the current contributions are all
        # written by the materialized views of this one block
        self.store._insert("contrib_log", rows, _LOG_COLS, settings=_PARALLEL_VIEWS)
        self.rows += rows
        if self.graded:
            for group, ev in facts:
                if group in self.graded:
                    self.graded[group].append(ev)
            kept = {(t.trial_id, (t.agent_name, t.agent_version, t.run_kind)) for t in resolved}
            for t in trials:  # stored, left out by the resolution
                g = (t.agent_name, t.agent_version, t.run_kind)
                if (t.trial_id, g) not in kept and g in self.graded:
                    self.graded[g].append((t.trial_id, self._versions.get(t.trial_id), None))
            for tid, g in sorted(all_keys - loaded):  # tombstoned, gone, or moved to another group
                if g in self.graded:
                    self.graded[g].append((tid, 0, None))
        if self.write_grades:
            from relyscope.scoring.stage import grade_rows_of  # the grades table's row shape

            grade_rows = []
            for group, gr in grades.items():
                if group in changed:
                    gr = {tid: g for tid, g in gr.items()
                          if prev.get((tid, group)) != new_state.get((tid, group))}
                    grade_rows += grade_rows_of(group, GroupReview(gr, {}, frozenset(), {}))
            self.store.insert_grades(grade_rows)
        return changed

    @staticmethod
    def _row(group: GroupKey, tid: str, cur: _Current, sign: int, vns: int) -> list:
        c = cur.ctb if sign > 0 else cur.ctb.negated()
        return [*group, tid, cur.task_id, cur.end_ns, *c.sums, c.conf[0] if c.conf else None,
                c.conf[1] if c.conf else -1, list(c.actions or ()), c.actions is not None, sign, vns]

    def _current(self, trial_ids: Iterable[str]) -> dict[tuple[str, GroupKey], tuple[GroupKey, _Current]]:
        """The current contributions of ``trial_ids``: (trial id, group) → (group, state)."""
        ids = sorted(set(trial_ids))
        if not ids:
            return {}
        # which of them have a contribution at all (one column; new trials have none), before
        # reading the full rows with FINAL
        ids = [r[0] for r in self.store.query(
            "SELECT DISTINCT trial_id FROM {db}.contrib WHERE trial_id IN %(ids)s ORDER BY trial_id", {"ids": ids})]
        if not ids:
            return {}
        # the latest row per (trial id, group): by the group columns, not the key column (rows
        # written before the table was keyed by group have an empty one)
        rows = self.store.query(
            f"SELECT agent, version, run_kind, trial_id, task_id, toUnixTimestamp64Nano(end_time), "
            f"{', '.join(_SUM_NAMES)}, q, y, actions, traj FROM (SELECT * FROM {{db}}.contrib FINAL "
            "WHERE trial_id IN %(ids)s ORDER BY version_ns DESC LIMIT 1 BY trial_id, agent, version, run_kind) "
            "WHERE alive", {"ids": ids})
        out = {}
        k = len(_SUM_NAMES)
        for r in rows:
            sums = tuple(int(x) if isinstance(x, int) else float(x) for x in r[6:6 + k])
            q, y, actions, traj = r[6 + k:]
            ctb = Contribution(sums, (float(q), int(y)) if q is not None else None,
                               tuple(actions) if traj else None)
            out[(r[3], (r[0], r[1], r[2]))] = ((r[0], r[1], r[2]), _Current(r[4], int(r[5]), ctb))
        return out

    def resolve(self, trials: list[Trial]) -> list[Trial]:
        """``trials`` with their outcomes resolved (metrics.md §6, replays by item 4 against
        their production runs), reading only the posted outcomes and verdicts that name them or
        the production runs they replay."""
        prod_ids = sorted({t.shadow_of for t in trials if t.shadow_of})
        prods = self.store.load_trials(trial_ids=prod_ids) if prod_ids else []
        both = [*trials, *prods]
        ids = [t.trial_id for t in both]
        posted = self._outcomes_for(ids, {t.trace_id for t in both})
        judged = self._judgements_for(ids) if self.judge else None
        # outcomes posted for the ids these trials replaced when they were re-keyed count as theirs
        rekeyed = rekeyed_of(self.store, posted, trials)
        return resolve_replays(self.store, apply_outcomes(trials, posted, judged, rekeyed), posted, judged,
                               self.policy)

    def _outcomes_for(self, trial_ids: list[str], trace_ids: set[str]):
        if not trial_ids and not trace_ids:
            return {}
        # by trial id, by trace id, and for a trial id derived in one of these traces that no
        # longer names a trial (a re-keyed one's: :func:`orphan_posts`)
        rows = self.store.query(
            "SELECT key_kind, key, outcome, score, source, verifier, toUnixTimestamp64Nano(posted_at) "
            "FROM {db}.outcomes WHERE (key_kind = 'trial' AND (key IN %(a)s OR (substring(key, 33, 1) = ':' "
            "AND substring(key, 1, 32) IN %(b)s))) OR (key_kind = 'trace' AND key IN %(b)s) "
            "ORDER BY posted_at", {"a": sorted(trial_ids) or [""], "b": sorted(trace_ids) or [""]})
        out: dict = {}
        for r in rows:
            out.setdefault((r[0], r[1]), []).append((r[2], r[3], r[4], bool(r[5]), int(r[6])))
        return out

    def _judgements_for(self, trial_ids: list[str]) -> dict[str, Evaluation]:
        if not trial_ids:
            return {}
        rows = self.store.query("SELECT trial_id, name, score, label, explanation FROM {db}.judgements FINAL "
                                "WHERE trial_id IN %(ids)s", {"ids": sorted(trial_ids)})
        return {r[0]: Evaluation(name=r[1], score=r[2], label=r[3], explanation=r[4]) for r in rows}

    def rebuild(self) -> set[GroupKey]:
        """Empty the rollups and fold the whole stored history in again (the repair after a
        partly applied batch, or after changing the policy; cost: the history, once).
        Returns the groups found. Raises StoreUnavailable."""
        with self._lock:
            self.syncs += 1
            for table in ROLLUP_TABLES:
                _command(self.store, f"TRUNCATE TABLE IF EXISTS {{db}}.{table}")
            self._seen = {}
            self._ledger_seen = {}
            self.generation += 1
            self.rows = []
            self.graded = {}  # the whole history is refolded: callers re-register (and reload)
        return self.sync()

    # ---- reads ----------------------------------------------------------------------------------
    def group_sizes(self) -> dict[GroupKey, int]:
        """Every group with an all-time rollup → its trial count."""
        return {(r[0], r[1], r[2]): int(r[3]) for r in self.store.query(
            "SELECT agent, version, run_kind, sum(n_all) FROM {db}.task_stats WHERE level = 3 "
            "GROUP BY agent, version, run_kind HAVING sum(n_all) != 0")}

    def groups(self) -> list[GroupKey]:
        """Every group with an all-time rollup."""
        return [tuple(r) for r in self.store.query(
            "SELECT DISTINCT agent, version, run_kind FROM {db}.task_stats WHERE level = 3 ORDER BY 1, 2, 3")]

    def window_stats(self, group: GroupKey, since_s: int, window_s: float | None, *,
                     until_s: int | None = None, level: int | None = None,
                     members: list[tuple[str, str]] | None = None, trajectories: bool = True) -> TaskStats:
        """Per-task statistics of ``group`` over the buckets from ``since_s`` (Unix seconds; see
        :func:`window_start`) — and before ``until_s`` if given — at the level of ``window_s``
        (None: all time) unless ``level`` is given, with the trajectory sample (the most recent
        ``traj_sample`` successful runs per task that ended in the window). ``members``: pool
        these (agent, version) pairs of run kind ``group[2]`` instead — the cardinality cap's
        ``other`` group: each member's task is a task of its own, keyed ``["agent", "version",
        "task"]`` (JSON), since one task id of two agents, or of two versions, is two tasks (pooled
        into one, agent X's two successes and agent Y's two failures of task "t" gave pass^2 1/6 and
        C_out 0 for two perfectly consistent tasks).
        ``trajectories`` False: skip the trajectory sample (``trajectories`` left empty lists)."""
        level = level if level is not None else level_for(window_s)[0]
        # no upper bound unless asked: a trial that ends in the future (a skewed clock; past 2106
        # its bucket saturates at DateTime's maximum) ended after the window's start, and the
        # batch scorer and the in-memory windows count it (a bound at 2**31 s lost those after 2038)
        p = {"a": group[0], "v": group[1], "k": group[2], "l": level, "s": since_s, "u": until_s}
        who = "agent = %(a)s AND version = %(v)s"
        if members is not None:
            # tuples, not a concatenation with a separator: names may hold any character (NUL
            # too), and agent 'a\0b' version 'c' concatenated equal to agent 'a' version 'b\0c' —
            # the pool took in a group that was not a member
            who = "(agent, version) IN %(av)s" if members else "0"  # no member: nothing pooled
            p["av"] = sorted(tuple(m) for m in members)
        where = (f"{who} AND run_kind = %(k)s AND level = %(l)s AND bucket >= toDateTime(%(s)s, 'UTC')"
                 + (" AND bucket < toDateTime(%(u)s, 'UTC')" if until_s is not None else ""))
        # a task: its id in one group; (agent, version, id) among pooled members
        task, nk = ("agent, version, task_id", 3) if members is not None else ("task_id", 1)
        key = (lambda r: json.dumps(list(r[:3]), ensure_ascii=False)) if nk == 3 else (lambda r: r[0])
        rows = self.store.query(
            f"SELECT {task}, toUnixTimestamp64Nano(max(max_end)), {', '.join(f'sum({c})' for c in _SUM_NAMES)} "
            f"FROM {{db}}.task_stats WHERE {where} GROUP BY {task} HAVING sum(n_all) != 0 ORDER BY {task}", p)
        if nk == 3:
            rows.sort(key=key)
        ids = [key(r) for r in rows]
        idx = {t: i for i, t in enumerate(ids)}
        max_end = max((int(r[nk]) for r in rows), default=0)
        sums = np.array([[int(x) if isinstance(x, int) else float(x) for x in r[nk + 1:]] for r in rows],
                        dtype=object).reshape(len(ids), len(_SUM_NAMES))
        hist = sorted((i, float(r[nk]), int(r[nk + 1]), int(r[nk + 2])) for r in self.store.query(
            f"SELECT {task}, q, sum(pos), sum(neg) FROM {{db}}.conf_stats WHERE {where} "
            f"GROUP BY {task}, q HAVING sum(pos) != 0 OR sum(neg) != 0 ORDER BY {task}, q", p)
            if (i := idx.get(key(r))) is not None)
        traj: list[list[tuple[str, ...]]] = [[] for _ in ids]
        if not trajectories:
            return TaskStats(ids, sums, hist, traj, max_end_ns=max_end)
        p["m"] = self.traj_sample
        p["hs"] = since_s // 3600 * 3600
        for r in self.store.query(
                f"SELECT {task}, actions FROM {{db}}.traj_sample FINAL WHERE {who} "
                "AND run_kind = %(k)s AND hour >= toDateTime(%(hs)s, 'UTC') AND end_time >= toDateTime64(%(s)s, 9, 'UTC') "
                + ("AND end_time < toDateTime64(%(u)s, 9, 'UTC') " if until_s is not None else "")
                + f"AND alive ORDER BY {task}, end_time DESC, trial_id LIMIT %(m)s BY {task}", p):
            if (i := idx.get(key(r))) is not None:
                traj[i].append(tuple(r[nk]))
        return TaskStats(ids, sums, hist, traj, max_end_ns=max_end)

    def range_stats(self, groups: list[GroupKey], level: int, since_s: int, until_s: int) -> dict[GroupKey, TaskStats]:
        """Per-task statistics of each of ``groups`` over the buckets of ``level`` in
        [``since_s``, ``until_s``) — :meth:`window_stats` without trajectories, for many groups
        in one read (the buckets a sliding window leaves, for every group at once)."""
        got = self.ranges_stats(groups, level, [(since_s, until_s)])
        return {g: st for (g, _), st in got.items()}

    def ranges_stats(self, groups: list[GroupKey], level: int,
                     ranges: list[tuple[int, int]]) -> dict[tuple[GroupKey, int], TaskStats]:
        """:meth:`range_stats` of several bucket ranges [since, until) (Unix s) of one ``level``
        in one read per table: (group, index into ``ranges``) → statistics, for every group and
        range (empty if nothing is there). Ranges may overlap (a bucket counts in each range that
        holds it). The windows of one level slide on the same minute: one read instead of one per
        window (each read of the ~80 summed columns has a fixed cost of tens of ms)."""
        out: dict[tuple[GroupKey, int], TaskStats] = {}
        if not groups or not ranges:
            return out
        p: dict = {"g": sorted(groups), "l": level, "s": [int(a) for a, _ in ranges], "u": [int(b) for _, b in ranges]}
        # the ranges spelled out for the primary key's pruning, and the (1-based) indexes of the
        # ranges holding each row's bucket (one row per range: ARRAY JOIN)
        conds = " OR ".join(f"(bucket >= toDateTime(%(s)s[{i}], 'UTC') AND bucket < toDateTime(%(u)s[{i}], 'UTC'))"
                            for i in range(1, len(ranges) + 1))
        which = (f"arrayFilter(i -> bucket >= toDateTime(%(s)s[i], 'UTC') AND bucket < toDateTime(%(u)s[i], 'UTC'), "
                 f"range(1, {len(ranges) + 1}))")
        where = f"(agent, version, run_kind) IN %(g)s AND level = %(l)s AND ({conds})"
        rows = self.store.query(
            f"SELECT agent, version, run_kind, rng, task_id, toUnixTimestamp64Nano(max(max_end)), "
            f"{', '.join(f'sum({c})' for c in _SUM_NAMES)} FROM {{db}}.task_stats ARRAY JOIN {which} AS rng "
            f"WHERE {where} GROUP BY agent, version, run_kind, rng, task_id HAVING sum(n_all) != 0 "
            "ORDER BY agent, version, run_kind, rng, task_id", p)
        per: dict[tuple[GroupKey, int], list] = {}
        for r in rows:
            per.setdefault(((r[0], r[1], r[2]), int(r[3]) - 1), []).append(r[4:])
        hist: dict[tuple[GroupKey, int], list] = {}
        for r in self.store.query(
                f"SELECT agent, version, run_kind, rng, task_id, q, sum(pos), sum(neg) FROM {{db}}.conf_stats "
                f"ARRAY JOIN {which} AS rng WHERE {where} "
                "GROUP BY agent, version, run_kind, rng, task_id, q HAVING sum(pos) != 0 OR sum(neg) != 0 "
                "ORDER BY agent, version, run_kind, rng, task_id, q", p):
            hist.setdefault(((r[0], r[1], r[2]), int(r[3]) - 1), []).append((r[4], float(r[5]), int(r[6]), int(r[7])))
        for g in groups:
            for i in range(len(ranges)):
                rs = per.get((g, i), [])
                ids = [r[0] for r in rs]
                idx = {t: j for j, t in enumerate(ids)}
                sums = np.array([[int(x) if isinstance(x, int) else float(x) for x in r[2:]] for r in rs],
                                dtype=object).reshape(len(ids), len(_SUM_NAMES))
                h = [(idx[t], q, a, b) for t, q, a, b in hist.get((g, i), []) if t in idx]
                out[(g, i)] = TaskStats(ids, sums, h, [[] for _ in ids],
                                        max_end_ns=max((int(r[1]) for r in rs), default=0))
        return out

    def traj_runs(self, group: GroupKey, tasks: list[str] | None = None) -> list[tuple]:
        """The all-time trajectory sample of ``group`` (of ``tasks`` only, if given): rows
        ``(task_id, end Unix ns, trial_id, actions)``, per task the ``traj_sample`` most recent
        alive runs, most recent first, ties by trial id (the order :meth:`window_stats` reads)."""
        p = {"a": group[0], "v": group[1], "k": group[2], "m": self.traj_sample}
        only = ""
        if tasks is not None:
            if not tasks:
                return []
            p["t"] = tasks
            only = "AND task_id IN %(t)s "
        return self.store.query(
            "SELECT task_id, toUnixTimestamp64Nano(end_time), trial_id, actions FROM {db}.traj_sample FINAL "
            f"WHERE agent = %(a)s AND version = %(v)s AND run_kind = %(k)s {only}AND alive "
            "ORDER BY task_id, end_time DESC, trial_id LIMIT %(m)s BY task_id", p)


def _key_contrib_by_group(store: Store) -> bool:
    """Key ``contrib`` by (trial id, group) where an earlier version keyed it by trial id alone
    (a trial id stored in two groups — the store keys trials by group — kept one contribution, so
    the other group's trial was lost or retracted): the key column is added (empty in the rows
    already there: :meth:`Rollup._current` reads them by their group columns) and the view that
    feeds the table is remade. Returns whether it migrated. Raises StoreUnavailable."""
    key = store.query("SELECT sorting_key FROM system.tables WHERE database = %(d)s AND name = 'contrib'",
                      {"d": store.db})
    if not key or "gkey" in key[0][0]:
        return False
    _command(store, "ALTER TABLE {db}.contrib ADD COLUMN gkey String, MODIFY ORDER BY (trial_id, gkey)")
    _command(store, "DROP VIEW IF EXISTS {db}.contrib_mv")
    _command(store, next(d for d in ROLLUP_SCHEMA if ".contrib_mv TO" in d))
    return True


def _widen_sum_columns(store: Store) -> list[str]:
    """Give the summed columns of rollup tables made by an earlier version the types of
    :data:`SUM_COLUMNS` (the sums of squares became Int256: Int128 ones wrapped or refused a huge
    value). Only columns whose type differs are altered, the materialized views' targets before
    ``contrib_log`` (a view never writes wider values into a narrower column). Returns the
    statements run. Raises StoreUnavailable."""
    want = dict(SUM_COLUMNS)
    rows = store.query(
        "SELECT table, name, type FROM system.columns WHERE database = %(d)s "
        "AND table IN ('task_stats', 'contrib', 'contrib_log') AND name IN %(c)s",
        {"d": store.db, "c": sorted(want)})
    ran = []
    for table, name, typ in sorted(rows, key=lambda r: (r[0] == "contrib_log", r[0], r[1])):
        if typ != want[name]:
            ran.append(f"ALTER TABLE {{db}}.{table} MODIFY COLUMN {name} {want[name]}")
            _command(store, ran[-1])
    return ran


def _small_blocks(store: Store) -> list[str]:
    """Give the bucket rollups made by an earlier version the compressed-block settings of
    :data:`_BLOCKS` (``ALTER TABLE … MODIFY SETTING``, only where ``system.tables`` shows them
    missing: on a server each one is a metadata change). Parts already written keep their blocks
    until merged. Returns the statements run. Raises StoreUnavailable."""
    rows = store.query("SELECT name, create_table_query FROM system.tables WHERE database = %(d)s "
                       "AND name IN ('task_stats', 'conf_stats') ORDER BY name", {"d": store.db})
    want = dict(part.strip().split(" = ") for part in _BLOCKS.split(","))
    ran = []
    for name, ddl in rows:
        have = dict(re.findall(r"\b(min_compress_block_size|max_compress_block_size) = (\d+)", ddl))
        if have != want:
            ran.append(f"ALTER TABLE {{db}}.{name} MODIFY SETTING {_BLOCKS}")
            _command(store, ran[-1])
    return ran


def _command(store: Store, ddl: str) -> None:
    """Run one DDL statement through the store's client (``{db}`` replaced)."""
    with store._lock:
        store._ready_client().command(ddl.replace("{db}", store.db))
