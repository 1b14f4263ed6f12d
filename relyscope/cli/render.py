"""Render the reliability report (metrics.md §11 JSON) as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["render_report", "empty_hint", "offline_empty_hint"]

_DIMENSIONS = [
    ("Success", ["success_rate", "pass@*", "pass^*"]),
    ("Consistency", ["unanimity", "C_out", "C_traj_d", "C_traj_s", "C_traj", "C_res", "R_Con"]),
    ("Robustness", ["R_fault", "R_env", "R_prompt", "R_Rob"]),
    ("Predictability", ["P_cal", "P_AUROC", "P_brier", "R_Pred"]),
    ("Overall", ["R"]),
    ("Safety (never averaged in)", ["S_comp", "S_harm", "R_Saf"]),
]


def empty_hint(finalize: dict | None) -> str:
    """Why a report is empty right after spans were sent: a trial is finalized a grace period
    after its root span ends and scored at the next scoring cycle. ``finalize``: the sidecar's
    ``{"grace_period_s", "score_interval_s"}`` when known (the report API sends them)."""
    if finalize:
        g, i = finalize.get("grace_period_s"), finalize.get("score_interval_s")
        when = (f"trials finalize RELYSCOPE_GRACE_PERIOD_S={g:g} s after their root span ends and are "
                f"scored every RELYSCOPE_SCORE_INTERVAL_S={i:g} s")
    else:
        when = ("trials finalize RELYSCOPE_GRACE_PERIOD_S after their root span ends and are scored "
                "every RELYSCOPE_SCORE_INTERVAL_S")
    return f"hint: {when}; POST /api/v1/flush finalizes and scores every open trace now"


def offline_empty_hint(stored: int) -> str:
    """Why ``relyscope score`` found no trial in its input: every trace was finalized at the end
    of the input (no grace period, nothing to flush), so either no span was stored or none of
    them belongs to an agent run relyscope reads. ``stored``: spans stored from the input."""
    if not stored:
        return "hint: no span of the input was stored (the rejected spans are listed above)"
    return (f"hint: none of the {stored} stored spans is part of an agent run: relyscope builds trials from "
            "GenAI spans (gen_ai.operation.name invoke_agent / chat / execute_tool, OpenInference, OpenLLMetry, "
            "… — README \"Point an already-instrumented agent at it\"); every trace of the input was finalized "
            "at its end, so nothing is pending (keep the store with --keep-store DIR to see what was stored)")


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4f}"


def _names(metrics: dict, pattern: str) -> list[str]:
    if pattern.endswith("*"):
        pre = pattern[:-1]
        return sorted((m for m in metrics if m.startswith(pre) and m[len(pre):].isdigit()),
                      key=lambda m: int(m[len(pre):]))
    return [pattern] if pattern in metrics else []


def render_report(rep: dict, console: Console, empty: str | None = None) -> None:
    """One table per (agent, version, run kind): metric, value, 95 % CI, tasks; "—" = undefined.
    ``empty``: what to say when there is no group (``relyscope score``: nothing is pending there),
    instead of the live sidecar's :func:`empty_hint`."""
    if not rep.get("groups"):
        if empty is not None:
            console.print("[yellow]no trials[/yellow]")
            console.print(escape(empty), soft_wrap=True)
            return
        fin = rep.get("finalize") or {}
        if fin.get("scoring_cycles") == 0:  # just started: the stored history is being scored
            console.print("[yellow]no scores yet: the sidecar has not finished its first scoring cycle since it "
                          "started[/yellow]")
            console.print("hint: the first cycle after a start loads every window from the store (seconds for a "
                          "large history); ask again shortly", soft_wrap=True)
            return
        console.print("[yellow]no finalized trials yet[/yellow]")
        console.print(escape(empty_hint(rep.get("finalize"))))
        return
    for g in rep["groups"]:
        oc = g.get("outcomes")
        outcomes = (f" (outcome: {oc['success']} success, {oc['failure']} failure, {oc['unknown']} unknown)"
                    if oc else "")
        win = g.get("window") or rep.get("window") or "all"
        title = escape(f"{g['agent']} {g['version']} [{g['run_kind']}, window {win}] — {g['tasks']} tasks, "
                       f"{g['trials']} trials"
                 f"{outcomes}, {g.get('invalid_trials', 0)} invalid, {g.get('incomplete_trials', 0)} incomplete"
                 f"  (formula set {rep.get('formula_set')})")
        no_outcomes = bool(oc) and not oc["success"] and not oc["failure"]
        t = Table(title=title, title_justify="left")
        t.add_column("dimension")
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_column("95% CI (task-clustered)", justify="right")
        t.add_column("tasks", justify="right")
        m = g["metrics"]
        hidden = 0
        for dim, pats in _DIMENSIONS:
            first = True
            for pat in pats:
                for name in _names(m, pat):
                    mv = m[name]
                    if no_outcomes and mv.get("value") is None:
                        hidden += 1  # a page of "—" says less than the note below
                        continue
                    ci = mv.get("ci")
                    t.add_row(dim if first else "", name, _fmt(mv.get("value")),
                              ("pending" if mv.get("ci_pending") else "—") if not ci
                              else f"[{ci[0]:.3f}, {ci[1]:.3f}]" + ("*" if mv.get("ci_stale") else ""),
                              str(mv.get("n_tasks", 0)))
                    first = False
            if not first:
                t.add_section()
        if t.row_count:
            console.print(t)
        else:
            console.print(f"[bold]{title}[/bold]")
        if hidden:
            console.print(f"({hidden} metrics undefined without outcomes not shown)")
        for note in g.get("notes") or []:
            console.print(f"[yellow]note: {escape(note)}[/yellow]")
        fe = g.get("fault_exposure")
        if fe or g.get("sandbox_miss_trials"):
            console.print(escape(
                (f"fault exposure: {fe['faulted']} of {fe['tool_calls']} tool calls of fault replays "
                 f"got an injected fault ({fe['rate']:.1%}); " if fe else "")
                + f"sandbox misses: {g.get('sandbox_miss_trials', 0)} replays kept out of agent metrics"))
        _render_sections(console, g)
    if rep.get("gates"):
        from relyscope.cli.shadow import render_gate

        for gate in rep["gates"]:
            render_gate(gate, console)


