"""Every table and view of a relyscope store, its retention (TTLs), and its cluster variant.

One place for the DDL of the store (:data:`relyscope.store.clickhouse.SCHEMA`: spans, trials,
outcomes, scores, judgements, grades, the shadow-replay ledger) and of the rollups
(:data:`relyscope.scoring.rollup.ROLLUP_SCHEMA`: ``contrib_log`` and its materialized views,
``task_stats``, ``conf_stats``, ``traj_sample``, ``contrib``, ``scoring_state``).

Retention (:class:`Retention`). Every expiring table expires rows by **when relyscope stored
them**, never by the run's own timestamps: a backfilled or imported run with old timestamps
would otherwise be deleted on arrival (ClickHouse drops already-expired rows at insert), before
the rollups ever saw it. Days are counted from:

- ``otel_traces``: ``IngestedAt`` (span stored), ``spans_ttl_days``;
- ``trials``, ``grades``: ``version_ns`` (row stored); ``outcomes``: ``posted_at``;
  ``judgements``: ``judged_at``; ``shadow_samples``: ``decided_at``; ``shadow_replays``:
  ``version_ns`` — all ``trials_ttl_days``;
- ``scores``: ``computed_at``, ``scores_ttl_days``;
- ``task_stats``, ``conf_stats``: ``bucket``, minute level ``rollup_minute_ttl_days``, hour level
  ``rollup_hour_ttl_days``; ``traj_sample``: ``version_ns``, ``traj_sample_ttl_days``.

The all-time rollup level, ``contrib`` (what to retract when a trial changes) and
``scoring_state`` (watermarks) never expire: a window's live score reads only the rollups, so it
stays right after the trials it came from are gone. ``scores_ttl_days=None``: scores never expire.

The Store applies these to spans and scores when it opens, and to the tables the rollups are made
from only once they are rolled up (:meth:`relyscope.store.Store.apply_retention`, called by
:meth:`relyscope.scoring.rollup.Rollup.sync` after its first sync).

:func:`apply_retention` reconciles a store's TTLs with a :class:`Retention`: it reads each
table's TTL from ``system.tables.create_table_query`` and runs ``ALTER TABLE … MODIFY TTL`` (or
``REMOVE TTL``) only where it differs — on a server a MODIFY TTL also materializes the TTL over
every existing part (``materialize_ttl_after_modify``, on by default), so it is not repeated at
every start when nothing changed (not measured here: chDB queued no second mutation for an
unchanged TTL).

Cluster variant (:func:`cluster_schema`, CLI ``relyscope schema --cluster NAME``): the same
statements ``ON CLUSTER``, stored tables on ``Replicated*MergeTree``, a ``<table>_dist``
Distributed table beside each (sharded so that the rows ReplacingMergeTree must merge meet on one
shard). Only parsed here (ClickHouse's own parser, ``formatQuery``, in chDB): chDB has no
clusters and no Keeper (see README "Beyond one machine").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

__all__ = ["Retention", "ttl_clauses", "statements", "cluster_schema", "apply_retention", "current_ttl", "rollup_ttls",
           "SHARD_KEYS", "NO_DIST", "MAX_TTL_DAYS", "check_ttl_days",
           "check_database", "check_zk_path"]

#: the storage clock of each expiring store table (see the module docstring)
_STORED_AT: Final = {
    "otel_traces": "toDateTime(IngestedAt)",
    "trials": "toDateTime(intDiv(version_ns, 1000000000))",
    "grades": "toDateTime(intDiv(version_ns, 1000000000))",
    "outcomes": "toDateTime(posted_at)",
    "judgements": "toDateTime(judged_at)",
    "shadow_samples": "toDateTime(decided_at)",
    "shadow_replays": "toDateTime(intDiv(version_ns, 1000000000))",
    "scores": "toDateTime(computed_at)",
    "gate_verdicts": "toDateTime(evaluated_at)",
}
#: Retention field → the setting it comes from (named in error messages)
_SETTING_NAMES: Final = {"spans_days": "spans_ttl_days", "trials_days": "trials_ttl_days",
                         "scores_days": "scores_ttl_days", "rollup_minute_days": "rollup_minute_ttl_days",
                         "rollup_hour_days": "rollup_hour_ttl_days", "traj_sample_days": "traj_sample_ttl_days"}
_SETTING_OF: Final = {"otel_traces": "spans", "scores": "scores", "gate_verdicts": "scores"}  # the rest: "trials"


#: the longest retention, days: ClickHouse ``DateTime`` + ``toIntervalSecond`` wraps around past
#: 2106-02-07 (UInt32 seconds), so ``now + 36 500 d`` lands in 1970-ish and every row expires at
#: once. 20 000 d (≈ 54.8 years) keeps ``now + TTL`` below the wrap until ~2051.
MAX_TTL_DAYS: Final = 20_000.0


def check_ttl_days(name: str, v: float | None, *, nullable: bool) -> None:
    """ValueError unless ``v`` is a finite number of days in (0, :data:`MAX_TTL_DAYS`] (or None
    where ``nullable``: keep for ever). ``name`` is what the message calls the setting."""
    hint = "use null (keep for ever) or a smaller value" if nullable else "use a smaller value"
    if v is None:
        if nullable:
            return
        raise ValueError(f"{name} needs a finite retention in days (rollups, which outlive it, expire)")
    if not math.isfinite(v) or v > MAX_TTL_DAYS:
        raise ValueError(f"{name}={v!r} days is beyond the longest retention, {MAX_TTL_DAYS:g} days "
                         f"(ClickHouse DateTime arithmetic wraps past 2106 and would expire every row at once); "
                         f"{hint}")
    if not v > 0:
        raise ValueError(f"{name} must be > 0 days, got {v!r}")


def _secs(days: float) -> int:
    return int(round(days * 86400))


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each kind of row is kept, in days (scores: ``None`` keeps them for ever).

    Each is finite, > 0 and ≤ :data:`MAX_TTL_DAYS` (ValueError otherwise: a longer TTL overflows
    ClickHouse's DateTime and expires everything at once). Order (checked; ValueError otherwise): spans ≤ trials ≤ scores and ≤ hour rollups — spans are
    the bulk and are only needed to re-finalize a trial, and rollups and scores must outlive the
    rows they came from. Minute rollups must cover the longest window read at minute buckets
    (25 h: windows up to 6 h, drift's 1 h + 24 h). Defaults: spans 14 d, trials 90 d, scores and
    hour rollups 400 d, minute rollups 2 d, trajectory sample 30 d."""

    spans_days: float = 14.0
    trials_days: float = 90.0
    scores_days: float | None = 400.0
    rollup_minute_days: float = 2.0
    rollup_hour_days: float = 400.0
    traj_sample_days: float = 30.0

    def __post_init__(self):
        inf = float("inf")
        for name, setting in _SETTING_NAMES.items():
            check_ttl_days(setting, getattr(self, name), nullable=name == "scores_days")
        s, t, c = self.spans_days, self.trials_days, inf if self.scores_days is None else self.scores_days
        if s > t:
            raise ValueError(f"spans must not outlive trials: spans_ttl_days={self.spans_days} > "
                             f"trials_ttl_days={self.trials_days}")
        if t > c or t > self.rollup_hour_days:
            raise ValueError(f"trials must not outlive the scores and hour rollups made from them: "
                             f"trials_ttl_days={self.trials_days}, scores_ttl_days={self.scores_days}, "
                             f"rollup_hour_ttl_days={self.rollup_hour_days}")
        if self.rollup_minute_days * 86400 < 25 * 3600:
            raise ValueError("rollup_minute_ttl_days must be >= 25 h (the longest window read at minute buckets)")

    @classmethod
    def from_settings(cls, s) -> "Retention":
        """From :class:`relyscope.config.Settings` (its ``*_ttl_days`` fields)."""
        return cls(s.spans_ttl_days, s.trials_ttl_days, s.scores_ttl_days, s.rollup_minute_ttl_days,
                   s.rollup_hour_ttl_days, s.traj_sample_ttl_days)

    def days_of(self, table: str) -> float | None:
        return {"spans": self.spans_days, "scores": self.scores_days,
                "trials": self.trials_days}[_SETTING_OF.get(table, "trials")]


