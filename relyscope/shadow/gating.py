"""The release gate over stored runs: gather both sides of a shadow or canary comparison, grade
them, measure the experiment (sandbox misses, harness agreement) and hand everything to the pure
verdict logic of :mod:`relyscope.scorers.gate` (metrics.md §10).

Modes:

- ``shadow`` (default): baseline and candidate are the shadow replays of the same sampled
  production tasks against the two versions' replay targets (run kind ``shadow``);
- ``canary``: the candidate's canary production traffic (run kind ``canary``) against the
  baseline's production traffic, paired on the tasks both ran.

Raises :class:`UnknownVersion` when a side has no runs (the message lists the versions that
exist) and ``StoreUnavailable`` when the store cannot be read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relyscope.model import Trial
from relyscope.scorers.gate import GatePolicy, GateResult, GateSide, HarnessStats, SandboxStats, evaluate_gate
from relyscope.scorers.review import policy_for, review_group
from relyscope.shadow.grading import harness_check
from relyscope.store.shadow import RAN, TARGET_FAILED, ShadowLedger

__all__ = ["UnknownVersion", "gate_side", "run_gate", "harness_stats", "MODES"]

MODES = ("shadow", "canary")


class UnknownVersion(LookupError):
    """A gate side names an agent version with no runs of the needed kind."""


def gate_side(trials: Sequence[Trial], policy: Any, label: str) -> GateSide:
    """Grade one side (its safety policy, if it covers the agent) into a :class:`GateSide`."""
    pol = policy_for(policy, trials[0].agent_name) if trials and policy is not None else None
    rv = review_group(trials, pol)
    critical: dict[str, int] = {}
    forbidden: dict[str, int] = {}
    for tid, g in rv.grades.items():
        crit = sum(1 for v in g.violations if str(getattr(v.severity, "value", v.severity)) == "critical")
        forb = sum(1 for v in g.violations if v.rule_type == "forbidden_tool" and not v.attempted)
        if crit:
            critical[tid] = crit
        if forb:
            forbidden[tid] = forb
    measured = pol is not None  # no policy: safety unknown (None), never "0 violations"
    return GateSide(trials=list(trials), severities=rv.severities if measured else None,
                    critical=critical if measured else None,
                    committed_forbidden=forbidden if measured else None, invalid=rv.invalid, label=label)


def run_gate(load: Callable[..., list[Trial]], store: Any, *, baseline: str, candidate: str,
             policy: GatePolicy, safety_policy: Any = None, agent: str | None = None,
             mode: str = "shadow", since_s: float | None = None) -> tuple[GateResult, dict[str, Any]]:
    """Gate ``candidate`` against ``baseline`` (agent versions).

    ``load(agent=…, version=…, run_kind=…)`` returns trials with outcomes resolved (metrics.md §6,
    replays by side-effect equivalence) — the pipeline's loader. ``agent``: needed when several
    agents have these versions. Returns ``(result, experiment)``: the verdict, and what the
    experiment was — agent, run kinds, sandbox-miss and harness figures (also when they passed),
    and ``pending_replays`` (replays of either version still scheduled or running: the verdict may
    still move). ``since_s`` (Unix seconds) scopes the experiment: only replays scheduled at or
    after it (their runs, sandbox and pending counts; in canary mode: runs that ended at or after
    it) count — so a second experiment on the same versions (a fixed sandbox, a re-run) is not
    mixed with the first, and no experiment is cut in two by when its replays happened to end. Raises
    UnknownVersion, ValueError (bad mode), StoreUnavailable.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    base_kind, cand_kind = ("shadow", "shadow") if mode == "shadow" else ("production", "canary")
    if mode == "shadow":  # replays may run as canary kind when so configured
        kinds = _kinds_of(store, agent)
        if ("shadow" not in kinds) and "canary" in kinds:
            base_kind = cand_kind = "canary"
    sides = {}
    for label, version, kind in (("baseline", baseline, base_kind), ("candidate", candidate, cand_kind)):
        scope: dict[str, Any] = {"version": version, "run_kind": kind}
        if agent:
            scope["agent"] = agent
        if since_s is not None and mode != "shadow":
            scope["since_ns"] = int(since_s * 1e9)
        trials = load(**scope)
        if since_s is not None and mode == "shadow":  # replays by when they were scheduled
            traces = ShadowLedger(store).replay_traces_since(version, since_s, agent=agent)
            trials = [t for t in trials if t.trace_id in traces]
        agents = sorted({t.agent_name for t in trials})
        if not trials and since_s is not None and mode == "shadow":
            raise UnknownVersion(f"{label} version {version!r} has no {kind} replays"
                                 + (f" of agent {agent!r}" if agent else "")
                                 + f" scheduled since {_iso(since_s)}" + _known_replay_versions(store, since_s))
        if not trials:
            raise UnknownVersion(f"{label} version {version!r} has no {kind} runs"
                                 + (f" of agent {agent!r}" if agent else "")
                                 + (f" since {_iso(since_s)}" if since_s is not None else "")
                                 + _known_versions(store, kind, since_s))
        if len(agents) > 1:
            raise UnknownVersion(f"{label} version {version!r} has {kind} runs of several agents "
                                 f"({', '.join(agents)}): name one with --agent")
        sides[label] = trials
    b_side = gate_side(sides["baseline"], safety_policy, "baseline")
    c_side = gate_side(sides["candidate"], safety_policy, "candidate")
    sandbox = harness = None
    a = agent or sides["candidate"][0].agent_name
    experiment: dict[str, Any] = {"agent": a, "run_kinds": {"baseline": base_kind, "candidate": cand_kind},
                                  "pending_replays": 0, "sandbox": None, "harness": None,
                                  "since": None if since_s is None else _iso(since_s)}
    if mode == "shadow":
        ledger = ShadowLedger(store)
        n_b, m_b = ledger.sandbox_stats(baseline, agent=a, since_s=since_s)
        n_c, m_c = ledger.sandbox_stats(candidate, agent=a, since_s=since_s)
        # each side on its own: pooling would let a baseline without misses hide the candidate's
        sandbox = max((SandboxStats(replays=n, sandbox_misses=m) for n, m in ((n_b, m_b), (n_c, m_c))),
                      key=lambda x: (x.miss_rate if x.replays else -1.0))
        replays = sides["baseline"] + sides["candidate"]
        prod_ids = {t.shadow_of for t in replays if t.shadow_of}
        prods = {t.trial_id: t for t in load(trial_ids=prod_ids)} if prod_ids else {}
        incumbent = {p.agent_version for p in prods.values()}
        tasks = {t.task_id for t in replays if t.agent_version in incumbent}
        # every production run of the incumbent on these tasks: other runs of a task measure the
        # agent's own consistency there (each replayed run is left out of its own replay's rate)
        runs = [t for t in load(agent=a, run_kind="production", task_ids=tasks)
                if t.agent_version in incumbent] if tasks else []
        harness = harness_stats(replays, prods, runs)
        pending = [r for v in (baseline, candidate)
                   for r in ledger.replays(status=("scheduled", "running"), target_version=v, agent=a,
                                           limit=100_000, since_s=since_s)]
        experiment["pending_replays"] = len(pending)
        experiment["sandbox"] = {"replays": sandbox.replays, "sandbox_misses": sandbox.sandbox_misses,
                                 "miss_rate": None if not sandbox.replays else sandbox.miss_rate,
                                 "max": policy.max_sandbox_miss_rate}
        if harness is not None:
            experiment["harness"] = {"replays": harness.replays, "agreeing": harness.agreeing,
                                     "expected": round(harness.expected, 3),
                                     "relative_agreement": round(harness.relative_agreement, 4),
                                     "upper_bound": round(harness.relative_agreement_upper, 4),
                                     "conservative_replays": harness.conservative,
                                     "min": policy.min_harness_agreement}
    return evaluate_gate(b_side, c_side, policy, sandbox=sandbox, harness=harness), experiment


