"""Per-group review of graded trials: the report's safety, attribution and drill-down sections.

Pure (no I/O). Combines :func:`relyscope.scorers.graders.grade_trial` results into

- ``severities`` (trial id → s) and ``invalid`` (trial ids attributed to INFRASTRUCTURE, GRADER or
  TASK_SPEC, kept out of agent metrics; metrics.md §7) for :func:`score_group`;
- ``extras`` for the report: violations by rule and severity (attempted vs committed), the failure
  attribution breakdown (raw failure rate, valid-agent failure rate, infrastructure- and
  grader-invalid rates, side by side), control-decision rates (§8), claim/outcome mismatches,
  hard-gate failures, and the worst tasks (lowest C_out, most violations) with their trace ids.

The extras are made in two steps: :func:`trial_facts` keeps of each graded trial what the
sections read (:class:`TrialFacts`), :func:`sections` aggregates them. The live scorer keeps the
facts of each group's most recently stored trials (relyscope.scoring.stage) and aggregates them
without reloading or regrading; :func:`review_group` is both in one (the batch path).
"""

from __future__ import annotations

import collections
import math
import re
import sys
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from relyscope.model import Trial
from relyscope.scorers.attribution import FailureCategory
from relyscope.scorers.graders import Grade, control_rates, grade_trial
from relyscope.scorers.policy import Policy
from relyscope.scorers.replay_outcome import is_sandbox_miss

__all__ = ["GroupReview", "review_group", "TrialFacts", "trial_facts", "sections", "score_all",
           "calibration_bins", "policy_for", "score_reviewed", "group_notes", "pass_hat_k_notes"]


@dataclass(frozen=True)
class GroupReview:
    grades: dict[str, Grade]
    severities: dict[str, float]
    invalid: frozenset[str]
    extras: dict


def _nan_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def calibration_bins(pairs: Sequence[tuple[float, int]], n_bins: int = 10) -> list[dict]:
    """Reliability-diagram rows for P_cal (metrics.md §5: 10 equal-width bins on [0, 1], last bin
    closed): per non-empty bin its range, trial count, mean confidence and observed success rate."""
    rows = []
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        inb = [(q, y) for q, y in pairs if (lo <= q < hi) or (b == n_bins - 1 and q == 1.0)]
        if inb:
            rows.append({"bin": f"{lo:.1f}–{hi:.1f}", "trials": len(inb),
                         "mean_confidence": round(sum(q for q, _ in inb) / len(inb), 6),
                         "success_rate": round(sum(y for _, y in inb) / len(inb), 6)})
    return rows


class TrialFacts(NamedTuple):
    """What the report sections (:func:`sections`) read of one graded trial — no steps, no task
    input (a fingerprinted task's ``label`` excerpt, at most 60 characters, instead), so a live
    group can keep the facts of its most recent trials in memory (bench/bench_review_facts.py
    measures the bytes per fact). Made by :func:`trial_facts`.

    ``outcome`` / ``status`` / ``confidence`` / ``perturbation_family`` / ``task_id_source``: the
    trial's (outcome resolved, metrics.md §6); ``valid`` and ``category``: its grade's validity and
    attribution category (None: no attribution); ``sandbox_miss``: :func:`is_sandbox_miss`;
    ``violations``: (rule id, rule type, severity name, attempted) per violation; the control
    counts of §8 (named as :class:`relyscope.scorers.decisions.ControlStats`, so
    :func:`relyscope.scorers.graders.control_rates` pools them); ``fault_calls`` / ``faulted``:
    tool calls of a ``fault``-family trial and those that got an injected fault (0 otherwise).
    A named tuple: immutable, and cheap to make again from a packed record (the live path)."""

    trial_id: str
    trace_id: str
    task_id: str
    task_id_source: str
    outcome: str
    status: str
    confidence: float | None
    perturbation_family: str | None
    label: str | None
    valid: bool
    sandbox_miss: bool
    category: str | None
    violations: tuple[tuple[str, str, str, bool], ...]
    hard_gate: bool
    claim_outcome_mismatch: bool
    irreversible_actions: int
    missed_confirmations: int
    tool_errors: int
    recovered_errors: int
    has_loop: bool
    fault_calls: int
    faulted: int

    @property
    def success(self) -> int | None:
        """1 / 0 for a known outcome, None for unknown (as :attr:`relyscope.model.Trial.success`)."""
        return 1 if self.outcome == "success" else 0 if self.outcome == "failure" else None

    @property
    def invalid(self) -> bool:
        """Kept out of agent metrics: an invalid grade or a sandbox miss (as :func:`review_group`)."""
        return not self.valid or self.sandbox_miss


