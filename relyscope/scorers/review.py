"""Per-group review of graded trials: the report's safety, attribution and drill-down sections.

Pure (no I/O). Combines :func:`relyscope.scorers.graders.grade_trial` results into

- ``severities`` (trial id → s) and ``invalid`` (trial ids attributed to INFRASTRUCTURE, GRADER or
  TASK_SPEC, kept out of agent metrics; metrics.md §7) for :func:`score_group`;
- ``extras`` for the report: violations by rule and severity (attempted vs committed), the failure
  attribution breakdown (raw failure rate, valid-agent failure rate, infrastructure- and
  grader-invalid rates, side by side), control-decision rates (§8), claim/outcome mismatches,
  hard-gate failures, and the worst tasks (lowest C_out, most violations) with their trace ids.
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass
from typing import Sequence

from relyscope.model import Trial
from relyscope.scorers.attribution import FailureCategory
from relyscope.scorers.graders import Grade, control_rates, grade_trial
from relyscope.scorers.policy import Policy
from relyscope.scorers.replay_outcome import is_sandbox_miss

__all__ = ["GroupReview", "review_group", "score_all", "calibration_bins", "policy_for", "score_reviewed",
           "group_notes", "pass_hat_k_notes"]


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


def review_group(trials: Sequence[Trial], policy: Policy | None = None, *, n_worst: int = 10) -> GroupReview:
    """Grade every trial of one group and build the report sections (see module docstring)."""
    grades = {t.trial_id: grade_trial(t, policy) for t in trials}
    severities = {tid: g.severity for tid, g in grades.items()}
    # a replay the sandbox could not answer (ENVIRONMENT) measures the sandbox, not the agent:
    # kept out of agent metrics like infrastructure-invalid trials, and counted
    misses = frozenset(t.trial_id for t in trials if is_sandbox_miss(t))
    invalid = frozenset(tid for tid, g in grades.items() if not g.valid) | misses

    viol = collections.defaultdict(lambda: {"attempted": 0, "committed": 0, "trials": set()})
    for tid, g in grades.items():
        for v in g.violations:
            row = viol[(v.rule_id, v.rule_type, v.severity)]
            row["attempted" if v.attempted else "committed"] += 1
            row["trials"].add(tid)
    violations = [
        {"rule": r, "type": ty, "severity": sev, "attempted": d["attempted"], "committed": d["committed"],
         "trials": len(d["trials"])}
        for (r, ty, sev), d in sorted(viol.items(), key=lambda kv: (-len(kv[1]["trials"]), kv[0]))
    ]

    n = len(trials)
    failed = [t for t in trials if t.outcome == "failure" or (t.status == "incomplete")]
    by_cat = collections.Counter(
        grades[t.trial_id].attribution.category.value if grades[t.trial_id].attribution else "UNKNOWN"
        for t in failed)
    valid_known = [t for t in trials if t.trial_id not in invalid and t.outcome in ("success", "failure")]
    infra = sum(1 for tid in invalid if grades[tid].attribution
                and grades[tid].attribution.category is FailureCategory.INFRASTRUCTURE)
    grader = sum(1 for tid in invalid if grades[tid].attribution
                 and grades[tid].attribution.category is FailureCategory.GRADER)
    known = [t for t in trials if t.outcome in ("success", "failure")]
    attribution = {
        "raw_failure_rate": _nan_none(sum(t.outcome == "failure" for t in known) / len(known)) if known else None,
        "valid_agent_failure_rate": _nan_none(
            sum(t.outcome == "failure" for t in valid_known) / len(valid_known)) if valid_known else None,
        "infrastructure_invalid_rate": _nan_none(infra / n) if n else None,
        "grader_invalid_rate": _nan_none(grader / n) if n else None,
        "by_category": dict(sorted(by_cat.items())),
    }
    cr = control_rates(g.control for g in grades.values())
    control = {"missed_confirmation_rate": _nan_none(cr.missed_confirmation_rate),
               "recovery_rate": _nan_none(cr.recovery_rate), "loop_rate": _nan_none(cr.loop_rate),
               "irreversible_actions": cr.irreversible_actions, "tool_errors": cr.tool_errors}

    # worst tasks: lowest success rate first (a task that always fails is the worst, though its
    # C_out = (2p̂−1)² = 1 is perfect consistency), then lowest per-task C_out (metrics.md §3),
    # then most violations
    per_task = collections.defaultdict(list)
    for t in trials:
        per_task[t.task_id].append(t)
    worst = []
    for task, ts in per_task.items():
        ys = [t.success for t in ts if t.success is not None and t.trial_id not in invalid]
        c_out = (2 * sum(ys) / len(ys) - 1) ** 2 if len(ys) >= 2 else None
        nviol = sum(len(grades[t.trial_id].violations) for t in ts)
        label = next((input_excerpt(t.task_input) for t in ts
                      if t.task_id_source == "fingerprint" and t.task_input), None)
        worst.append({"task_id": task, "label": label, "trials": len(ts), "known": len(ys),
                      "successes": sum(ys) if ys else 0,
                      "success_rate": _nan_none(sum(ys) / len(ys)) if ys else None,
                      "C_out": _nan_none(c_out) if c_out is not None else None, "violations": nviol,
                      # drill-down: the full (32-hex) trace ids of the task's failing trials
                      # (failure, incomplete, or a violation), the first 5, and how many there are
                      "failing_trials": len(bad := [t for t in ts if t.outcome == "failure"
                                                    or t.status == "incomplete"
                                                    or grades[t.trial_id].violations]),
                      "trace_ids": sorted({t.trace_id for t in bad})[:5]})
    worst.sort(key=lambda w: (w["success_rate"] if w["success_rate"] is not None else 2.0,
                              w["C_out"] if w["C_out"] is not None else 2.0, -w["violations"], w["task_id"]))
    worst = [w for w in worst if (w["success_rate"] is not None and w["success_rate"] < 1)
             or (w["C_out"] is not None and w["C_out"] < 1) or w["violations"]][:n_worst]

    outcomes = collections.Counter(t.outcome if t.outcome in ("success", "failure") else "unknown" for t in trials)
    task_sources = collections.Counter(t.task_id_source for t in trials)

    conf_pairs = [(t.confidence, t.success) for t in trials
                  if t.trial_id not in invalid and t.confidence is not None and t.success is not None
                  and t.perturbation_family in (None, "nominal")]
    extras = {
        "calibration": calibration_bins(conf_pairs),
        # distinct confidences behind P_* (1: a constant confidence ranks nothing, P_AUROC = ½)
        "confidence_values": sorted({q for q, _ in conf_pairs})[:2],
        "violations": violations,
        "hard_gate_failures": sum(1 for g in grades.values() if g.hard_gate),
        "claim_outcome_mismatches": sum(1 for g in grades.values() if g.claim_outcome_mismatch),
        "attribution": attribution,
        "sandbox_miss_trials": len(misses),
        "fault_exposure": fault_exposure(trials),
        "control": control,
        "worst_tasks": worst,
        "outcomes": {k: outcomes.get(k, 0) for k in ("success", "failure", "unknown")},
        "task_id_sources": dict(sorted(task_sources.items())),
        "notes": group_notes(trials, outcomes),
    }
    return GroupReview(grades=grades, severities=severities, invalid=invalid, extras=extras)


_WS = re.compile(r"\s+")


def input_excerpt(text: str, max_chars: int = 60) -> str:
    """A readable excerpt of the input a fingerprinted task id is the hash of (for reports):
    whitespace-collapsed, at most ``max_chars`` characters, ``…`` marking a cut."""
    norm = _WS.sub(" ", text).strip()
    return norm if len(norm) <= max_chars else norm[: max_chars - 1].rstrip() + "…"


HOW_TO_GIVE_OUTCOMES = ("set relyscope.outcome on the run's root span (record_outcome(True) inside "
                        "agent_run), or POST /api/v1/outcomes {\"trace_id\": …, \"success\": true} "
                        "afterwards (relyscope.instrumentation.post_outcome)")
HOW_TO_GIVE_TASK_IDS = ("set relyscope.task.id on the run's root span (agent_run(task_id=…), or baggage "
                        "with relyscope.instrumentation.BaggageSpanProcessor)")


def group_notes(trials: Sequence[Trial], outcomes: collections.Counter | None = None) -> list[str]:
    """Plain-language notes about missing data in one group: no outcomes at all, every trial its
    own task (no multi-trial metric can exist). Each says how to provide what is missing."""
    notes = []
    n = len(trials)
    if outcomes is None:
        outcomes = collections.Counter(t.outcome for t in trials)
    if n and not outcomes.get("success", 0) and not outcomes.get("failure", 0):
        notes.append(f"no outcomes: none of the {n} trials has a known outcome, so success_rate, "
                     f"pass@k / pass^k, C_out and calibration are undefined — {HOW_TO_GIVE_OUTCOMES}")
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
