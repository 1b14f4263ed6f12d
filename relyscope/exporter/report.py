"""The reliability report (metrics.md §11): group scores → the JSON object ``relyscope report`` prints.

Pure: takes :class:`relyscope.scorers.profile.GroupScore` objects, builds plain dicts.
"""

from __future__ import annotations

import math
from typing import Mapping

from relyscope.semconv import FORMULA_SET

__all__ = ["build_report", "METRIC_ORDER"]

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
    worst tasks, outcome counts, notes). ``window``: the scoring window the metrics cover (None:
    all time); offline imports are scored over all time in every window, so theirs says ``all``.
    ``sections_scope`` (what the non-metric sections cover) defaults to the group's window: the
    extras are taken to be built from the same trials unless they say otherwise."""
    groups = []
    for (agent, version, run_kind), gs in sorted(scores.items()):
        metrics = {}
        for name in sorted(gs.metrics, key=_order_key):
            mv = gs.metrics[name]
            ci = None
            if mv.ci is not None and _num(mv.ci[0]) is not None and _num(mv.ci[1]) is not None:
                ci = [float(mv.ci[0]), float(mv.ci[1])]
            metrics[name] = {"value": _num(mv.value), "ci": ci, "n_tasks": int(mv.n_tasks)}
        win = "all" if window is None or run_kind == "offline" else window
        g = {"agent": agent, "version": version, "run_kind": run_kind, "window": win, "tasks": gs.tasks,
             "trials": gs.trials, "invalid_trials": gs.invalid_trials,
             "incomplete_trials": getattr(gs, "incomplete_trials", 0), "metrics": metrics}
        if extras and (agent, version, run_kind) in extras:
            g.update(extras[(agent, version, run_kind)])
        g.setdefault("sections_scope", "all time" if win == "all" else f"window {win}")
        groups.append(g)
    return {"formula_set": FORMULA_SET, "groups": groups}