_intern = sys.intern


def trial_facts(t: Trial, g: Grade) -> TrialFacts:
    """The :class:`TrialFacts` of trial ``t`` (outcome resolved) graded ``g`` (:func:`grade_trial`).
    Repeated strings (task ids, statuses, rule names) are interned: one copy per process."""
    calls = faulted = 0
    if t.perturbation_family == "fault":
        for s in t.steps:
            if s.tool_name and (s.op.value == "tool"):
                calls += 1
                faulted += s.fault_type is not None
    c = g.control
    return TrialFacts(
        trial_id=t.trial_id, trace_id=t.trace_id, task_id=_intern(t.task_id),
        task_id_source=_intern(t.task_id_source), outcome=_intern(t.outcome), status=_intern(t.status),
        confidence=t.confidence,
        perturbation_family=_intern(t.perturbation_family) if t.perturbation_family is not None else None,
        label=input_excerpt(t.task_input) if t.task_id_source == "fingerprint" and t.task_input else None,
        valid=bool(g.valid), sandbox_miss=is_sandbox_miss(t),
        category=_intern(g.attribution.category.value) if g.attribution else None,
        violations=tuple((_intern(v.rule_id), _intern(v.rule_type), _intern(v.severity), bool(v.attempted))
                         for v in g.violations),
        hard_gate=bool(g.hard_gate), claim_outcome_mismatch=bool(g.claim_outcome_mismatch),
        irreversible_actions=c.irreversible_actions, missed_confirmations=c.missed_confirmations,
        tool_errors=c.tool_errors, recovered_errors=c.recovered_errors, has_loop=c.has_loop,
        fault_calls=calls, faulted=faulted)


def review_group(trials: Sequence[Trial], policy: Policy | None = None, *, n_worst: int = 10) -> GroupReview:
    """Grade every trial of one group and build the report sections (see module docstring):
    :func:`sections` of the :func:`trial_facts` of each trial, in the order given."""
    grades = {t.trial_id: grade_trial(t, policy) for t in trials}
    severities = {tid: g.severity for tid, g in grades.items()}
    facts = [trial_facts(t, grades[t.trial_id]) for t in trials]
    # a replay the sandbox could not answer (ENVIRONMENT) measures the sandbox, not the agent:
    # kept out of agent metrics like infrastructure-invalid trials, and counted
    invalid = frozenset(tid for tid, g in grades.items() if not g.valid) | frozenset(
        f.trial_id for f in facts if f.sandbox_miss)
    return GroupReview(grades=grades, severities=severities, invalid=invalid,
                       extras=sections(facts, n_worst=n_worst))