def ttl_clauses(r: Retention) -> dict[str, str | None]:
    """table → its TTL expression (what follows ``TTL``) under ``r``, None: no TTL. Covers every
    stored table of the store and the rollups (``contrib``, ``scoring_state``: None)."""
    out: dict[str, str | None] = {}
    for table, clock in _STORED_AT.items():
        days = r.days_of(table)
        out[table] = None if days is None else f"{clock} + toIntervalSecond({_secs(days)})"
    out.update(rollup_ttls(r.rollup_minute_days, r.rollup_hour_days, r.traj_sample_days))
    out["contrib"] = out["scoring_state"] = None
    return out


def rollup_ttls(minute_days: float, hour_days: float, traj_days: float) -> dict[str, str]:
    """TTL expressions of the rollup tables that expire: minute buckets (level 1) ``minute_days``
    after their bucket, hour buckets (level 2) ``hour_days``; the all-time level never;
    ``traj_sample`` rows ``traj_days`` after they were written — by when the row was written, not
    by the run's timestamp (a backfilled run would otherwise lose its trajectory at once)."""
    m, h, t = _secs(minute_days), _secs(hour_days), _secs(traj_days)
    out = {table: f"bucket + toIntervalSecond({m}) WHERE level = 1, bucket + toIntervalSecond({h}) WHERE level = 2"
           for table in ("task_stats", "conf_stats")}
    out["traj_sample"] = f"toDateTime(intDiv(version_ns, 1000000000)) + toIntervalSecond({t})"
    return out


