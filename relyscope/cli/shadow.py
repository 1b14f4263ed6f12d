"""``relyscope shadow …`` (list, start, pause, resume, show, samples) and ``relyscope gate``: the
operator's surface of shadow replays and release gates, over a running sidecar's API.

``relyscope gate`` exits 0 pass, 1 block, 2 error (invalid experiment, unknown version, bad
policy, sidecar or store unreachable), 3 inconclusive, and prints the reasons.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from relyscope.cli._api import DEFAULT_API, api_option

shadow_app = typer.Typer(no_args_is_help=True, help="Shadow replays of sampled production tasks.")

EXIT = {"pass": 0, "block": 1, "error": 2, "inconclusive": 3}


def _cli():
    from relyscope.cli import main as m

    return m


def _call(method: str, api: str, path: str, token: Optional[str], expect: tuple[str, ...] = (), **kw):
    """One API call; exits 2 with a message on transport errors, 401, and on an answer that is not
    the relyscope API's: a 200 that is no JSON object or lacks a key of ``expect``, a 404 of a
    route the API does not have."""
    import httpx

    m = _cli()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, api.rstrip("/") + path, headers=headers, timeout=kw.pop("timeout", 60), **kw)
    except httpx.ProtocolError as e:  # something listens, but not HTTP/1.1 (an OTLP/gRPC receiver)
        m.err.print(f"[red]{escape(api)} does not answer HTTP/1.1[/red] ({escape(str(e))}): it is not a "
                    f"relyscope management API. {m._PASS_API}")
        raise typer.Exit(2) from None
    except httpx.TransportError as e:
        m.err.print(f"[red]no sidecar answers at {api}:[/red] {e} (start `relyscope serve`, or pass --api URL)")
        raise typer.Exit(2) from None
    if r.status_code == 401:
        m.err.print(f"[red]the sidecar at {api} refused the request:[/red] "
                    + ("the token was refused" if token else "a bearer token is required (--token or RELYSCOPE_AUTH_TOKEN)"))
        raise typer.Exit(2)
    body = m._json_or_none(r)
    # the API's own 404s name what is missing; a route it does not have (another server, the
    # OTLP/HTTP receiver) answers FastAPI's bare "Not Found" or no JSON at all
    foreign = (r.status_code == 200 and (body is None or any(k not in body for k in expect))) or \
        (r.status_code == 404 and (body is None or body.get("detail") == "Not Found"))
    if foreign:
        if body is not None:
            what = f"JSON without {', '.join(repr(k) for k in expect if k not in body)}"
        elif r.status_code == 200 and "json" in r.headers.get("content-type", ""):
            what = "JSON that is not an object"
        else:
            what = f"{r.status_code} {r.headers.get('content-type', 'no content type')}"
        m.err.print(f"[red]{escape(api)} answered {escape(path)} with {escape(what)}:[/red] it is not a relyscope "
                    f"management API ({escape(r.text[:120])!r}). {m._PASS_API}")
        raise typer.Exit(2)
    return r


def _n(n: int, noun: str) -> str:
    """``1 replay``, ``2 replays``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _detail(r) -> str:
    try:
        d = r.json()
    except ValueError:
        return r.text[:300]
    d = d.get("detail") if isinstance(d, dict) else d
    if isinstance(d, list):  # pydantic errors
        return "; ".join(f"{'.'.join(map(str, x.get('loc', [])[1:]))}: {x.get('msg')}" for x in d)
    return str(d)


_API = api_option(DEFAULT_API)
_TOKEN = typer.Option(None, "--token", envvar="RELYSCOPE_AUTH_TOKEN", help="bearer token for the API")


def _format(value: str) -> str:
    """``--format``: table or json (anything else printed the table, exit 0)."""
    if value not in ("table", "json"):
        raise typer.BadParameter(f"table or json, not {value!r}")
    return value


