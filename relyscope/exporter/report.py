"""The reliability report (metrics.md §11): group scores → the JSON object ``relyscope report`` prints.

Pure: takes :class:`relyscope.scorers.profile.GroupScore` objects, builds plain dicts.
"""

from __future__ import annotations

import math
from typing import Mapping

from relyscope.scorers.review import pass_hat_k_notes
from relyscope.semconv import FORMULA_SET

__all__ = ["build_report", "METRIC_ORDER", "undefined_metric_notes"]

METRIC_ORDER = ["success_rate", "pass@", "pass^", "unanimity", "C_out", "C_traj_d", "C_traj_s", "C_traj",
                "C_res", "R_Con", "R_fault", "R_env", "R_prompt", "R_Rob", "P_cal", "P_AUROC",
                "P_brier", "R_Pred", "R", "S_comp", "S_harm", "R_Saf"]


def _num(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def _order_key(name: str) -> tuple[int, int]:
    for i, m in enumerate(METRIC_ORDER):
        if m.endswith(("@", "^")) and name.startswith(m):
            return (i, int(name[len(m):]))
        if name == m:
            return (i, 0)
    return (len(METRIC_ORDER), 0)


def build_report(scores: Mapping[tuple[str, str, str], object], extras: Mapping | None = None,
                 window: str | None = None) -> dict:
    """``{"formula_set": "relyscope-v1", "groups": [{agent, version, run_kind, window, tasks, trials,
    invalid_trials, incomplete_trials, metrics: {key: {value, ci, n_tasks}}, sections_scope}]}``;
    ``value`` is null where undefined, ``ci`` the 95 % task-clustered bootstrap interval or null.
    ``extras`` maps a group key to more keys merged into that group (violations, attribution,
    worst tasks, outcome counts, notes; the notes of :func:`relyscope.scorers.review.pass_hat_k_notes`
    and :func:`undefined_metric_notes` are added here, from the metrics shown). ``window``: the scoring window the metrics cover (None:
    all time); offline imports are scored over all time in every window, so theirs says ``all``.
    ``sections_scope`` (what the non-metric sections cover) defaults to the group's window: the
    extras are taken to be built from the same trials unless they say otherwise."""
    groups = []
    for (agent, version, run_kind), gs in sorted(scores.items()):
        metrics = {}
        pending = bool(getattr(gs, "ci_pending", False))
        for name in sorted(gs.metrics, key=_order_key):
            mv = gs.metrics[name]
            ci = None
            if mv.ci is not None and _num(mv.ci[0]) is not None and _num(mv.ci[1]) is not None:
                ci = [float(mv.ci[0]), float(mv.ci[1])]
            metrics[name] = {"value": _num(mv.value), "ci": ci, "n_tasks": int(mv.n_tasks)}
            if ci is not None and getattr(mv, "ci_stale", False):
                metrics[name]["ci_stale"] = True
            if ci is None and pending and metrics[name]["value"] is not None:
                metrics[name]["ci_pending"] = True
        win = "all" if window is None or run_kind == "offline" else window
        g = {"agent": agent, "version": version, "run_kind": run_kind, "window": win, "tasks": gs.tasks,
             "trials": gs.trials, "invalid_trials": gs.invalid_trials,
             "incomplete_trials": getattr(gs, "incomplete_trials", 0), "metrics": metrics}
        if extras and (agent, version, run_kind) in extras:
            g.update(extras[(agent, version, run_kind)])
        g.setdefault("sections_scope", "all time" if win == "all" else f"window {win}")
        # from the metrics shown (this window's), so every report has them: batch, live, offline
        extra_notes = (pass_hat_k_notes(gs.metrics) + undefined_metric_notes(g) + stale_ci_notes(gs, metrics)
                       + ([_PENDING_NOTE] if any(m.get("ci_pending") for m in metrics.values()) else []))
        if getattr(gs, "ci_as_of", None) is not None:
            g["ci_as_of"], g["ci_trials"] = float(gs.ci_as_of), gs.ci_trials
        if extra_notes:
            g["notes"] = list(g.get("notes") or []) + extra_notes
        g.pop("confidence_values", None)
        groups.append(g)
    return {"formula_set": FORMULA_SET, "groups": groups}


_PENDING_NOTE = ("CIs shown as 'pending' are not computed yet: a window's first bootstrap runs beside the "
                 "scoring cycle and is published by a following cycle (RELYSCOPE_SCORE_INTERVAL_S); "
                 "null there means not yet, not undefined")


def stale_ci_notes(gs, metrics: dict, now: float | None = None) -> list[str]:
    """The note of a live window whose intervals are older than its values (``gs.ci_as_of`` set by
    the live scorer): when they were computed, over how many trials, when they are refreshed, and
    which values now lie outside theirs. ``metrics``: the report's metrics of that group."""
    import time

    as_of = getattr(gs, "ci_as_of", None)
    stale = [n for n, m in metrics.items() if m.get("ci_stale")]
    if as_of is None or not stale:
        return []
    age = max(0.0, (time.time() if now is None else now) - as_of)
    ago = f"{age:.0f} s" if age < 120 else (f"{age / 60:.0f} min" if age < 7200 else f"{age / 3600:.1f} h")
    outside = [n for n in stale if metrics[n]["value"] is not None
               and not metrics[n]["ci"][0] <= metrics[n]["value"] <= metrics[n]["ci"][1]]
    note = (f"CIs marked * were computed {ago} ago over {gs.ci_trials:,} trials (now {gs.trials:,}); a window's "
            "CIs are refreshed once RELYSCOPE_SCORE_CI_MIN_CHANGE of its trials changed or after "
            "RELYSCOPE_SCORE_CI_MAX_AGE_S")
    if outside:
        note += f"; outside theirs now: {', '.join(outside)}"
    return [note]


def _undef(metrics: dict, names) -> list[str]:
    return [n for n in names if n in metrics and metrics[n]["value"] is None]


def undefined_metric_notes(g: dict) -> list[str]:
    """Why metrics of one report group show "—" (or a value that measures nothing): safety
    without a policy, predictability without a confidence, robustness without perturbed runs,
    P_AUROC with one outcome class (undefined, metrics.md §5) or with every confidence equal
    (all ties: ½ by the ties-counted-½ rule of metrics.md §5, defined but no ranking).
    ``g``: a group of :func:`build_report` (``metrics``, optional ``outcomes``, ``confidence_values``)."""
    m = g.get("metrics") or {}
    notes = []
    if not g.get("trials"):
        return notes
    oc = g.get("outcomes")
    known = (oc["success"] + oc["failure"]) if oc else None
    safety = _undef(m, ("S_comp", "S_harm", "R_Saf"))
    if safety and len(safety) == len([n for n in ("S_comp", "S_harm", "R_Saf") if n in m]):
        notes.append(f"{', '.join(safety)} undefined: no safety policy applies to agent {g.get('agent')!r} "
                     "— set RELYSCOPE_POLICY_FILE to a policy YAML whose `agent` matches it (README)")
    pred = _undef(m, ("P_cal", "P_AUROC", "P_brier", "R_Pred"))
    qs = g.get("confidence_values")
    if "P_brier" in pred and known != 0:  # without outcomes the no-outcomes note says it
        notes.append(f"{', '.join(pred)} undefined: no trial with a known outcome records a confidence — "
                     "set relyscope.confidence (0–1) on the run's root span")
    elif pred == ["P_AUROC"]:
        notes.append("P_AUROC undefined: every trial with a confidence has the same outcome, and AUROC "
                     "needs both classes (metrics.md §5: undefined with one class only)")
    elif "P_AUROC" in m and m["P_AUROC"]["value"] is not None and qs is not None and len(qs) == 1:
        notes.append(f"every confidence is {qs[0]:g}: all pairs tie, so P_AUROC = 0.5 by the ties-counted-½ "
                     "rule (metrics.md §5) — a constant confidence does not tell successes from failures")
    rob = _undef(m, ("R_fault", "R_env", "R_prompt"))
    if rob:
        fams = ", ".join(n[2:] for n in rob)
        names = ", ".join(rob + _undef(m, ("R_Rob",)))
        measured = [n for n in ("R_fault", "R_env", "R_prompt") if n in m and n not in rob]
        if g.get("run_kind") == "shadow" or measured:
            # replays exist (they are this group): telling the user to configure them misleads
            notes.append(
                f"{names} undefined: these replays have no {fams}-perturbed run with a known outcome — the "
                "family is off (RELYSCOPE_SHADOW_FAMILIES) or its replays were dropped or all ended unknown / "
                "sandbox_miss (`relyscope shadow list`)"
                + ("; prompt rewrites that left the input unchanged are dropped (`relyscope shadow start` "
                   "notes it): a stronger RELYSCOPE_SHADOW_PROMPT_STRENGTH or an LLM rewriter "
                   "(RELYSCOPE_REWRITER_URL) changes short inputs" if "R_prompt" in rob else ""))
        else:
            notes.append(f"{names} undefined: no perturbed (shadow) replays with a known outcome for {fams} "
                         "in this group — production runs are not perturbed: robustness is measured on shadow "
                         "replays and shown in the agent's [shadow] group; configure shadow replays if it has "
                         "none (RELYSCOPE_SHADOW_TARGETS, README \"Shadow replays and release gates\")")
    return notes