_CREATE: Final = re.compile(r"\s*CREATE (TABLE|MATERIALIZED VIEW) IF NOT EXISTS \{db\}\.(\w+)")


def _base() -> list[str]:
    from relyscope.scoring.rollup import ROLLUP_SCHEMA
    from relyscope.store.clickhouse import SCHEMA

    return [*SCHEMA, *ROLLUP_SCHEMA]


def statements(retention: Retention | None = None) -> list[str]:
    """Every DDL statement of a store (``{db}`` placeholder for the database), in order: the
    store's tables and migrations, then the rollups. With ``retention``, each CREATE TABLE of an
    expiring table carries its ``TTL`` clause (an existing table keeps its TTL: see
    :func:`apply_retention`)."""
    ttl = ttl_clauses(retention) if retention is not None else {}
    out = ["CREATE DATABASE IF NOT EXISTS {db}"]
    for ddl in _base():
        m = _CREATE.match(ddl)
        if m and m.group(1) == "TABLE" and ttl.get(m.group(2)):
            head, *settings = re.split(r"(?=\s+SETTINGS\s)", ddl, maxsplit=1)  # TTL goes before SETTINGS
            ddl = f"{head}\n    TTL {ttl[m.group(2)]}" + "".join(settings)
        out.append(ddl)
    return out


#: sharding key of each Distributed table: the rows a ReplacingMergeTree replaces, or a
#: trial's −old/+new contributions, must land on one shard
SHARD_KEYS: Final = {
    "otel_traces": "cityHash64(TraceId)",   # a re-sent span replaces its copy: same trace, same shard
    "trials": "cityHash64(trace_id)",       # a trace's trials and tombstones together (rollup lookups)
    "grades": "cityHash64(trial_id)", "judgements": "cityHash64(trial_id)",
    "shadow_samples": "cityHash64(trial_id)", "shadow_replays": "cityHash64(replay_id)",
    "scores": "cityHash64(agent, version, run_kind)",
    "contrib_log": "cityHash64(trial_id)", "contrib": "cityHash64(trial_id)", "traj_sample": "cityHash64(trial_id)",
}
#: tables without a Distributed table: the watermarks are one per deployment (one replicated
#: copy on every node)
NO_DIST: Final = ("scoring_state",)


#: a ClickHouse database name printed unquoted into the DDL (``relyscope schema --database``)
DATABASE_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_database(name: str) -> str:
    """``name`` if it is a plain ClickHouse identifier (:data:`DATABASE_RE`, ≤ 128 chars), else
    ValueError — it goes into the DDL unquoted, so ``x; drop`` would be a second statement."""
    if len(name) > 128 or not DATABASE_RE.fullmatch(name):
        raise ValueError(f"bad database name {name!r}: use letters, digits and _ (not starting with a digit)")
    return name


def check_zk_path(path: str) -> str:
    """``path`` if it can be the Keeper path of every replicated table, else ValueError: it is
    printed inside a '…' literal (no quotes, backslashes or control characters), and it must hold
    ``{table}`` (each table its own path: without it every table would share one Keeper node) and
    ``{shard}`` (each shard its own replica set: without it every shard would replicate the others)."""
    if not path or any(c in path for c in "'\\\"`") or any(ord(c) < 32 for c in path):
        raise ValueError(f"bad --zk-path {path!r}: no quotes, backslashes or control characters")
    missing = [m for m in ("{table}", "{shard}") if m not in path]
    if missing:
        raise ValueError(f"--zk-path {path!r} lacks {' and '.join(missing)}: the Keeper path must be unique per "
                         "table and per shard, e.g. /clickhouse/tables/{shard}/{database}/{table}")
    return path


