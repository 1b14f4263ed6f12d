"""The replay plan of one sampled production trial (metrics.md §4).

Per replay target (agent version → URL): nominal × K, each of J prompt rewrites × 1, fault × K,
env × K. Every replay gets a seed and an id derived from (trial id, target version, family,
index) by SHA-256, so planning the same trial twice (a restart, a retry) yields the same plan and
the same ids. A deliberate new experiment on the same trial (``salt``: ``shadow start --again``)
gets new ids and a new experiment id, with the same seeds and inputs (the same perturbations, so
it is comparable with the first try). The prompt rewrites are made once per trial and shared by every target, so baseline
and candidate see the same perturbed inputs (a paired comparison).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from relyscope.model import Trial

__all__ = ["ReplaySpec", "plan_replays", "stable_seed", "FAMILIES"]

FAMILIES = ("nominal", "prompt", "fault", "env")


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from SHA-256 of the parts joined by ``|`` (stable across processes)."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """One planned replay. ``input``: the task input sent (rewritten for family ``prompt``)."""

    replay_id: str
    experiment: str
    shadow_of: str
    task_id: str
    agent: str
    prod_version: str
    target_version: str
    run_kind: str
    family: str
    strength: str | None
    seed: int
    index: int
    input: str | None


def plan_replays(trial: Trial, targets: Sequence[str], *, k: int = 5, j: int = 5,
                 families: Sequence[str] = FAMILIES, env_strength: str = "medium",
                 prompt_strength: str = "mild", run_kind: str = "shadow",
                 rewrite: Callable[[str, int, str], list[str]] | None = None,
                 salt: str = "") -> tuple[list[ReplaySpec], list[str]]:
    """Plan the replays of ``trial`` against each target version in ``targets``.

    ``rewrite(text, seed, strength) -> [J rewrites]`` makes the prompt variants; without it, or
    without a recorded task input, the prompt family is skipped. Returns ``(specs, notes)``; notes
    say what was skipped and why. ``salt`` (non-empty: a new experiment, e.g. its start time) is
    hashed into the replay and experiment ids; ``""`` keeps the ids of the first plan. Raises ValueError for ``k < 1``, ``j < 0`` or an unknown family.
    """
    if k < 1 or j < 0:
        raise ValueError("k must be >= 1 and j >= 0")
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise ValueError(f"unknown perturbation families {bad}; use {FAMILIES}")
    tail = f"|{salt}" if salt else ""
    experiment = hashlib.sha256(f"exp|{trial.trial_id}{tail}".encode()).hexdigest()[:16]
    notes: list[str] = []
    variants: list[str] = []
    if "prompt" in families and j:
        if trial.task_input and rewrite is not None:
            raw = list(rewrite(trial.task_input, stable_seed(trial.trial_id, "prompt"), prompt_strength))[:j]
            # an input the rewriter could not change is no prompt perturbation (R_prompt would be 1
            # by construction): only variants that differ are replayed
            variants = [v for v in raw if v != trial.task_input]
            if len(variants) < len(raw):
                notes.append(f"prompt family: {len(raw) - len(variants)} of {len(raw)} rewrites left the input "
                             "unchanged and were dropped")
        else:
            notes.append("prompt family skipped: " + ("no recorded task input" if not trial.task_input
                                                      else "no prompt rewriter"))
    specs: list[ReplaySpec] = []
    for version in targets:
        for fam in families:
            if fam == "prompt":
                items = [(i, v) for i, v in enumerate(variants)]
            else:
                items = [(i, trial.task_input) for i in range(k)]
            strength = {"env": env_strength, "prompt": prompt_strength}.get(fam)
            for i, text in items:
                rid = hashlib.sha256(f"{trial.trial_id}|{version}|{fam}|{i}{tail}".encode()).hexdigest()[:32]
                specs.append(ReplaySpec(
                    replay_id=rid, experiment=experiment, shadow_of=trial.trial_id, task_id=trial.task_id,
                    agent=trial.agent_name, prod_version=trial.agent_version, target_version=version,
                    run_kind=run_kind, family=fam, strength=strength,
                    seed=stable_seed(trial.trial_id, fam, i), index=i, input=text))
    return specs, notes