@shadow_app.command("list")
def list_(status: Optional[str] = typer.Option(None, help="only replays with this status"),
          limit: int = typer.Option(50, min=1, max=10000),
          format: str = typer.Option("table", "--format", callback=_format, help="table or json"),
          api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """List replays, newest first, with the shadow state above."""
    m = _cli()
    st = _call("GET", api, "/api/v1/shadow", token, expect=("paused", "targets"))
    if st.status_code != 200:
        m.err.print(f"[red]{_detail(st)}[/red]")
        raise typer.Exit(2)
    params = {"limit": limit, **({"status": status} if status else {})}
    r = _call("GET", api, "/api/v1/shadow/replays", token, ("replays",), params=params)
    if r.status_code != 200:
        m.err.print(f"[red]{_detail(r)}[/red]")
        raise typer.Exit(2)
    if format == "json":
        print(json.dumps({"state": st.json(), **r.json()}, indent=2))
        return
    s = st.json()

    def kv(d: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    m.console.print(f"shadow: {'[yellow]paused[/yellow]' if s['paused'] else 'running'} · targets "
                    f"{', '.join(f'{v} → {u}' for v, u in s['targets'].items()) or 'none'}\n"
                    f"sample decisions: {kv(s['decisions'])}\nreplays: {kv(s['replays'])}")
    t = Table(title="replays")
    rows = r.json()["replays"]
    # the reason a replay ended error / timeout / cancelled (running: which sidecar runs it) — the
    # column only when a listed replay has one
    why = any(row.get("error") and row["status"] != "running" for row in rows)
    for c in ("replay", "of trial", "task", "version", "family", "status", "calls", "exact/pos", "miss", "faults",
              "side effects", *(("error",) if why else ())):
        t.add_column(c, overflow="fold" if c == "error" else "ellipsis")
    for row in rows:
        error = " ".join((row.get("error") or "").split()) if row["status"] != "running" else ""
        error = error if len(error) <= 200 else error[:199] + "…"
        t.add_row(row["replay_id"][:12], row["shadow_of"][:20], row["task_id"][:24], row["target_version"],
                  row["family"] + (f"/{row['strength']}" if row["strength"] else ""), row["status"],
                  str(row["n_calls"]), f"{row['n_exact']}/{row['n_position']}", str(row["n_miss"]),
                  str(row["n_faults"]), str(row["n_side_effects"]), *((escape(error),) if why else ()))
    m.console.print(t)


@shadow_app.command("show")
def show(replay_id: str, api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """One replay with its tool-call log (matches, faults, side effects recorded, never executed).
    REPLAY_ID may be a prefix of one replay id (as `shadow list` prints them); exit 1 when no
    replay id starts with it, 2 when several do (they are listed)."""
    m = _cli()
    r = _call("GET", api, f"/api/v1/shadow/replays/{replay_id}", token, ("replay_id", "calls"))
    if r.status_code != 200:  # 404 none, 409 an ambiguous prefix (with its candidates): ids unbroken
        from rich.markup import escape

        m.err.print(f"[red]{escape(_detail(r))}[/red]", soft_wrap=True, highlight=False)
        raise typer.Exit(1 if r.status_code == 404 else 2)
    row = r.json()
    import datetime as _dt

    def when(x):
        return "—" if x is None else _dt.datetime.fromtimestamp(x, _dt.timezone.utc).isoformat(timespec="seconds")

    head = Table(show_header=False, title=f"replay {row['replay_id']}")
    for k in ("status", "error", "shadow_of", "task_id", "agent", "prod_version", "target_version", "run_kind",
              "family", "strength", "seed", "trace_id", "input"):
        if row.get(k) not in (None, ""):
            head.add_row(k, str(row[k]))
    head.add_row("scheduled / finished", f"{when(row.get('scheduled_at'))} / {when(row.get('finished_at'))}")
    m.console.print(head)
    t = Table(title="tool calls")
    for c in ("#", "tool", "match", "answer", "side effect", "arguments"):
        t.add_column(c)
    for c in row["calls"]:
        ans = c["outcome"] + (f" ({c['fault']})" if c.get("fault") else "")
        if c.get("env_transforms"):
            ans += " env: " + ", ".join(c["env_transforms"])
        t.add_row(str(c["index"]), c["name"], c["match"], ans,
                  (c["side_effect"] or "?") + (" · recorded, not executed" if c["side_effecting"] else ""),
                  json.dumps(c["arguments"], default=str)[:80])
    m.console.print(t)


@shadow_app.command("start")
def start(trial: Optional[list[str]] = typer.Option(None, "--trial", help="production trial id (repeatable)"),
          last: Optional[int] = typer.Option(None, "--last", min=1, max=1000,
                                             help="replay the N most recent replayable runs"),
          tasks: Optional[int] = typer.Option(None, "--tasks", min=1, max=1000,
                                              help="replay the most recent replayable run of each of the N tasks "
                                              "run most recently (one run per task)"),
          again: bool = typer.Option(False, "--again", help="run a new experiment on trials already replayed "
                                     "(new replay ids; they supersede the earlier replays of these trials)"),
          wait: bool = typer.Option(True, "--wait/--no-wait", help="follow the plan with a progress bar"),
          timeout_s: float = typer.Option(900, "--timeout", min=1),
          api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """Replay production trials now (regardless of the sampling rate). Exit 0 done, 1 the sidecar
    is paused (the replays are scheduled and run after `relyscope shadow resume`), 2 error, --timeout,
    nothing to replay (no replayable production run), or no replay ran: every one ended `error` / `timeout` at the targets (the reasons are printed,
    as they are, as a warning, when only some did)."""
    m = _cli()
    if sum(bool(x) for x in (trial, last, tasks)) != 1:
        m.err.print("[red]give one of --trial ID (repeatable), --last N (runs) or --tasks N (one run per task)[/red]")
        raise typer.Exit(2)
    body: dict = {"trial_ids": trial} if trial else {"last": last} if last else {"tasks": tasks}
    if again:
        body["again"] = True
    r = _call("POST", api, "/api/v1/shadow/replays", token, ("replay_ids",), json=body)
    if r.status_code != 200:
        m.err.print(f"[red]{_detail(r)}[/red]")
        raise typer.Exit(2)
    plan = r.json()
    for s in plan["skipped"]:
        m.err.print(f"[yellow]skipped {s['trial_id']}: {s['reason']}[/yellow]")
    more = plan.get("skipped_total", len(plan["skipped"])) - len(plan["skipped"])
    if more > 0:
        m.err.print(f"[yellow]… and {_n(more, 'more skipped run')}[/yellow]")
    for n in plan["notes"]:
        m.err.print(f"note: {n}")
    ids = plan["replay_ids"]
    m.err.print(f"planned {_n(len(ids), 'replay')} of {_n(len(plan['trials']), 'trial')}")
    existing = plan.get("existing") or 0
    if not ids and not existing:
        m.err.print("[red]nothing to replay: no replayable production run was found (a run is replayable when "
                    "its task input and tool calls were recorded: README \"Let the agent be replayed\")[/red]",
                    soft_wrap=True)
        raise typer.Exit(2)
    if existing:
        m.err.print(f"[yellow]{_n(existing, 'replay')} of these trials already "
                    f"{'exists' if existing == 1 else 'exist'}; use --again to run a new experiment[/yellow]",
                    soft_wrap=True)
    if again and ids and plan.get("scheduled_at") is not None:
        import datetime as _dt

        at = _dt.datetime.fromtimestamp(int(plan["scheduled_at"] * 1000) / 1000, _dt.timezone.utc)
        m.err.print(f"new experiment: judge only it with `relyscope gate … --since "
                    f"{at.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}`", soft_wrap=True)
    if ids:
        state = _call("GET", api, "/api/v1/shadow", token, expect=("paused", "targets"))
        if state.status_code == 200 and state.json().get("paused"):
            # a paused sidecar dispatches nothing: waiting would only run out the timeout
            m.err.print("[yellow]shadow dispatch is paused on this sidecar (`relyscope shadow pause` or "
                        "RELYSCOPE_SHADOW_PAUSED=true): the replays are scheduled and run after "
                        "`relyscope shadow resume`[/yellow]", soft_wrap=True)
            if wait:
                raise typer.Exit(1)
    if not wait or not ids:
        return
    deadline = time.monotonic() + timeout_s
    with m._progress() as prog:
        task = prog.add_task("replaying", total=len(ids))
        while True:
            res = _call("POST", api, "/api/v1/shadow/status", token, ("by_status",), json={"replay_ids": ids}).json()
            st = res["by_status"]
            open_ = st.get("scheduled", 0) + st.get("running", 0)
            prog.update(task, completed=len(ids) - open_)
            if not open_:
                break
            if time.monotonic() > deadline:
                m.err.print(f"[red]replays still open after {timeout_s:g} s: {st}[/red]")
                raise typer.Exit(2)
            time.sleep(0.5)
    m.console.print("replays finished: " + ", ".join(f"{k} {v}" for k, v in sorted(st.items())))
    failed = sum(st.get(k, 0) for k in ("error", "timeout"))
    if failed:
        ran = sum(st.get(k, 0) for k in ("completed", "failed", "sandbox_miss"))
        colour = "yellow" if ran else "red"
        for e in res.get("errors") or []:
            m.err.print(f"[{colour}]{_n(e['count'], 'replay')} {e['status']}: {escape(e['error'])}[/{colour}]", soft_wrap=True)
        if not ran:
            m.err.print("[red]no replay ran: the targets failed every one (RELYSCOPE_SHADOW_TARGETS, "
                        "runbook RelyscopeReplayTargetFailing); nothing to gate on[/red]", soft_wrap=True)
            raise typer.Exit(2)


def _pause_or_resume(what: str, api: str, token: Optional[str]) -> None:
    """Exit 0 done and saved, 1 done in memory only (a restart forgets it), 2 not done."""
    m = _cli()
    r = _call("POST", api, f"/api/v1/shadow/{what}", token)
    if r.status_code != 200:
        m.err.print(f"[red]{what} failed ({r.status_code}):[/red] {_detail(r)}")
        raise typer.Exit(2)
    body = r.json()
    m.console.print(f"shadow sampling and dispatch {what}d")
    if not body.get("persisted", False):
        m.err.print(f"[yellow]warning: not saved, so the {what} will not survive a restart: "
                    f"{body.get('reason') or 'no reason given'}[/yellow]", soft_wrap=True)
        raise typer.Exit(1)


@shadow_app.command("pause")
def pause(api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """Pause automatic sampling and dispatch (replays in flight finish). Exit 0 paused and saved,
    1 paused in memory only (a restart resumes), 2 error."""
    _pause_or_resume("pause", api, token)


@shadow_app.command("resume")
def resume(api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """Resume sampling and dispatch. Exit 0 resumed and saved, 1 resumed in memory only (a
    pause kept from before may return at a restart), 2 error."""
    _pause_or_resume("resume", api, token)


@shadow_app.command("samples")
def samples(decision: Optional[str] = typer.Option(None), limit: int = typer.Option(50, min=1),
            api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """Sample decisions with their reasons (sampled, sampled_out, not_replayable, over_cap, manual)."""
    m = _cli()
    r = _call("GET", api, "/api/v1/shadow/samples", token, ("samples",), params={"limit": limit, **({"decision": decision} if decision else {})})
    if r.status_code != 200:  # e.g. 422 naming the decisions there are
        m.err.print(f"[red]{_detail(r)}[/red]")
        raise typer.Exit(2)
    t = Table(title="sample decisions")
    for c in ("trial", "agent", "version", "task", "decision", "reason"):
        t.add_column(c)
    for s in r.json()["samples"]:
        t.add_row(s["trial_id"][:24], s["agent"], s["version"], s["task_id"][:24], s["decision"], s["reason"])
    m.console.print(t)


def gate(baseline: str = typer.Option(..., "--baseline", help="the version in production (the incumbent)"),
         candidate: str = typer.Option(..., "--candidate", help="the version to release"),
         policy: Optional[Path] = typer.Option(None, "--policy", help="gate thresholds YAML relative to the sidecar's "
                                               "configured policy: keys given replace the configured ones, "
                                               "`metrics: {C_out: null}` removes a metric, the rest stays as "
                                               "configured. A policy that differs is a what-if: its verdict is "
                                               "printed, not published to the gauge, report or alerts"),
         agent: Optional[str] = typer.Option(None, "--agent", help="agent name (when several have these versions)"),
         mode: str = typer.Option("shadow", "--mode", help="shadow (replays) or canary (canary traffic vs production)"),
         since: Optional[str] = typer.Option(None, "--since", help="scope of the experiment: only runs and replays "
                                             "since then count (a duration back from now like 2h, an ISO 8601 "
                                             "time or Unix seconds)"),
         format: str = typer.Option("table", "--format", callback=_format, help="table or json"),
         api: str = _API, token: Optional[str] = _TOKEN) -> None:
    """Release gate (metrics.md §10): exit 0 pass, 1 block, 2 error, 3 inconclusive.

    Without --policy the sidecar's configured policy decides and the verdict is published
    (relyscope_gate_verdict, the report, the RelyscopeCandidateBlocked alert). --policy FILE says
    what differs from the configured policy; its verdict is a what-if, printed and not published."""
    m = _cli()
    body: dict = {"baseline": baseline, "candidate": candidate, "agent": agent, "mode": mode}
    if since is not None:
        from relyscope.shadow.gating import parse_since

        try:
            parse_since(since)  # the message says what to change before anything is sent
        except ValueError as e:
            m.err.print(f"[red]{e}[/red]")
            raise typer.Exit(2) from None
        body["since"] = since
    if policy is not None:
        from relyscope.scorers.gate import GatePolicyError, parse_gate_policy, read_gate_policy_file

        try:
            data = read_gate_policy_file(policy)
            # checked here so a bad file fails naming the file and field before anything is sent;
            # what is sent is the file as written (a dumped policy would restore every default
            # the file does not mention over the sidecar's configured values, and a `null` removal)
            parse_gate_policy(data, origin=str(policy))
        except (GatePolicyError, OSError) as e:
            m.err.print(f"[red]{e}[/red]")
            raise typer.Exit(2) from None
        body["policy"] = data if data is not None else {}
    r = _call("POST", api, "/api/v1/gate", token, ("verdict",), json=body, timeout=300)
    if r.status_code != 200:
        m.err.print(f"[red]gate error ({r.status_code}):[/red] {_detail(r)}")
        if format == "json":  # a script reading stdout gets an answer too, not empty input
            print(json.dumps({"verdict": "error", "exit_code": 2, "status": r.status_code, "error": _detail(r)},
                             indent=2))
        raise typer.Exit(2)
    res = r.json()
    if format == "json":
        print(json.dumps(res, indent=2))
    else:
        render_gate(res, m.console)
    raise typer.Exit(EXIT.get(res["verdict"], 2))


def render_gate(res: dict, console) -> None:
    """The verdict, its reasons and the per-metric deltas as tables."""
    colour = {"pass": "green", "block": "red", "inconclusive": "yellow", "error": "magenta"}[res["verdict"]]
    console.print(f"gate {res.get('agent') or ''} {res.get('baseline')} → {res.get('candidate')} ({res.get('mode')}): "
                  f"[bold {colour}]{res['verdict'].upper()}[/bold {colour}]"
                  + (f" · needs ≈{_n(res['needs_more_tasks'], 'more task')}" if res.get("needs_more_tasks") else ""))
    exp = res.get("experiment") or {}
    if exp.get("pending_replays"):
        console.print(f"[yellow]warning: {exp['pending_replays']} replays of these versions are still scheduled or "
                      "running: the verdict may still change (wait for `relyscope shadow list` to settle)[/yellow]")
    checks = [f"shared tasks {res.get('shared_tasks')}"]
    sb = exp.get("sandbox")
    if sb and sb.get("replays"):
        checks.append(f"sandbox misses {sb['sandbox_misses']} of {sb['replays']} replays of the side that missed "
                      f"most ({sb['miss_rate']:.1%}, max {sb['max']:.0%})")
    hv = exp.get("harness")
    if hv:
        # what the gate compares is the upper bound, not the agreement itself: say which, and the
        # outcome (the gate's own reason decides it, not a re-comparison of rounded figures)
        failed = any(x.get("name") == "harness_agreement" for x in res.get("reasons", []))
        # below min but not provably so (the bound reaches it): "ok" read as a lenient pass
        state = ("[red]FAILED[/red]" if failed else "ok" if hv["relative_agreement"] >= hv["min"]
                 else "[yellow]not refuted[/yellow] (below min, too few replays to tell)")
        checks.append(f"harness {state}: agreement {hv['agreeing']}/{hv['replays']} "
                      f"vs ≈{hv['expected']:.1f} expected ({hv['relative_agreement']:.1%} of expected); "
                      f"its 95% upper bound "
                      f"{hv['upper_bound']:.1%} of expected {'<' if failed else '≥'} min {hv['min']:.0%}"
                      + (f" (expected is a lower bound for {hv['conservative_replays']} of the replays: their tasks "
                         f"ran once in production, so the check is lenient there)" if hv.get("conservative_replays") else ""))
    elif exp:
        checks.append("harness check not measured (no nominal replays of the incumbent)")
    if exp.get("since"):
        checks.insert(0, f"since {exp['since']}")
    console.print("experiment: " + "; ".join(checks))
    if res.get("published"):
        console.print("published: relyscope_gate_verdict, the report and alerts now show this verdict")
    if res.get("what_if"):
        console.print("[yellow]what-if: judged under --policy, which differs from the sidecar's configured policy; "
                      "not published (relyscope_gate_verdict, the report and alerts keep the configured "
                      "policy's verdict)[/yellow]")
    reasons = res.get("reasons", [])
    if res["verdict"] == "pass":  # only notes can remain: say what passed instead of an empty table
        deltas = res.get("deltas") or {}
        passed = sorted(k for k, v in deltas.items() if v.get("verdict") == "pass")
        if passed:
            console.print(f"every check passed; {_n(len(passed), 'gated metric')} within the allowed regression: "
                          + ", ".join(passed))
        else:
            console.print("every check passed, but no gated metric was measured (see the notes)")
        reasons = [x for x in reasons if x["verdict"] == "note"]
    if reasons:
        t = Table(title="notes" if res["verdict"] == "pass" else "reasons")
        for c in ("kind", "name", "verdict", "message"):
            t.add_column(c)
        for x in reasons:
            t.add_row(x["kind"], x["name"], x["verdict"], x["message"])
        console.print(t)
    d = Table(title="candidate − baseline (paired task-clustered bootstrap)")
    for c in ("metric", "baseline", "candidate", "Δ", "95% CI", "tasks"):
        d.add_column(c)

    def f(x):
        return "—" if x is None else f"{x:.3f}"

    for k, v in sorted((res.get("deltas") or {}).items()):
        ci = v.get("ci")
        d.add_row(k, f(v.get("baseline")), f(v.get("candidate")), f(v.get("delta")),
                  "—" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]", str(v.get("n_tasks")))
    console.print(d)
