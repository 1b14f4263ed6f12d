"""The shadow-replay ledger in ClickHouse: sample decisions (``shadow_samples``) and replays
(``shadow_replays``), through :class:`relyscope.store.Store` only. No business logic.

Replay statuses: ``scheduled`` → ``running`` → ``completed`` (the target ran it) | ``failed`` (the
agent raised; its spans are still scored) | ``sandbox_miss`` (a call had no recorded answer) |
``error`` (the target is down or answered something that is not a replay reply) | ``timeout`` (no
reply within the deadline) | ``cancelled``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from relyscope.store.clickhouse import Store

__all__ = ["ShadowLedger", "REPLAY_STATUSES", "FINISHED", "TARGET_FAILED", "ALIVE", "RAN"]

REPLAY_STATUSES = ("scheduled", "running", "completed", "failed", "sandbox_miss", "error", "timeout", "cancelled")
FINISHED = ("completed", "failed", "sandbox_miss", "error", "timeout", "cancelled")
#: finished without the target running the agent: the target (or the way to it) failed
TARGET_FAILED = ("error", "timeout")
#: a replay that ran the agent (its run is in the store)
RAN = ("completed", "failed", "sandbox_miss")
#: a replay that ran the agent or still may: an experiment with one supersedes earlier ones
ALIVE = ("scheduled", "running", *RAN)

_REPLAY_COLS = ["replay_id", "experiment", "shadow_of", "task_id", "agent", "prod_version", "target_version",
                "run_kind", "family", "strength", "seed", "idx", "input", "status", "trace_id", "error",
                "calls", "n_calls", "n_exact", "n_position", "n_live", "n_miss", "n_faults",
                "n_side_effects", "scheduled_at", "finished_at"]


def _dt(seconds: float | None):
    import datetime as _d

    return None if seconds is None else _d.datetime.fromtimestamp(seconds, _d.timezone.utc)


def _sec(v: Any) -> float | None:
    if v is None:
        return None
    try:
        import datetime as _d

        if v.tzinfo is None:
            v = v.replace(tzinfo=_d.timezone.utc)
        return v.timestamp()
    except AttributeError:
        return float(v)


class ShadowLedger:
    """Reads and writes of the two shadow tables. Every method may raise StoreUnavailable."""

    def __init__(self, store: Store):
        self.store = store

    # ---- samples --------------------------------------------------------------------------------
    def record_decisions(self, decisions: Iterable[Any]) -> None:
        """Store :class:`relyscope.shadow.sampler.SampleDecision` objects."""
        now = _dt(time.time())
        self.store.insert_rows("shadow_samples", [
            {"trial_id": d.trial_id, "agent": d.agent, "version": d.version, "task_id": d.task_id,
             "decision": d.decision, "reason": d.reason, "decided_at": now} for d in decisions])

    def candidate_trial_ids(self, since_ns: int, until_ns: int, *, limit: int = 100_000,
                            newest_first: bool = False, per_task: int | None = None) -> list[str]:
        """Ids of complete production trials (not replays) that ended in ``[since_ns, until_ns)``,
        at most ``limit``; ``per_task``: at most that many of each (agent, task) — the first in the
        order asked for."""
        by_task = f"LIMIT {int(per_task)} BY agent, task_id " if per_task else ""
        rows = self.store.query(
            "SELECT trial_id FROM {db}.trials FINAL WHERE run_kind = 'production' AND status = 'complete' "
            "AND (shadow_of IS NULL OR shadow_of = '') AND end_time >= fromUnixTimestamp64Nano(%(a)s) "
            "AND end_time < fromUnixTimestamp64Nano(%(b)s) "
            f"ORDER BY end_time {'DESC' if newest_first else 'ASC'}, trial_id {by_task}LIMIT %(lim)s",
            {"a": int(max(0, since_ns)), "b": int(until_ns), "lim": limit})
        return [r[0] for r in rows]

    def decided(self, trial_ids: Iterable[str]) -> set[str]:
        """Which of ``trial_ids`` already have a decision."""
        ids = sorted(set(trial_ids))
        if not ids:
            return set()
        return {r[0] for r in self.store.query(
            "SELECT trial_id FROM {db}.shadow_samples WHERE trial_id IN %(ids)s", {"ids": ids})}

    def sampled_since(self, since_s: float) -> dict[str, int]:
        """agent → trials sampled (automatic decisions) since ``since_s`` (Unix seconds)."""
        rows = self.store.query(
            "SELECT agent, count() FROM {db}.shadow_samples FINAL WHERE decision = 'sampled' "
            "AND decided_at >= fromUnixTimestamp64Milli(%(t)s) GROUP BY agent", {"t": int(since_s * 1000)})
        return {r[0]: int(r[1]) for r in rows}

    def decisions(self, *, decision: str | None = None, limit: int = 200) -> list[dict]:
        where, params = "1", {"lim": limit}
        if decision:
            where, params["d"] = "decision = %(d)s", decision
        rows = self.store.query(
            "SELECT trial_id, agent, version, task_id, decision, reason, toUnixTimestamp64Milli(decided_at) "
            f"FROM {{db}}.shadow_samples FINAL WHERE {where} ORDER BY decided_at DESC LIMIT %(lim)s", params)
        return [{"trial_id": r[0], "agent": r[1], "version": r[2], "task_id": r[3], "decision": r[4],
                 "reason": r[5], "decided_at": r[6] / 1000.0} for r in rows]

    def decision_counts(self) -> dict[str, int]:
        rows = self.store.query("SELECT decision, count() FROM {db}.shadow_samples FINAL GROUP BY decision")
        return {r[0]: int(r[1]) for r in rows}

    # ---- replays --------------------------------------------------------------------------------
    def write_replays(self, rows: list[dict]) -> None:
        """Insert or replace replay rows (dicts with the ``_REPLAY_COLS`` keys; times in Unix s)."""
        now = time.time_ns()
        out = []
        for i, r in enumerate(rows):
            d = {c: r.get(c) for c in _REPLAY_COLS}
            for c in ("trace_id", "error", "calls"):
                d[c] = d[c] or ("[]" if c == "calls" else "")
            for c in ("n_calls", "n_exact", "n_position", "n_live", "n_miss", "n_faults", "n_side_effects"):
                d[c] = int(d[c] or 0)
            d["scheduled_at"] = _dt(d["scheduled_at"] or time.time())
            d["finished_at"] = _dt(d["finished_at"])
            d["version_ns"] = now + i
            out.append(d)
        self.store.insert_rows("shadow_replays", out)

    def replays(self, *, status: str | Iterable[str] | None = None, shadow_of: str | Iterable[str] | None = None,
                replay_ids: Iterable[str] | None = None, target_version: str | None = None,
                agent: str | None = None, limit: int = 1000, with_calls: bool = False,
                oldest_first: bool = False, since_s: float | None = None) -> list[dict]:
        """Replay rows (latest version of each), newest first unless ``oldest_first``; only those
        scheduled at or after ``since_s`` (Unix seconds) when given. ``shadow_of``: one
        production trial id or several. Each row also has ``updated_at`` (Unix s of its last write)."""
        where, params = ["1"], {"lim": limit}
        if since_s is not None:
            where.append("scheduled_at >= fromUnixTimestamp64Milli(%(since)s)")
            params["since"] = int(since_s * 1000)
        if status is not None:
            where.append("status IN %(st)s")
            params["st"] = [status] if isinstance(status, str) else sorted(set(status))
        if shadow_of is not None and not isinstance(shadow_of, str):  # several production trials
            where.append("shadow_of IN %(so_in)s")
            params["so_in"] = sorted(set(shadow_of)) or [""]
            shadow_of = None
        for col, val in (("shadow_of", shadow_of), ("target_version", target_version), ("agent", agent)):
            if val is not None:
                where.append(f"{col} = %({col})s")
                params[col] = val
        if replay_ids is not None:
            where.append("replay_id IN %(ids)s")
            params["ids"] = sorted(set(replay_ids)) or [""]
        cols = [c for c in _REPLAY_COLS if with_calls or c != "calls"] + ["version_ns"]
        rows = self.store.query(
            f"SELECT {', '.join(cols)} FROM {{db}}.shadow_replays FINAL WHERE {' AND '.join(where)} "
            f"ORDER BY scheduled_at {'ASC' if oldest_first else 'DESC'}, family, idx LIMIT %(lim)s", params)
        out = []
        for r in rows:
            d = dict(zip(cols, r))
            d["scheduled_at"] = _sec(d["scheduled_at"])
            d["finished_at"] = _sec(d["finished_at"])
            d["updated_at"] = int(d.pop("version_ns")) / 1e9  # when the row was last written, Unix s
            out.append(d)
        return out

    def existing_replay_ids(self, replay_ids: Iterable[str]) -> set[str]:
        """Which of ``replay_ids`` the ledger already has (any status)."""
        ids = sorted(set(replay_ids))
        if not ids:
            return set()
        return {r[0] for r in self.store.query(
            "SELECT DISTINCT replay_id FROM {db}.shadow_replays WHERE replay_id IN %(ids)s", {"ids": ids})}

    def replay_traces(self, shadow_of: Iterable[str]) -> dict[str, set[str]]:
        """production trial id → the current trace ids of its replays (one per replay), of the
        latest experiment per target version only (``shadow start --again`` supersedes the
        earlier replays of a trial: an old and a new replay are never both counted) — the latest
        with a replay that ran or may still run (:data:`ALIVE`): a re-run whose every replay
        ended error / timeout at the target measured nothing, and superseded a good experiment."""
        ids = sorted(set(shadow_of))
        if not ids:
            return {}
        latest: dict[tuple[str, str], tuple[bool, Any, str]] = {}
        rows = self.store.query("SELECT shadow_of, target_version, experiment, scheduled_at, trace_id, status "
                                "FROM {db}.shadow_replays FINAL WHERE shadow_of IN %(ids)s", {"ids": ids})
        alive = {(so, tv, exp) for so, tv, exp, _, _, st in rows if st in ALIVE}
        for so, tv, exp, at, _, _ in rows:
            key, rank = (so, tv), ((so, tv, exp) in alive, at, exp)
            if key not in latest or rank > latest[key]:
                latest[key] = rank
        out: dict[str, set[str]] = {so: set() for so, _ in latest}
        for so, tv, exp, _, tid, _ in rows:
            if latest[(so, tv)][2] == exp:
                out[so].add(tid)
        return out

    def replay_ids_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        """Replay ids starting with ``prefix`` (the ``limit`` smallest), for short ids typed by people."""
        rows = self.store.query("SELECT DISTINCT replay_id FROM {db}.shadow_replays WHERE startsWith(replay_id, %(p)s) "
                                "ORDER BY replay_id LIMIT %(lim)s", {"p": prefix, "lim": limit})
        return [r[0] for r in rows]

    def status_counts(self, *, agent: str | None = None) -> dict[str, int]:
        where, params = "1", {}
        if agent:
            where, params["a"] = "agent = %(a)s", agent
        rows = self.store.query(
            f"SELECT status, count() FROM {{db}}.shadow_replays FINAL WHERE {where} GROUP BY status", params)
        return {r[0]: int(r[1]) for r in rows}

    def sandbox_stats(self, target_version: str, *, agent: str | None = None,
                      since_s: float | None = None) -> tuple[int, int]:
        """(replays that ran — completed, failed or sandbox_miss —, those with a sandbox miss) of one
        target version, scheduled at or after ``since_s`` (Unix seconds) when given. Replays that
        never reached the agent (error, timeout, cancelled) say nothing about the sandbox and are
        not counted."""
        where, params = ["target_version = %(v)s", "status IN %(fin)s"], {"v": target_version,
                                                                          "fin": list(RAN)}
        if agent:
            where.append("agent = %(a)s")
            params["a"] = agent
        if since_s is not None:
            where.append("scheduled_at >= fromUnixTimestamp64Milli(%(since)s)")
            params["since"] = int(since_s * 1000)
        # only the latest experiment of each replayed trial (a re-run with --again supersedes the
        # first), among those with a replay that ran or may (as :meth:`replay_traces`)
        where.append("(shadow_of, experiment) IN (SELECT shadow_of, argMax(experiment, (status IN %(alive)s, "
                     "scheduled_at)) FROM {db}.shadow_replays FINAL WHERE target_version = %(v)s GROUP BY shadow_of)")
        params["alive"] = list(ALIVE)
        r = self.store.query(
            f"SELECT count(), countIf(n_miss > 0 OR status = 'sandbox_miss') FROM {{db}}.shadow_replays FINAL "
            f"WHERE {' AND '.join(where)}", params)[0]
        return int(r[0]), int(r[1])

    def replay_traces_since(self, target_version: str, since_s: float, *, agent: str | None = None) -> set[str]:
        """Trace ids of the replays of ``target_version`` scheduled at or after ``since_s`` (Unix
        seconds): the replays of the experiments started since then (each replay's latest attempt)."""
        where, params = ["target_version = %(v)s", "scheduled_at >= fromUnixTimestamp64Milli(%(since)s)",
                         "trace_id != ''"], {"v": target_version, "since": int(since_s * 1000)}
        if agent:
            where.append("agent = %(a)s")
            params["a"] = agent
        return {r[0] for r in self.store.query(
            f"SELECT trace_id FROM {{db}}.shadow_replays FINAL WHERE {' AND '.join(where)}", params)}

    def versions(self) -> list[tuple[str, str, int]]:
        """(agent, target version, replays) known to the ledger."""
        rows = self.store.query("SELECT agent, target_version, count() FROM {db}.shadow_replays FINAL "
                                "GROUP BY agent, target_version ORDER BY agent, target_version")
        return [(r[0], r[1], int(r[2])) for r in rows]
