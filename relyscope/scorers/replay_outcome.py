"""Outcome of a shadow replay by side-effect equivalence (metrics.md §6 item 4), and the sandbox
checks that keep replays honest.

The *side-effect signature* of a trial is the multiset of its side-effecting tool calls
(``write`` / ``irreversible`` by the span or the policy's ``side_effects``), each as (tool name,
canonical JSON arguments), counting only calls that took effect (no error on the step, no
injected fault: a partial / malformed / empty body is a failed call too). A replay
(a trial with ``shadow_of``) whose outcome is still unknown after §6 items 1–3 gets:

- ``success`` if the production run it replays is a verified success and the signatures are equal;
- ``failure`` if that run is a verified success and they differ, or if it is a verified failure
  and they are equal (the replay did exactly what was verified wrong);
- unknown otherwise (a production failure the replay did differently; an unknown production
  outcome). ``outcome_source`` is ``side_effect_equivalence``.

A read-only task has an empty signature: equivalence then only says the replay changed nothing,
so give such tasks a verifier or an evaluation where the answer text matters (README).

Pure, no I/O.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence

from relyscope import semconv as sc
from relyscope.model import Op, Trial
from relyscope.scorers.decisions import canonical_arguments

__all__ = ["side_effect_signature", "equivalence_outcome", "apply_replay_outcomes", "is_sandbox_miss",
           "EQUIVALENCE_SOURCE"]

EQUIVALENCE_SOURCE = "side_effect_equivalence"
_SIDE_EFFECTING = ("write", "irreversible")


def _side_effect(name: str, said: str | None, policy_side_effects: Mapping[str, str] | None) -> str | None:
    if said in _SIDE_EFFECTING:
        return said
    for pat, se in (policy_side_effects or {}).items():
        if se in _SIDE_EFFECTING and fnmatch.fnmatchcase(name, pat):
            return se
    return said


def _numbers(v):
    """JSON numbers by value: 30.0 and 30 are the same argument."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers(x) for x in v]
    return v


def _canonical(arguments) -> str:
    import json

    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return canonical_arguments(_numbers(arguments))


def side_effecting_tools(*trials: Trial) -> frozenset[str]:
    """Tool names any of the trials' spans mark write / irreversible (a replay's own labels and the
    recording's both count: a candidate that newly labels a tool keeps its calls comparable)."""
    return frozenset(s.tool_name for t in trials for s in t.steps
                     if s.op is Op.TOOL and s.tool_name and s.side_effect in _SIDE_EFFECTING)


def side_effect_signature(trial: Trial, policy_side_effects: Mapping[str, str] | None = None,
                          also: frozenset[str] = frozenset()) -> collections.Counter:
    """Multiset of (tool name, canonical arguments, numbers by value) of the trial's
    side-effecting calls that took effect (see the module docstring); ``also``: tool names to
    treat as side-effecting whatever this trial's spans say."""
    sig: collections.Counter = collections.Counter()
    for s in trial.steps:
        # a call that failed did not take effect — an injected fault is a failure whatever its
        # form: a partial / malformed / empty body comes back as a result (no error) yet the
        # call failed, as a timeout or a 500 does (the agent that retries it is the robust one)
        if s.op is not Op.TOOL or not s.tool_name or s.error is not None or s.fault_type is not None:
            continue
        if s.tool_name in also or _side_effect(s.tool_name, s.side_effect, policy_side_effects) in _SIDE_EFFECTING:
            sig[(s.tool_name, _canonical(s.arguments))] += 1
    return sig


def equivalence_outcome(replay: Trial, production: Trial, policy_side_effects: Mapping[str, str] | None = None) -> str | None:
    """``success`` / ``failure`` / None for a replay against the production run it replays. A
    replay whose run ended in error (flag ``root_error``: the agent raised) is a failure whatever
    its side effects — a crash that happened to change nothing did not do the task."""
    if "root_error" in replay.flags:
        return "failure"
    both = side_effecting_tools(replay, production)
    same = (side_effect_signature(replay, policy_side_effects, both)
            == side_effect_signature(production, policy_side_effects, both))
    if production.outcome == "success":
        return "success" if same else "failure"
    if production.outcome == "failure" and same:
        return "failure"
    return None


def is_sandbox_miss(trial: Trial) -> bool:
    """True when some tool call of the trial got the sandbox's ``sandbox_miss`` error."""
    return any(s.error == sc.SANDBOX_MISS for s in trial.steps)


def apply_replay_outcomes(trials: Sequence[Trial], productions: Mapping[str, Trial],
                          policy_side_effects: Mapping[str, str] | None = None) -> list[Trial]:
    """Grade each replay by equivalence with ``productions[t.shadow_of]`` (production trials with
    their outcomes already resolved). Other trials pass unchanged.

    Precedence for replays (a deliberate departure from the order of metrics.md §6): an outcome
    *posted* for the replay itself wins (``outcome_source`` ``posted:…``); otherwise equivalence,
    where it decides, wins over an outcome the replay's own spans carry — the application's
    environment verifier checks a world the sandbox never changed, so its verdict on a replay is
    not evidence. Where equivalence cannot decide, the span's outcome stays."""
    out = []
    for t in trials:
        prod = productions.get(t.shadow_of) if t.shadow_of else None
        posted = (t.outcome_source or "").startswith("posted:")
        if prod is not None and not posted and t.status == "complete" and not is_sandbox_miss(t):
            o = equivalence_outcome(t, prod, policy_side_effects)
            if o is not None:
                t = dataclasses.replace(t, outcome=o, outcome_source=EQUIVALENCE_SOURCE)
        out.append(t)
    return out