def _table(console: Console, title: str, rows: list[dict]) -> None:
    if not rows:
        return
    t = Table(title=title, title_justify="left")
    cols = list(rows[0].keys())
    for c in cols:
        t.add_column(c.replace("_", " "))
    for r in rows:
        t.add_row(*["—" if r.get(c) is None else (f"{r[c]:.4f}" if isinstance(r[c], float) else
                    _short_list(r[c]) if isinstance(r[c], list) else escape(str(r[c]))) for c in cols])
    console.print(t)


def _first_trace(w: dict) -> str | None:
    """The first failing trace id of a worst task, in full (``GET /api/v1/trials?trace_id=`` and
    ``POST /api/v1/outcomes`` take 32 hex digits), and how many other failing trials it has."""
    ids = w.get("trace_ids") or []
    if not ids:
        return None
    others = max(int(w.get("failing_trials", len(ids))) - 1, 0)
    return ids[0] + (f" (+{others} other failing)" if others else "")


def _short_list(v: list) -> str:
    shown = ", ".join(str(x)[:16] for x in v[:2])
    return shown + (f" (+{len(v) - 2})" if len(v) > 2 else "")


def _render_calibration(console: Console, rows: list[dict], sfx: str = "") -> None:
    """Reliability diagram as a table: per confidence bin, observed success (bar) vs confidence."""
    if not rows:
        return
    t = Table(title=escape(f"calibration (reliability diagram: █ observed success, │ mean confidence){sfx}"),
              title_justify="left")
    for c in ("confidence bin", "trials", "mean conf.", "success"):
        t.add_column(c, justify="right")
    width = 20
    t.add_column("0 … 1", no_wrap=True, min_width=width)
    for r in rows:
        bar = list("█" * round(r["success_rate"] * width) + " " * (width - round(r["success_rate"] * width)))
        mark = min(width - 1, int(r["mean_confidence"] * width))
        bar[mark] = "│"
        t.add_row(r["bin"], str(r["trials"]), f"{r['mean_confidence']:.2f}", f"{r['success_rate']:.2f}", "".join(bar))
    console.print(t)


def _render_sections(console: Console, g: dict) -> None:
    """Calibration, safety violations, failure attribution, control rates and the worst tasks."""
    scope = g.get("sections_scope")
    sfx = f" — {scope}" if scope else ""
    _render_calibration(console, g.get("calibration") or [], sfx)
    _table(console, f"policy violations (by rule and severity){sfx}", g.get("violations") or [])
    if g.get("hard_gate_failures"):
        console.print(f"[bold red]hard-gate failures: {g['hard_gate_failures']} trials{escape(sfx)}[/bold red]")
    if g.get("claim_outcome_mismatches"):
        console.print(f"claim/outcome mismatches: {g['claim_outcome_mismatches']} trials whose claim "
                      f"(relyscope.claimed_success) contradicts their outcome{escape(sfx)}")
    att = g.get("attribution")
    if att:
        rows = [{"measure": k, "value": v} for k, v in att.items() if k != "by_category"]
        rows += [{"measure": f"failures attributed to {k}", "value": v} for k, v in att.get("by_category", {}).items()]
        _table(console, f"failure attribution{sfx}", rows)
    ctl = g.get("control")
    if ctl:
        _table(console, f"control decisions{sfx}", [{"measure": k, "value": v} for k, v in ctl.items()])
    worst = [{"task": w.get("label") or w["task_id"],
              **{k: v for k, v in w.items() if k not in ("task_id", "label", "trace_ids")},
              "failing trace (full id)": _first_trace(w)}
             for w in g.get("worst_tasks") or []]
    _table(console, f"worst tasks (lowest success rate, lowest C_out, most violations){sfx}", worst)


def render_history(data: dict, console: Console, width: int = 30) -> None:
    """A metric over time as one table per group: time, value, 95 % CI, tasks and a bar on [0, 1]."""
    import datetime as _dt

    points = data.get("points") or []
    if not points:
        console.print(f"[yellow]no stored scores for {data.get('metric')}[/yellow]")
        return
    groups: dict[tuple, list] = {}
    for p in points:
        groups.setdefault((p["agent"], p["version"], p["run_kind"]), []).append(p)
    for (agent, version, run_kind), pts in groups.items():
        t = Table(title=escape(f"{data['metric']} over time — {agent} {version} [{run_kind}]"), title_justify="left")
        for c in ("computed (UTC)", "value", "95% CI", "tasks"):
            t.add_column(c, justify="right")
        t.add_column("0 … 1", no_wrap=True, min_width=width)
        for p in pts:
            v = p["value"]
            bar = "—" if v is None else "█" * round(max(0.0, min(1.0, v)) * width)
            ci = p.get("ci")
            t.add_row(_dt.datetime.fromtimestamp(p["time"], _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                      _fmt(v), "—" if not ci or ci[0] is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
                      str(p["n_tasks"]), bar)
        console.print(t)