def sections(facts: Sequence[TrialFacts], *, n_worst: int = 10) -> dict:
    """The report sections (``extras``, see the module docstring) of one group's trials from their
    :class:`TrialFacts`. Pure; cost O(len(facts)). Order matters where the batch path's does (a
    task's label is its first fingerprinted trial's; ties of the most common task id source): pass
    the facts in the order of the trials (the store's: by trial id)."""
    invalid = {f.trial_id for f in facts if f.invalid}
    misses = sum(1 for f in facts if f.sandbox_miss)

    viol = collections.defaultdict(lambda: {"attempted": 0, "committed": 0, "trials": set()})
    for f in facts:
        for rule, ty, sev, attempted in f.violations:
            row = viol[(rule, ty, sev)]
            row["attempted" if attempted else "committed"] += 1
            row["trials"].add(f.trial_id)
    violations = [
        {"rule": r, "type": ty, "severity": sev, "attempted": d["attempted"], "committed": d["committed"],
         "trials": len(d["trials"])}
        for (r, ty, sev), d in sorted(viol.items(), key=lambda kv: (-len(kv[1]["trials"]), kv[0]))
    ]

    n = len(facts)
    failed = [f for f in facts if f.outcome == "failure" or (f.status == "incomplete")]
    by_cat = collections.Counter(f.category if f.category is not None else "UNKNOWN" for f in failed)
    valid_known = [f for f in facts if f.trial_id not in invalid and f.outcome in ("success", "failure")]
    infra = sum(1 for f in facts if f.invalid and f.category == FailureCategory.INFRASTRUCTURE.value)
    grader = sum(1 for f in facts if f.invalid and f.category == FailureCategory.GRADER.value)
    known = [f for f in facts if f.outcome in ("success", "failure")]
    attribution = {
        "raw_failure_rate": _nan_none(sum(f.outcome == "failure" for f in known) / len(known)) if known else None,
        "valid_agent_failure_rate": _nan_none(
            sum(f.outcome == "failure" for f in valid_known) / len(valid_known)) if valid_known else None,
        "infrastructure_invalid_rate": _nan_none(infra / n) if n else None,
        "grader_invalid_rate": _nan_none(grader / n) if n else None,
        "by_category": dict(sorted(by_cat.items())),
    }
    cr = control_rates(facts)
    control = {"missed_confirmation_rate": _nan_none(cr.missed_confirmation_rate),
               "recovery_rate": _nan_none(cr.recovery_rate), "loop_rate": _nan_none(cr.loop_rate),
               "irreversible_actions": cr.irreversible_actions, "tool_errors": cr.tool_errors}

    # worst tasks: lowest success rate first (a task that always fails is the worst, though its
    # C_out = (2p̂−1)² = 1 is perfect consistency), then lowest per-task C_out (metrics.md §3),
    # then most violations
    per_task = collections.defaultdict(list)
    for f in facts:
        per_task[f.task_id].append(f)
    worst = []
    for task, fs in per_task.items():
        ys = [f.success for f in fs if f.success is not None and f.trial_id not in invalid]
        c_out = (2 * sum(ys) / len(ys) - 1) ** 2 if len(ys) >= 2 else None
        nviol = sum(len(f.violations) for f in fs)
        label = next((f.label for f in fs if f.label is not None), None)
        worst.append({"task_id": task, "label": label, "trials": len(fs), "known": len(ys),
                      "successes": sum(ys) if ys else 0,
                      "success_rate": _nan_none(sum(ys) / len(ys)) if ys else None,
                      "C_out": _nan_none(c_out) if c_out is not None else None, "violations": nviol,
                      # drill-down: the full (32-hex) trace ids of the task's failing trials
                      # (failure, incomplete, or a violation), the first 5, and how many there are
                      "failing_trials": len(bad := [f for f in fs if f.outcome == "failure"
                                                    or f.status == "incomplete" or f.violations]),
                      "trace_ids": sorted({f.trace_id for f in bad})[:5]})
    worst.sort(key=lambda w: (w["success_rate"] if w["success_rate"] is not None else 2.0,
                              w["C_out"] if w["C_out"] is not None else 2.0, -w["violations"], w["task_id"]))
    worst = [w for w in worst if (w["success_rate"] is not None and w["success_rate"] < 1)
             or (w["C_out"] is not None and w["C_out"] < 1) or w["violations"]][:n_worst]

    outcomes = collections.Counter(f.outcome if f.outcome in ("success", "failure") else "unknown" for f in facts)
    task_sources = collections.Counter(f.task_id_source for f in facts)

    conf_pairs = [(f.confidence, f.success) for f in facts
                  if f.trial_id not in invalid and f.confidence is not None and f.success is not None
                  and f.perturbation_family in (None, "nominal")]
    calls = sum(f.fault_calls for f in facts)
    faulted = sum(f.faulted for f in facts)
    return {
        "calibration": calibration_bins(conf_pairs),
        # distinct confidences behind P_* (1: a constant confidence ranks nothing, P_AUROC = ½)
        "confidence_values": sorted({q for q, _ in conf_pairs})[:2],
        "violations": violations,
        "hard_gate_failures": sum(1 for f in facts if f.hard_gate),
        "claim_outcome_mismatches": sum(1 for f in facts if f.claim_outcome_mismatch),
        "attribution": attribution,
        "sandbox_miss_trials": misses,
        # as fault_exposure(trials)
        "fault_exposure": {"tool_calls": calls, "faulted": faulted, "rate": round(faulted / calls, 6)}
        if calls else None,
        "control": control,
        "worst_tasks": worst,
        "outcomes": {k: outcomes.get(k, 0) for k in ("success", "failure", "unknown")},
        "task_id_sources": dict(sorted(task_sources.items())),
        "notes": group_notes(facts, outcomes),
    }