def cluster_schema(cluster: str, retention: Retention | None = None, *,
                   zk_path: str = "/clickhouse/tables/{shard}/{database}/{table}") -> list[str]:
    """The DDL of :func:`statements` for a ClickHouse cluster named ``cluster`` (NOT run against a
    server here). Transformations, and nothing else: every statement ``ON CLUSTER '<cluster>'``;
    ``MergeTree`` / ``SummingMergeTree`` / ``ReplacingMergeTree(v)`` → ``Replicated…MergeTree(
    '<zk_path>', '{replica}'[, v])`` (``{shard}``/``{replica}`` server macros; ``scoring_state``
    under shard ``all``: one copy per deployment); ``contrib_log`` stays ``Null`` on every node
    with its views; after each stored table (and ``contrib_log``, which takes the inserts) a
    ``<table>_dist`` Distributed table sharded by :data:`SHARD_KEYS` (the others by ``rand()``).
    Reads through ``_dist`` tables add up: per-task sums across shards, FINAL per shard is right
    because the replaced rows share a shard. Raises ValueError for a cluster name that is not an
    identifier, or a ``zk_path`` :func:`check_zk_path` refuses."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", cluster):
        raise ValueError(f"bad cluster name {cluster!r}")
    check_zk_path(zk_path)
    on = f" ON CLUSTER '{cluster}'"
    out = []
    for ddl in statements(retention):
        if ddl.startswith("CREATE DATABASE"):
            out.append(ddl + on)
            continue
        m = _CREATE.match(ddl)
        if not m:  # ALTER TABLE {db}.x …
            am = re.match(r"\s*ALTER TABLE \{db\}\.(\w+) ", ddl)
            assert am, ddl
            out.append(ddl.replace(f"{{db}}.{am.group(1)} ", f"{{db}}.{am.group(1)}{on} ", 1))
            continue
        kind, name = m.groups()
        ddl = ddl.replace(f"{{db}}.{name}", f"{{db}}.{name}{on}", 1)
        path = zk_path.replace("{table}", name).replace("{shard}", "all" if name in NO_DIST else "{shard}")
        ddl, n = re.subn(r"ENGINE = (Summing|Replacing)?MergeTree(\(([^)]*)\))?",
                         lambda e: f"ENGINE = Replicated{e.group(1) or ''}MergeTree('{path}', '{{replica}}'"
                                   + (f", {e.group(3)}" if e.group(3) else "") + ")", ddl)
        out.append(ddl)
        if kind == "TABLE" and name not in NO_DIST and (n or name == "contrib_log"):
            out.append(f"CREATE TABLE IF NOT EXISTS {{db}}.{name}_dist{on} AS {{db}}.{name} "
                       f"ENGINE = Distributed('{cluster}', currentDatabase(), {name}, "
                       f"{SHARD_KEYS.get(name, 'rand()')})")
    return out


def current_ttl(client, db: str, table: str) -> str | None:
    """The TTL expression of ``db.table`` as the server prints it (``system.tables``), None if
    it has none or the table does not exist."""
    rows = client.query("SELECT create_table_query FROM system.tables WHERE database = %(d)s AND name = %(t)s",
                        parameters={"d": db, "t": table}).result_rows
    if not rows:
        return None
    m = re.search(r"\sTTL\s(.*?)(?:\sSETTINGS\s.*)?$", rows[0][0], re.S)
    return m.group(1).strip() if m else None


def _normal(client, expr: str) -> str:
    """``expr`` as ClickHouse's formatter prints it (so spacing and literals compare equal)."""
    q = client.query("SELECT formatQuerySingleLine(%(q)s)", parameters={"q": f"ALTER TABLE t MODIFY TTL {expr}"})
    return q.result_rows[0][0]


def apply_retention(client, db: str, tables: dict[str, str | None], *, on_cluster: str | None = None) -> list[str]:
    """Make each table's TTL the one in ``tables`` (table → TTL expression, None: no TTL),
    altering only those that differ; returns the statements run. Tables that do not exist are
    skipped. ``client``: a clickhouse-connect client. Raises the driver's errors."""
    ran = []
    on = f" ON CLUSTER '{on_cluster}'" if on_cluster else ""
    for table, want in tables.items():
        exists = client.query("SELECT count() FROM system.tables WHERE database = %(d)s AND name = %(t)s",
                              parameters={"d": db, "t": table}).result_rows[0][0]
        if not exists:
            continue
        have = current_ttl(client, db, table)
        if want is None:
            if have is None:
                continue
            sql = f"ALTER TABLE {db}.{table}{on} REMOVE TTL"
        else:
            if have is not None and _normal(client, have) == _normal(client, want):
                continue
            sql = f"ALTER TABLE {db}.{table}{on} MODIFY TTL {want}"
        client.command(sql)
        ran.append(sql)
    return ran