def harness_stats(replays: Sequence[Trial], productions: Mapping[str, Trial],
                  production_runs: Sequence[Trial]) -> HarnessStats | None:
    """The gate's harness figures: :func:`relyscope.shadow.grading.harness_check` over resolved
    ``replays``, the replayed ``productions`` (trial id → trial) and the incumbent's
    ``production_runs`` of the replayed tasks; None when no replay counts (not measured)."""
    hc = harness_check(replays, productions, production_runs)
    if not hc.replays:
        return None
    return HarnessStats(replays=hc.replays, agreeing=hc.agreeing, expected=min(hc.expected, hc.replays),
                        variance=hc.variance, conservative=hc.conservative)


# DateTime64(9), which the store's run times are compared in, ends in 2262
_SINCE_MAX_S = 9_223_372_036.0


def parse_since(value: str | float | None, *, now: float | None = None) -> float | None:
    """The start of an experiment's scope, Unix seconds: a duration back from now (``"90m"``,
    ``"2h"``, ``"1d"``: ``<n>s|m|h|d``, n > 0), an ISO 8601 time (``"2026-12-01T10:00:00Z"``; no
    zone means UTC) or Unix seconds (a number). None → None (no scope). Raises ValueError saying
    what to change: an unknown form, a zero duration, a time that is not finite or lies outside
    1970–2262 (what the store's timestamps can hold)."""
    import datetime as _dt
    import math

    from relyscope.scoring.windows import parse_window

    if value is None:
        return None
    now = time.time() if now is None else now
    t: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        t = float(value)
    else:
        text = str(value).strip()
        try:
            t = float(text)
        except ValueError:
            pass
        if t is None and (text[:1].isdigit() and text[-1:] in "smhd" and text[:-1].isdigit()):
            try:
                _, length = parse_window(text)
            except ValueError as e:
                raise ValueError(f"since {text[:40]!r}: a duration must be more than 0 and at most 100 years "
                                 f"(90m, 2h, 1d): {e}") from None
            t = now - float(length)
        if t is None:
            try:
                d = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"since {value!r}: give a duration back from now (90m, 2h, 1d), an ISO 8601 "
                                 f"time (2026-12-01T10:00:00Z) or Unix seconds") from None
            if d.tzinfo is None:
                d = d.replace(tzinfo=_dt.timezone.utc)
            t = d.timestamp()
    if not math.isfinite(t) or not 0 <= t <= _SINCE_MAX_S:
        raise ValueError(f"since {value!r}: the time must lie between 1970-01-01 and 2262-04-11 "
                         f"(Unix seconds 0 to {_SINCE_MAX_S:.0f}); a duration back from now (2h) is simplest")
    return t