_WS = re.compile(r"\s+")


def input_excerpt(text: str, max_chars: int = 60) -> str:
    """A readable excerpt of the input a fingerprinted task id is the hash of (for reports):
    whitespace-collapsed, at most ``max_chars`` characters, ``…`` marking a cut."""
    norm = _WS.sub(" ", text).strip()
    return norm if len(norm) <= max_chars else norm[: max_chars - 1].rstrip() + "…"


HOW_TO_GIVE_OUTCOMES = ("set relyscope.outcome (success | failure, or a bool) on the run's root span "
                        "(record_outcome(True) inside "
                        "agent_run), or POST /api/v1/outcomes {\"trace_id\": …, \"success\": true} "
                        "afterwards (relyscope.instrumentation.post_outcome)")
HOW_REPLAYS_GET_OUTCOMES = ("a replay is graded by side-effect equivalence with the production run it replays "
                            "(metrics.md §6), and stays unknown where that run's outcome is unknown, or where it "
                            "failed and the replay acted differently: give the production runs outcomes, or the "
                            "replays an evaluation (gen_ai.evaluation.result) or verifier of their own")
HOW_TO_GIVE_TASK_IDS = ("set relyscope.task.id on the run's root span (agent_run(task_id=…), or baggage "
                        "with relyscope.instrumentation.BaggageSpanProcessor)")


def group_notes(trials: Sequence[Trial] | Sequence[TrialFacts],
                outcomes: collections.Counter | None = None) -> list[str]:
    """Plain-language notes about missing data in one group: no outcomes at all, every trial its
    own task (no multi-trial metric can exist). Each says how to provide what is missing."""
    notes = []
    n = len(trials)
    if outcomes is None:
        outcomes = collections.Counter(t.outcome for t in trials)
    if n and not outcomes.get("success", 0) and not outcomes.get("failure", 0):
        notes.append(f"no outcomes: none of the {n} trials has a known outcome, so success_rate, "
                     f"pass@k / pass^k, C_out and calibration are undefined — {HOW_TO_GIVE_OUTCOMES}")
    elif outcomes.get("unknown", 0) and all(t.perturbation_family is not None for t in trials):
        # replays (every trial perturbed or a nominal copy): graded against the production run, not by
        # outcomes posted for them — the production advice alone pointed at the wrong runs
        notes.append(f"{outcomes['unknown']} of {n} replays have an unknown outcome and are left out of success "
                     f"metrics — {HOW_REPLAYS_GET_OUTCOMES}")
    elif outcomes.get("unknown", 0):
        notes.append(f"{outcomes['unknown']} of {n} trials have an unknown outcome and are left out of "
                     f"success metrics — {HOW_TO_GIVE_OUTCOMES}")
    if n >= 2 and len({t.task_id for t in trials}) == n:
        src = collections.Counter(t.task_id_source for t in trials).most_common(1)[0][0]
        notes.append(f"every trial is its own task (task ids from: {src}), so no multi-trial metric "
                     f"(pass^k for k ≥ 2, C_out, C_traj, C_res) can be computed — {HOW_TO_GIVE_TASK_IDS}")
    return notes


