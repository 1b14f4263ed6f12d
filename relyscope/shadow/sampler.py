"""Which finished production trials are replayed (issue: shadow replays, item 1).

A trial is *eligible* when it is a complete production run (not itself a replay) that ended at
least ``quiet_s`` ago (late spans and outcomes have settled). Each eligible trial gets exactly one
:class:`SampleDecision`, deterministic so a retry or a restart decides the same:

- ``not_replayable`` — some tool call has no recorded result (tool content capture is opt-in);
- ``sampled_out`` — ``u(trial_id) >= rate``, with ``u`` a SHA-256 hash of the trial id mapped to
  [0, 1) (the same trial is in or out on every sidecar and after every restart);
- ``over_cap`` — the agent already had ``cap_per_hour`` trials sampled in this clock hour;
- ``sampled`` — replayed.

Pure; the caller (``relyscope.shadow.stage``) records the decisions and keeps the hourly counts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from relyscope.model import Trial
from relyscope.shadow.proxy import replayable

__all__ = ["SampleDecision", "Sampler", "sample_fraction", "DECISIONS"]

DECISIONS = ("sampled", "sampled_out", "not_replayable", "over_cap", "manual")


def sample_fraction(trial_id: str) -> float:
    """``u(trial_id)`` ∈ [0, 1): the first 8 bytes of SHA-256("relyscope.shadow:" + id) / 2⁶⁴."""
    h = hashlib.sha256(("relyscope.shadow:" + trial_id).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class SampleDecision:
    """One decision: ``decision`` in :data:`DECISIONS`, ``reason`` in words."""

    trial_id: str
    agent: str
    version: str
    task_id: str
    decision: str
    reason: str


class Sampler:
    """Args: ``rate`` ∈ [0, 1] (fraction of eligible trials replayed), ``cap_per_hour`` (sampled
    trials per agent per clock hour, ≥ 0), ``quiet_s`` (seconds after a trial's end before it is
    considered). Raises ValueError for values out of range."""

    def __init__(self, rate: float = 0.05, cap_per_hour: int = 20, quiet_s: float = 30.0):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate!r}")
        if cap_per_hour < 0:
            raise ValueError(f"cap_per_hour must be >= 0, got {cap_per_hour!r}")
        if quiet_s < 0:
            raise ValueError(f"quiet_s must be >= 0, got {quiet_s!r}")
        self.rate, self.cap_per_hour, self.quiet_s = rate, cap_per_hour, quiet_s

    def eligible(self, trial: Trial, now_ns: int) -> bool:
        """A complete production run, not a replay, that ended ``quiet_s`` before ``now_ns``."""
        return (trial.run_kind == "production" and trial.status == "complete" and not trial.shadow_of
                and trial.end_ns + int(self.quiet_s * 1e9) <= now_ns)

    def decide(self, trial: Trial, sampled_this_hour: Mapping[str, int]) -> SampleDecision:
        """Decide one eligible trial; ``sampled_this_hour``: agent → trials sampled so far in this
        hour (the caller increments it on ``sampled``)."""
        def d(decision: str, reason: str) -> SampleDecision:
            return SampleDecision(trial.trial_id, trial.agent_name, trial.agent_version, trial.task_id, decision, reason)

        ok, why = replayable(trial)
        if not ok:
            return d("not_replayable", why or "not replayable")
        u = sample_fraction(trial.trial_id)
        if u >= self.rate:
            return d("sampled_out", f"u={u:.4f} >= rate {self.rate:g}")
        if sampled_this_hour.get(trial.agent_name, 0) >= self.cap_per_hour:
            return d("over_cap", f"{self.cap_per_hour} trials of {trial.agent_name} already sampled this hour")
        return d("sampled", f"u={u:.4f} < rate {self.rate:g}")