def _iso(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def _kinds_of(store: Any, agent: str | None) -> set[str]:
    where, params = "status != 'superseded'", {}
    if agent:
        where += " AND agent = %(a)s"
        params["a"] = agent
    return {r[0] for r in store.query(f"SELECT DISTINCT run_kind FROM {{db}}.trials FINAL WHERE {where}", params)}


def _known_versions(store: Any, kind: str, since_s: float | None = None) -> str:
    """The tail of an UnknownVersion message: the versions with ``kind`` runs — within the scope
    when ``since_s`` is given (a list of all-time counts would contradict "no runs since"), and
    those with runs before it only, with the time their last run ended."""
    since_ns = 0 if since_s is None else int(since_s * 1e9)
    rows = store.query("SELECT agent, version, countIf(end_time >= fromUnixTimestamp64Nano(%(s)s)), "
                       "toUnixTimestamp64Milli(max(end_time)) FROM {db}.trials FINAL WHERE run_kind = %(k)s "
                       "AND status != 'superseded' GROUP BY agent, version ORDER BY agent, version",
                       {"k": kind, "s": since_ns})
    if not rows:
        return f"; no {kind} runs are stored yet"
    inside = [f"{a} {v} ({_n(int(n), 'run')})" for a, v, n, _ in rows if n]
    before = [f"{a} {v} (last run ended {_iso(int(last) / 1000)})" for a, v, n, last in rows if not n]
    if since_s is None:
        return f"; versions with {kind} runs: {', '.join(inside)}"
    out = (f"; versions with {kind} runs since then: {', '.join(inside)}" if inside
           else f"; no version has {kind} runs since then")
    return out + (f"; with {kind} runs before it only: {', '.join(before)}" if before else "")


def _known_replay_versions(store: Any, since_s: float) -> str:
    """The tail of an UnknownVersion message of a shadow gate scoped by ``since_s``: the versions
    with replays that ran (completed, failed, sandbox miss: the ones with a run to gate on)
    scheduled since then, and those with such replays before it only, with when the last was
    scheduled; replays that ended error / timeout at the target are counted apart."""
    rows = store.query("SELECT agent, target_version, countIf(scheduled_at >= fromUnixTimestamp64Milli(%(s)s) "
                       "AND status IN %(ran)s), countIf(scheduled_at >= fromUnixTimestamp64Milli(%(s)s) AND "
                       "status IN %(failed)s), toUnixTimestamp64Milli(maxIf(scheduled_at, status IN %(ran)s)), "
                       "countIf(status IN %(ran)s) FROM {db}.shadow_replays FINAL "
                       "GROUP BY agent, target_version ORDER BY agent, target_version",
                       {"s": int(since_s * 1000), "ran": list(RAN), "failed": list(TARGET_FAILED)})
    if not rows:
        return "; no replays are scheduled yet"
    inside = [f"{a} {v} ({_n(int(n), 'replay')})" for a, v, n, _, _, _ in rows if n]
    failed = [f"{a} {v} ({_n(int(f), 'replay')})" for a, v, _, f, _, _ in rows if f]
    before = [f"{a} {v} (last scheduled {_iso(int(last) / 1000)})" for a, v, n, _, last, ever in rows
              if not n and ever]
    out = (f"; versions with replays that ran, scheduled since then: {', '.join(inside)}" if inside
           else "; no version has replays that ran, scheduled since then")
    out += (f"; ended error / timeout at the target since then: {', '.join(failed)}" if failed else "")
    return out + (f"; with replays that ran before it only: {', '.join(before)}" if before else "")


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