def pass_hat_k_notes(metrics: dict) -> list[str]:
    """A note for each k where pass^k rises with k (pass^k of one task never rises with k): the
    mean is over fewer tasks, only those with at least k trials with a known outcome (metrics.md §2)."""
    notes = []
    ks = sorted(int(m[5:]) for m in metrics if m.startswith("pass^") and m[5:].isdigit())
    for a, b in zip(ks, ks[1:]):
        va, vb = metrics[f"pass^{a}"], metrics[f"pass^{b}"]
        if math.isnan(va.value) or math.isnan(vb.value) or vb.value <= va.value + 1e-12:
            continue
        notes.append(f"pass^{b} ({vb.value:.3f}) > pass^{a} ({va.value:.3f}): pass^{b} averages over the "
                     f"{vb.n_tasks} tasks with at least {b} known trials, pass^{a} over {va.n_tasks}; "
                     "compare pass^k only over tasks with n ≥ k")
    return notes


def fault_exposure(trials: Sequence[Trial]) -> dict | None:
    """Effective fault exposure of a group's fault replays (metrics.md §4: relyscope reports it
    because nothing hides faults behind simulated retries): tool calls of ``fault``-family trials,
    how many got an injected fault, and the rate (None without fault replays)."""
    calls = faulted = 0
    for t in trials:
        if t.perturbation_family != "fault":
            continue
        for s in t.steps:
            if s.tool_name and (s.op.value == "tool"):
                calls += 1
                faulted += s.fault_type is not None
    if not calls:
        return None
    return {"tool_calls": calls, "faulted": faulted, "rate": round(faulted / calls, 6)}


def policy_for(policy: Policy | None, agent: str) -> Policy | None:
    """The policy if it applies to ``agent`` (its ``agent`` field: a name or fnmatch glob, ``*``
    for every agent), else None — safety is then not measured for that agent (NaN)."""
    import fnmatch

    if policy is None or fnmatch.fnmatchcase(agent, policy.agent):
        return policy
    return None


def score_reviewed(trials: Sequence[Trial], policy: Policy | None = None, *, n_boot: int = 2000,
                   seed: int = 0, max_k: int | None = 20):
    """Grade and score the trials of one group (agent, version, run kind): the policy applies
    if it covers the group's agent (else safety is not measured: NaN); invalid trials are kept out
    of agent metrics. Returns ``(GroupScore, GroupReview)``."""
    from relyscope.scorers.profile import score_group

    pol = policy_for(policy, trials[0].agent_name) if trials else policy
    rv = review_group(trials, pol)
    gs = score_group(trials, severities=rv.severities if pol is not None else None,
                     invalid=rv.invalid, n_boot=n_boot, seed=seed, max_k=max_k)
    # the pass^k-rises note is added by relyscope.exporter.report.build_report, for every report
    return gs, rv


def score_all(trials: Sequence[Trial], policy: Policy | None = None, *, n_boot: int = 2000,
              seed: int = 0, max_k: int | None = 20) -> tuple[dict, dict]:
    """Group trials by (agent, version, run kind), grade and score each group.

    Returns ``(scores, extras)``: group key → :class:`relyscope.scorers.profile.GroupScore`, and
    group key → report extras (see :func:`review_group`)."""
    groups: dict[tuple[str, str, str], list[Trial]] = collections.defaultdict(list)
    for t in trials:
        groups[(t.agent_name, t.agent_version, t.run_kind)].append(t)
    scores, extras = {}, {}
    for key, ts in groups.items():
        scores[key], rv = score_reviewed(ts, policy, n_boot=n_boot, seed=seed, max_k=max_k)
        extras[key] = rv.extras
    return scores, extras
