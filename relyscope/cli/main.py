"""The ``relyscope`` command line: serve, demo, score, import, report.

Every ``serve`` flag is also a ``RELYSCOPE_*`` environment variable (see :mod:`relyscope.config`).
chDB lets one process open a data directory, so ``report`` asks the running sidecar over its API
(``--api URL``) and opens the store itself only when no sidecar answers.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from relyscope.cli._api import DEFAULT_API, api_option, otlp_endpoint
from relyscope.cli._console import EXIT_BROKEN_PIPE, CliConsole

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="relyscope: reliability scoring for AI agents, from OpenTelemetry spans.")
import_app = typer.Typer(no_args_is_help=True, help="Import benchmark results as OTLP spans.")
app.add_typer(import_app, name="import")
from relyscope.cli.quarantine import quarantine_app  # noqa: E402 - a sub-app of its own module

app.add_typer(quarantine_app, name="quarantine")
from relyscope.cli.shadow import gate as _gate_cmd, shadow_app  # noqa: E402

app.add_typer(shadow_app, name="shadow")
app.command("gate")(_gate_cmd)
# piped output is not cut to 80 columns (tables stay readable in logs and files)
console = CliConsole(width=None if sys.stdout.isatty() else 200)
err = CliConsole(stderr=True)


class Fmt(str, enum.Enum):
    table = "table"
    json = "json"


class LogLevel(str, enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"relyscope {version('relyscope')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """relyscope: reliability scoring for AI agents, from OpenTelemetry spans."""



def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=False, disable=not err.is_terminal and os.environ.get("RELYSCOPE_PROGRESS") != "1")


def _settings(**overrides):
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from relyscope.config import Settings, unknown_env_vars

    for name in unknown_env_vars(dict(os.environ)):
        err.print(f"[yellow]warning: {name} is not a relyscope setting (ignored); see relyscope/config.py[/yellow]")
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        lines = [f"  {_setting_source(x, overrides)}: {x['msg']}" for x in e.errors()]
        err.print("[red]invalid configuration:[/red]\n" + "\n".join(lines))
        raise typer.Exit(2) from None
    except SettingsError as e:
        err.print(f"[red]invalid configuration:[/red] {e}. List settings take JSON in the environment, "
                  "e.g. RELYSCOPE_REDACT_DENY='[\"user.email\"]'")
        raise typer.Exit(2) from None


def _is_secret(field: str) -> bool:
    """Whether the Settings field ``field`` holds a secret (a ``SecretStr``: the bearer token, the
    redaction key), whose value an error message must not repeat."""
    from relyscope.config import Settings

    info = Settings.model_fields.get(field)
    return info is not None and "SecretStr" in str(info.annotation)


def _setting_source(error: dict, overrides: dict) -> str:
    """Where the bad value of a Settings validation error came from, as the user set it: the
    command-line option (``--name``, field ``name``) when one was passed, else the environment
    variable ``RELYSCOPE_<FIELD>`` — with the value given (cut at 60 characters)."""
    loc = [str(p) for p in error.get("loc", ())]
    if not loc:
        return "settings"
    field = loc[0]
    given = error.get("input")
    shown = "" if given is None or isinstance(given, dict) else f"={str(given)[:60]!r}"
    if field == "store" and isinstance(given, str):  # a server DSN may hold a password
        from relyscope.store.clickhouse import display_dsn

        shown = f"={display_dsn(given)[:60]!r}"
    elif _is_secret(field):
        shown = " (value not shown)"
    if overrides.get(field) is not None:
        return f"command-line option for {field}{shown}"
    name = "RELYSCOPE_" + field.upper() + "".join(f"__{p.upper()}" for p in loc[1:])
    return f"{name}{shown}"


@app.command()
def serve(
    store: Optional[str] = typer.Option(None, help="ClickHouse DSN (chdb:///path or http://host:8123/db) [RELYSCOPE_STORE]"),
    otlp_grpc: Optional[str] = typer.Option(None, "--otlp-grpc", help="OTLP/gRPC HOST:PORT [RELYSCOPE_OTLP_GRPC]"),
    otlp_http: Optional[str] = typer.Option(None, "--otlp-http", help="OTLP/HTTP HOST:PORT [RELYSCOPE_OTLP_HTTP]"),
    api: Optional[str] = typer.Option(None, "--api", help="management API HOST:PORT [RELYSCOPE_API]"),
    grace_period_s: Optional[float] = typer.Option(None, "--grace-period", help="seconds after the root ends before a trial is finalized"),
    spool_dir: Optional[str] = typer.Option(None, "--spool-dir", help="durable spool directory"),
    policy_file: Optional[str] = typer.Option(None, "--policy", help="safety policy YAML"),
    log_level: LogLevel = typer.Option(LogLevel.info, help="log level"),
) -> None:
    """Run the sidecar until SIGINT/SIGTERM."""
    from relyscope.sidecar import Sidecar

    logging.basicConfig(level=log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    s = _settings(store=store, otlp_grpc=otlp_grpc, otlp_http=otlp_http, api=api,
                  grace_period_s=grace_period_s, spool_dir=spool_dir, policy_file=policy_file)
    # handlers before the "listening" line: a supervisor may stop us the moment it reads it (the
    # default action killed the process without a graceful stop); a signal during start stops
    # right after it
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        sc = Sidecar(s).start()
    except Exception as e:  # noqa: BLE001 - fail fast at start-up with the reason
        err.print(f"[red]cannot start:[/red] {e}")
        raise typer.Exit(1) from None
    from relyscope.store.clickhouse import display_dsn

    # one line a supervisor (or a test) can parse
    print(json.dumps({"event": "listening", "otlp_grpc": sc.otlp_grpc_port, "otlp_http": sc.otlp_http_port,
                      "api": sc.api_port, "store": display_dsn(s.store), "pid": os.getpid()}), flush=True)
    done.wait()
    t0 = time.monotonic()
    sc.stop()
    # the matching line at exit: how the stop went (what is left waits in the spool for the next start)
    left = sc.pipeline.spool.pending_records if sc.pipeline is not None else 0
    try:
        print(json.dumps({"event": "stopped", "seconds": round(time.monotonic() - t0, 2),
                          "spool_records_left": left,
                          "open_traces_left": sc.pipeline.open_traces if sc.pipeline else 0}), flush=True)
    except OSError:  # nobody reads our stdout any more: the stop itself went fine
        pass


def _open_store(dsn: str):
    """:class:`relyscope.store.Store` of ``dsn``, or exit 2 with the reason the store refused it
    (ValueError: a DSN it cannot open as given, a data directory that cannot be made)."""
    from rich.markup import escape

    from relyscope.store import Store

    try:
        return Store(dsn)
    except ValueError as e:
        err.print(f"[red]{escape(str(e))}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None


def _provider(endpoint: str, protocol: str, service_name: str):
    from relyscope.instrumentation import configure

    return configure(endpoint, protocol=protocol, service_name=service_name)


@import_app.command("tau-bench")
def import_tau_bench(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="τ-bench results JSON (list of EnvRunResult)"),
    endpoint: str = typer.Option("http://127.0.0.1:4317", callback=otlp_endpoint,
                                 help="OTLP endpoint of the sidecar (or any collector)"),
    protocol: str = typer.Option("grpc", help="grpc | http/protobuf"),
    out: Optional[Path] = typer.Option(None, help="write OTLP/JSON lines to this file instead of sending"),
) -> None:
    """Replay τ-bench runs as OTLP spans (one invoke_agent root per task × trial)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from relyscope.importers.tau_bench import count_runs, replay_tau_bench

    try:  # the whole file checked before anything is sent
        total = count_runs(str(file))
    except (ValueError, OSError) as e:
        from rich.markup import escape

        err.print(f"[red]cannot import {escape(str(file))}:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if out is not None:
        from relyscope.instrumentation.otlp_json import OTLPJsonFileExporter

        tp = TracerProvider(resource=Resource.create({"service.name": "tau-bench-import"}))
        exporter = OTLPJsonFileExporter(str(out))
        tp.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=512))
    else:
        tp = _provider(endpoint, protocol, "tau-bench-import")

    def progress(done: int) -> None:
        prog.update(task, completed=done)
        if done % 50 == 0:  # the SDK's batch queue drops spans when a burst overfills it: drain it
            tp.force_flush()

    with _progress() as prog:
        task = prog.add_task(f"importing {file.name}", total=total)
        n = replay_tau_bench(str(file), tracer_provider=tp, on_progress=progress)
    tp.force_flush()
    tp.shutdown()
    err.print(f"imported {n} runs from {file} → {out or endpoint}")


def _fetch_report(api: str, token: Optional[str], window: Optional[str] = None) -> Optional[dict]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(api.rstrip("/") + "/api/v1/report", headers=headers, timeout=30,
                      params={"window": window} if window else None)
    except httpx.ProtocolError as e:  # something listens there, but does not speak HTTP/1.1
        _not_http(api, e)
    except httpx.TransportError:
        return None
    if r.status_code == 401:
        _token_error(api, token)
    detail = (_json_or_none(r) or {}).get("detail") if r.status_code == 422 else None
    if window and isinstance(detail, str):  # a window the sidecar does not score: its reason, whole
        from rich.markup import escape

        err.print(f"[red]--window {escape(window)}:[/red] {escape(detail)}")
        raise typer.Exit(2)
    if r.status_code != 200:
        _answered(api, r)
    return _body_of(api, r, "groups")


_PASS_API = f"Pass the sidecar's API address (its RELYSCOPE_API, default {DEFAULT_API}) to --api."


def _answered(api: str, r) -> None:
    """Print what a sidecar's API answered other than 200 and exit 1; a 404 on a known API path
    means the URL is not a relyscope management API (an OTLP/HTTP receiver, a wrong port)."""
    from rich.markup import escape

    if r.status_code == 404 and "/api/v1/" in str(r.request.url):
        err.print(f"[red]{escape(api)} has no {escape(r.request.url.path)} (404):[/red] it is not a relyscope "
                  f"management API — the OTLP/HTTP receiver (:4318) answers 404 here. {_PASS_API}")
    else:
        err.print(f"[red]the sidecar at {escape(api)} answered {r.status_code}:[/red] {escape(r.text[:300])}")
    raise typer.Exit(1)


def _body_of(api: str, r, key: str) -> dict:
    """The JSON object of a 200 answer of a relyscope API, which holds the list ``key``
    (``groups`` of a report, ``points`` of a history); exit 1 naming what answered otherwise —
    another web server at that address answers 200 with HTML or some other JSON."""
    from rich.markup import escape

    d = _json_or_none(r)
    if d is not None and isinstance(d.get(key), list):
        return d
    what = "JSON without a list " + repr(key) if d is not None else f"{r.headers.get('content-type', 'no content type')}"
    err.print(f"[red]{escape(api)} answered {escape(r.request.url.path)} with {escape(what)}:[/red] it is not a "
              f"relyscope management API ({escape(r.text[:120])!r}). {_PASS_API}")
    raise typer.Exit(1)


def _not_http(api: str, e: Exception) -> None:
    """Exit 1: something listens at ``api`` but does not answer HTTP/1.1 (an OTLP/gRPC receiver,
    :4317, speaks HTTP/2 only)."""
    from rich.markup import escape

    err.print(f"[red]{escape(api)} does not answer HTTP/1.1[/red] ({escape(str(e))}): it is not a relyscope "
              f"management API — an OTLP/gRPC receiver (:4317) answers so. {_PASS_API}")
    raise typer.Exit(1)


def _json_or_none(r) -> Optional[dict]:
    try:
        d = r.json()
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def _token_error(api: str, token: Optional[str]) -> None:
    """Exit 2 with the reason of a 401: no token given, or the given one refused."""
    if token:
        err.print(f"[red]the sidecar at {api} refused the token[/red] given by --token / RELYSCOPE_AUTH_TOKEN "
                  "(it is not the sidecar's RELYSCOPE_AUTH_TOKEN)")
    else:
        err.print(f"[red]the sidecar at {api} requires a bearer token:[/red] pass --token or set RELYSCOPE_AUTH_TOKEN")
    raise typer.Exit(2)


def _report_from_store(dsn: str, n_boot: int, policy_file: Optional[str] = None,
                       window: Optional[str] = None) -> dict:
    import time

    from relyscope.scoring.rollup import window_start
    from relyscope.scoring.windows import parse_window
    from relyscope.shadow.grading import load_resolved

    length = parse_window(window)[1] if window else None
    policy_file = policy_file or _settings().policy_file  # RELYSCOPE_POLICY_FILE, as the sidecar reads it
    policy = _load_policy_or_exit(policy_file)
    st = _open_store(dsn)
    try:
        # resolved as the sidecar resolves them, with the judge's verdicts the store holds (if any)
        trials = load_resolved(st, policy, judge=True)
    finally:
        st.close()
    if length is not None:  # the sidecar's alignment; offline imports keep their all-time view
        since = window_start(time.time(), length) * 10**9
        trials = [t for t in trials if t.run_kind == "offline" or t.end_ns >= since]
    rep = _score_trials(trials, n_boot, policy_file, window=window)
    return {**rep, "window": window} if window else rep


def _load_policy_or_exit(policy_file: Optional[str]):
    """The safety policy of ``policy_file`` (None: none); a bad file exits 2 with its error."""
    from relyscope.scorers.policy import PolicyError, load_policy

    if not policy_file:
        return None
    try:
        return load_policy(policy_file)
    except PolicyError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


def _score_trials(trials, n_boot: int, policy_file: Optional[str] = None, window: Optional[str] = None) -> dict:
    from relyscope.exporter.report import build_report
    from relyscope.scorers.review import score_all

    policy = _load_policy_or_exit(policy_file)
    scores, extras = score_all(trials, policy, n_boot=n_boot)
    return build_report(scores, extras, window=window)


@app.command()
def report(
    format: Fmt = typer.Option(Fmt.table, "--format", help="table or json (metrics.md §11 shape)"),
    api: Optional[str] = api_option(),
    store: Optional[str] = typer.Option(None, help="read this store (chdb:///path or http(s)://…/db) instead of "
                                        "asking a sidecar; without it: the sidecar at --api, else RELYSCOPE_STORE"),
    token: Optional[str] = typer.Option(None, envvar="RELYSCOPE_AUTH_TOKEN", help="bearer token for the API"),
    n_boot: int = typer.Option(2000, min=0, help="bootstrap resamples when scoring from the store"),
    window: Optional[str] = typer.Option(None, "--window", help="scoring window: 5m, 1h, 24h, 7d, all, or "
                                         "another of RELYSCOPE_SCORE_WINDOWS (default: the sidecar's primary)"),
) -> None:
    """Print the reliability profile per agent / version / run kind. ``--store`` reads that store
    (an embedded one a running sidecar holds is read through that sidecar's API, checked to be the
    one holding it); without it the sidecar at ``--api`` answers, else the store of
    RELYSCOPE_STORE is read. The header says which source the report came from (JSON:
    ``source``)."""
    if window:
        from relyscope.scoring.windows import parse_window

        try:
            parse_window(window)
        except ValueError as e:
            err.print(f"[red]--window: {e}[/red]")
            raise typer.Exit(2) from None
    if store is not None:
        rep, source = _report_of_store(store, api, token, n_boot, window)
    else:
        api = api or DEFAULT_API
        rep = _fetch_report(api, token, window)
        source = {"from": "sidecar", "api": api, "store": None}
        if rep is None:
            dsn = _local_dsn(_settings().store, api)  # RELYSCOPE_STORE, validated as serve's
            from relyscope.store.clickhouse import display_dsn

            err.print(f"no sidecar at {api}; reading {display_dsn(dsn)}")
            rep = _report_from_store_or_exit(dsn, n_boot, window)
            source = {"from": "store", "api": None, "store": display_dsn(dsn)}
    _print_report({**rep, "source": source}, format, source=source)


def _local_dsn(dsn: str, api: Optional[str]) -> str:
    """``dsn`` with an embedded store's path made absolute (read from the current directory as
    serve does); exit 1 when that directory does not exist."""
    from relyscope.store import chdb_path

    local = chdb_path(dsn)
    if local is None:
        return dsn
    if not Path(local).exists():
        where = f"no sidecar answers at {api} and there" if api else "there"
        err.print(f"[red]{where} is no store at {local}[/red] "
                  "(start `relyscope serve`, or pass --api URL / --store DSN)")
        raise typer.Exit(1)
    return "chdb://" + local


def _report_from_store_or_exit(dsn: str, n_boot: int, window: Optional[str]) -> dict:
    from relyscope.store import StoreUnavailable

    try:
        return _report_from_store(dsn, n_boot, window=window)
    except StoreUnavailable as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None


def _report_of_store(store: str, api: Optional[str], token: Optional[str], n_boot: int,
                     window: Optional[str]) -> tuple[dict, dict]:
    """The report of the store named by ``--store`` and its source. chDB lets one process open a
    data directory: one a running sidecar holds is read through the API of that sidecar
    (``--api``, default :data:`DEFAULT_API`) once its ``/healthz`` says it serves that very
    directory; any other sidecar's report is never taken for it (exit 1 naming both)."""
    from relyscope.store import StoreUnavailable, chdb_path
    from relyscope.store.clickhouse import display_dsn

    dsn = _local_dsn(_settings(store=store).store, None)
    try:
        return _report_from_store(dsn, n_boot, window=window), {"from": "store", "api": None,
                                                                "store": display_dsn(dsn)}
    except StoreUnavailable as e:
        if "in use by another process" not in str(e):
            err.print(f"[red]{e}[/red]")
            raise typer.Exit(1) from None
    a = api or DEFAULT_API
    held = _sidecar_store(a)
    if held is not None and chdb_path(held) is not None and \
            os.path.realpath(chdb_path(held)) == os.path.realpath(chdb_path(dsn)):
        err.print(f"{dsn} is held by the sidecar at {a} (chDB lets one process open a data directory): "
                  "reading it through that sidecar's API")
        rep = _fetch_report(a, token, window)
        if rep is not None:
            return rep, {"from": "sidecar", "api": a, "store": dsn}
    answer = f"serves {held}" if held else "does not answer"
    err.print(f"[red]--store {dsn}: the data directory is in use by another process, and the sidecar at {a} "
              f"{answer}[/red] (pass --api URL of the sidecar that holds it, or stop that process)")
    raise typer.Exit(1)


def _sidecar_store(api: str) -> Optional[str]:
    """The store DSN the sidecar at ``api`` reports on ``/healthz`` (no token needed), None when
    nothing answers there or the answer has none."""
    import httpx

    try:
        r = httpx.get(api.rstrip("/") + "/healthz", timeout=10)
    except httpx.TransportError:
        return None
    d = _json_or_none(r) or {}
    return d.get("store") if isinstance(d.get("store"), str) else None


@app.command()
def history(
    metric: str = typer.Argument(..., help="metric key, e.g. pass^1, C_out, R (metrics.md §11)"),
    api: str = api_option(DEFAULT_API),
    agent: Optional[str] = typer.Option(None), version: Optional[str] = typer.Option(None),
    run_kind: Optional[str] = typer.Option(None, "--run-kind"),
    token: Optional[str] = typer.Option(None, envvar="RELYSCOPE_AUTH_TOKEN", help="bearer token for the API"),
    format: Fmt = typer.Option(Fmt.table, "--format", help="table or json"),
) -> None:
    """One metric over time, per agent / version / run kind, from a running sidecar."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {k: v for k, v in {"metric": metric, "agent": agent, "version": version,
                                "run_kind": run_kind}.items() if v is not None}
    try:
        r = httpx.get(api.rstrip("/") + "/api/v1/history", params=params, headers=headers, timeout=60)
    except httpx.ProtocolError as e:
        _not_http(api, e)
    except httpx.TransportError:
        err.print(f"[red]no sidecar answers at {api}[/red] (start `relyscope serve` or pass --api URL)")
        raise typer.Exit(1) from None
    if r.status_code == 401:
        _token_error(api, token)
    if r.status_code == 422:
        detail = _json_or_none(r)
        valid = (detail or {}).get("detail", {}).get("valid_metrics") if isinstance(
            (detail or {}).get("detail"), dict) else None
        if valid:
            err.print(f"[red]unknown metric {metric[:80]!r}[/red]; valid metric keys include "
                      f"{', '.join(v for v in ('success_rate', 'pass^1', 'C_out', 'P_brier', 'R') if v in valid)} "
                      f"({len(valid)} in all, metrics.md §11)")
            raise typer.Exit(2)
    if r.status_code != 200:
        _answered(api, r)
    data = _body_of(api, r, "points")
    if format.value == "json":
        print(json.dumps(data, indent=2))
        return
    from relyscope.cli.render import render_history

    render_history(data, console)
    filters = {k: v for k, v in params.items() if k != "metric"}
    if not data["points"] and filters:  # say which filter found nothing, and what would find something
        err.print(_history_filter_hint(api, headers, metric, filters))


def _history_filter_hint(api: str, headers: dict, metric: str, filters: dict) -> str:
    """What a history query that found nothing was filtered by, and the groups the same metric has
    scores for (filters match exactly: ``--agent support`` finds no ``support-agent``)."""
    import httpx

    said = ", ".join(f"--{k.replace('_', '-')} {v!r}" for k, v in filters.items())
    try:
        r = httpx.get(api.rstrip("/") + "/api/v1/history", params={"metric": metric}, headers=headers, timeout=60)
        pts = r.json().get("points") or [] if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        pts = []
    groups = sorted({f"--agent {p.get('agent')!r} --version {p.get('version')!r} --run-kind {p.get('run_kind')!r}"
                     for p in pts if isinstance(p, dict)})
    if not groups:
        return f"(filtered by {said}; no group has stored scores for {metric} yet)"
    more = f", … ({len(groups)} in all)" if len(groups) > 5 else ""
    return (f"(filtered by {said}, which match exactly; groups with stored scores for {metric}: "
            + "; ".join(groups[:5]) + more + ")")


@app.command()
def score(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="OTLP/JSON files (one request per file or per line)"),
    format: Fmt = typer.Option(Fmt.table, "--format", help="table or json (metrics.md §11 shape)"),
    n_boot: int = typer.Option(2000, min=0, help="bootstrap resamples (0: no CIs)"),
    policy: Optional[Path] = typer.Option(None, "--policy", exists=True, help="safety policy YAML"),
    keep_store: Optional[Path] = typer.Option(None, "--keep-store", file_okay=False,
                                              help="write the embedded store into this new (or empty) directory "
                                              "and keep it, to inspect what was stored (default: a temporary one)"),
) -> None:
    """Score OTLP/JSON files offline: embedded store, every trial finalized at end of input.
    Each request is decoded, limited and redacted as the sidecar does it (one construction,
    relyscope.collector.decoding.ingest_setup): RELYSCOPE_INGEST_DECODER (fast, the default, or
    legacy), RELYSCOPE_MAX_BODY_BYTES / MAX_ATTRIBUTES / MAX_ATTRIBUTE_LENGTH, RELYSCOPE_REDACT_DENY /
    REDACT_ALLOW / REDACT_PATTERNS / REDACT_KEY (unset: identity tokens agree within the run only).
    What the sidecar would report back (rejected spans, repairs) and how many spans
    were redacted is printed on stderr."""

    from relyscope.collector import fastpath
    from relyscope.collector.decoding import ingest_setup
    from relyscope.collector.normalize import normalize
    from relyscope.collector.otlp import DecodeResult, OTLPRequestError, decode_http
    from relyscope.trajectory import TrajectoryBuilder

    settings = _settings()
    setup = ingest_setup(settings)  # the sidecar's limits, redactor and decode path (relyscope.pipeline)
    if keep_store is not None and keep_store.exists() and any(keep_store.iterdir()):
        err.print(f"[red]--keep-store {keep_store}: not empty (give a new or empty directory)[/red]")
        raise typer.Exit(2)
    tmp = tempfile.mkdtemp(prefix="relyscope-score-") if keep_store is None else None
    data_dir = f"{tmp}/data" if tmp else str(keep_store.resolve())
    builder = TrajectoryBuilder(grace_s=0, root_timeout_s=1e12)
    # summed over the requests: what the sidecar answers in OTLP partial success (rejected spans,
    # their reasons, the repairs of accepted spans) and the spans the redaction policy changed
    tally = DecodeResult()
    stored = redacted = tokenized = 0
    try:
        st = _open_store(f"chdb://{data_dir}")
        bodies = []  # (file, line number or None, body)
        for f in files:
            text = f.read_bytes()
            stripped = text.strip()
            if not stripped:
                err.print(f"[red]{f}: empty file (expected OTLP/JSON: one ExportTraceServiceRequest per file or per line)[/red]")
                raise typer.Exit(1)
            if stripped.startswith(b"{") and b"\n{" in stripped:
                bodies += [(f, i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
            else:
                bodies.append((f, None, stripped))
        with _progress() as prog:
            task = prog.add_task("ingesting", total=len(bodies))
            for f, line, body in bodies:
                try:
                    res = decode_http(body, "application/json", None, setup.limits)
                except OTLPRequestError as e:
                    where = f"{f}:{line}" if line else str(f)
                    err.print(f"[red]{where}: {e.message}[/red]")
                    raise typer.Exit(1) from None
                tally.rejected += res.rejected
                tally.errors += res.errors
                tally.rejected_by_reason.update(res.rejected_by_reason)
                tally.repaired.update(res.repaired)
                tally.attributes_dropped += res.attributes_dropped
                if setup.fast:  # redacted, normalized and laid out as insert columns
                    fastpath.prepare(res, setup.redactor)
                    st.insert_span_columns(res.columns)
                    spans = res.spans
                    builder.add(zip(spans, res.semantics), 0.0)
                else:  # the oracle: redact, row insert, normalize the redacted spans
                    spans = [setup.redactor.apply(s) for s in res.spans]
                    st.insert_spans(spans)
                    builder.add(((s, normalize(s)) for s in spans), 0.0)
                stored += len(spans)
                redacted += sum(1 for s in spans if "redacted" in s.flags)
                tokenized += sum(1 for s in spans if "redacted_identity" in s.flags)
                prog.advance(task)
        from relyscope.scorers.outcomes import apply_outcomes

        st.insert_trials(builder.flush(0.0))
        trials = apply_outcomes(st.load_trials(), {})
        st.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    _print_ingest_summary(stored, tally, redacted, settings, tokenized)
    from relyscope.cli.render import offline_empty_hint

    _print_report(_score_trials(trials, n_boot, str(policy) if policy else None), format,
                  empty=offline_empty_hint(stored))


def _print_ingest_summary(stored: int, tally, redacted: int, settings, tokenized: int = 0) -> None:
    """stderr lines of ``relyscope score``: spans rejected (by reason), the repairs made to stored
    ones (the sidecar's partial-success message, summed over the requests) and the spans the
    redaction policy changed (``tokenized`` of them with an identity value's secret replaced by its
    keyed token). Nothing when nothing was lost, altered or redacted."""
    from rich.markup import escape

    if tally.rejected:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(tally.rejected_by_reason.items()))
        err.print(f"[yellow]{tally.rejected} spans rejected ({escape(reasons)}), {stored} stored[/yellow]",
                  soft_wrap=True)
    msg = tally.error_message()  # reasons (first 10) + "accepted with repairs: …"
    if msg:
        err.print(f"[yellow]ingest: {escape(msg)}[/yellow]", soft_wrap=True)
    if redacted:
        by = [n for n, v in (("RELYSCOPE_REDACT_DENY", settings.redact_deny),
                             ("RELYSCOPE_REDACT_ALLOW", settings.redact_allow),
                             ("RELYSCOPE_REDACT_PATTERNS", settings.redact_patterns)) if v]
        ident = (f"; {tokenized} with identity values tokenized (task / trial / session ids, agent, span name: "
                 "[REDACTED:<hex>], distinct values stay distinct)" if tokenized else "")
        err.print(f"ingest: {redacted} of {stored} spans redacted ({', '.join(by)}) before storage{ident}",
                  soft_wrap=True)


def _print_report(rep: dict, fmt, source: Optional[dict] = None, empty: Optional[str] = None) -> None:
    """``rep`` as JSON or tables; ``source`` (``relyscope report``): where it came from, the first
    line of the tables (JSON: the report's ``source`` field); ``empty``: the hint of a report with
    no group (default: the live sidecar's, :func:`relyscope.cli.render.empty_hint`)."""
    if getattr(fmt, "value", fmt) == "json":
        print(json.dumps(rep, indent=2))
        return
    from relyscope.cli.render import render_report

    if source is not None:
        from rich.markup import escape

        where = (f"the sidecar at {source['api']}" + (f" (it holds {source['store']})" if source.get("store") else "")
                 if source["from"] == "sidecar" else f"store {source['store']}")
        console.print(escape(f"report from {where}"), soft_wrap=True)
    render_report(rep, console, empty=empty)


DEMO_VERSIONS = {"1.0.0": 0.0, "1.0.1": 0.0, "1.1.0": -0.35}
DEMO_K = 3  # replays per family and sampled run in the demo (the product default is K = J = 5)
"""Demo replay targets: the incumbent, an equal candidate (same code) and a worse one (P(final
action right) 0.35 lower)."""


@app.command()
def demo(
    tasks: int = typer.Option(24, min=1, help="tasks of the simulated agent"),
    trials: int = typer.Option(5, min=1, help="trials per task"),
    seed: int = typer.Option(7),
    shadow: bool = typer.Option(True, "--shadow/--no-shadow",
                                help="also replay one run per task against three versions and gate them"),
    data_dir: Path = typer.Option(Path(".relyscope/demo"), help="embedded store of the demo (wiped first)"),
    format: Fmt = typer.Option(Fmt.table, "--format", help="table or json (metrics.md §11 shape)"),
) -> None:
    """Start a sidecar on the embedded store, run a simulated agent against it over OTLP, replay
    its tasks in the shadow sandbox against three agent versions, print the report and the gates."""
    import socket
    import subprocess

    from relyscope.demo.agent import SeededIdGenerator, run_demo
    from relyscope.exporter.report import build_report
    from relyscope.sidecar import Sidecar

    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        target_port = sock.getsockname()[1]
    s = _settings(store=f"chdb://{data_dir.resolve()}/data", spool_dir=str(data_dir.resolve() / "spool"),
                  otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", api="127.0.0.1:0",
                  grace_period_s=0.5, score_interval_s=5.0,
                  policy_file=str(DEMO_POLICY),
                  shadow_targets={v: f"http://127.0.0.1:{target_port}/v/{v}/replay" for v in DEMO_VERSIONS}
                  if shadow else {},
                  shadow_rate=0.0, shadow_k=DEMO_K, shadow_j=DEMO_K, shadow_concurrency=4, shadow_interval_s=0.5,
                  shadow_fault_timeout_s=0.2, shadow_fault_retry_after_s=0.1)
    t0 = time.monotonic()
    sc = Sidecar(s).start()
    target = None
    from relyscope.store.clickhouse import display_dsn

    err.print(f"sidecar up: OTLP gRPC 127.0.0.1:{sc.otlp_grpc_port}, OTLP HTTP 127.0.0.1:{sc.otlp_http_port}, "
              f"API http://127.0.0.1:{sc.api_port}, store {display_dsn(s.store)}")
    try:
        tp = _provider(f"http://127.0.0.1:{sc.otlp_grpc_port}", "grpc", "support-agent")
        tp.id_generator = SeededIdGenerator(seed)  # same ids, plan seeds and verdicts on every run
        summary = run_demo(tp, tasks=tasks, trials=trials, seed=seed)
        tp.force_flush()
        tp.shutdown()
        err.print(f"simulated agent: {summary['runs']} runs, {summary['successes']} successes")
        sc.pipeline.flush(timeout_s=60)
        gates = []
        if shadow:
            target = subprocess.Popen(
                [sys.executable, "-m", "relyscope.demo.target", "--otlp", f"http://127.0.0.1:{sc.otlp_grpc_port}",
                 "--port", str(target_port), "--seed", str(seed),
                 *[a for v, q in DEMO_VERSIONS.items() for a in ("--version", f"{v}={q}")]],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            target.stdout.readline()
            _wait_http(f"http://127.0.0.1:{target_port}/healthz", 30)
            err.print(f"replay target up (pid {target.pid}): versions {', '.join(DEMO_VERSIONS)} at "
                      f"http://127.0.0.1:{target_port}/v/<version>/replay")
            gates = _demo_shadow(sc, seed)
        rep = build_report(sc.pipeline.scores, sc.pipeline.report_extras(sc.pipeline.scores),
                           window=sc.pipeline.scoring.primary_window)
        if gates:
            rep["gates"] = gates
        _print_report(rep, format)
    finally:
        if target is not None:
            target.terminate()
            try:
                target.wait(10)
            except subprocess.TimeoutExpired:
                target.kill()
        sc.stop()
    err.print(f"demo finished in {time.monotonic() - t0:.1f} s")
    print(demo_next_steps(data_dir), file=sys.stderr)  # plain: never wrapped or styled


@app.command("demo-agent")
def demo_agent(
    endpoint: Optional[str] = typer.Option(None, callback=otlp_endpoint,
                                           help="OTLP endpoint of a running sidecar (or of a collector in "
                                           "front of one) [default: http://127.0.0.1:4317 for grpc, "
                                           "http://127.0.0.1:4318 for http/protobuf]"),
    protocol: str = typer.Option("grpc", help="grpc | http/protobuf"),
    tasks: int = typer.Option(24, min=1, help="tasks of the simulated agent"),
    trials: int = typer.Option(5, min=1, help="trials per task"),
    seed: int = typer.Option(7, help="the same seed and --version send the same trace ids: a second run replaces "
                             "the first one's trials; pass another seed for new ones (another --version "
                             "always adds its own)"),
    version: str = typer.Option("1.0.0", help="agent version the runs carry"),
    token: Optional[str] = typer.Option(None, envvar="RELYSCOPE_AUTH_TOKEN",
                                        help="bearer token, when the sidecar sets RELYSCOPE_AUTH_TOKEN"),
) -> None:
    """Run the demo's simulated agent against a sidecar that is already running (`relyscope serve`):
    tasks × trials runs sent over OTLP, then how many spans it acknowledged. Exit 1 when nothing
    listens at the endpoint or a span was not acknowledged."""
    import socket
    from urllib.parse import urlsplit

    from relyscope.demo.agent import SeededIdGenerator, run_demo
    from relyscope.demo.delivery import CountingExporter, EndedSpans
    from relyscope.instrumentation._configure import PROTOCOLS, otlp_exporter

    if protocol not in PROTOCOLS:
        err.print(f"[red]--protocol must be one of {', '.join(PROTOCOLS)}[/red] (got {protocol!r})")
        raise typer.Exit(2)
    if endpoint is None:
        endpoint = "http://127.0.0.1:4317" if protocol == "grpc" else "http://127.0.0.1:4318"
    parts = urlsplit(endpoint)  # checked by otlp_endpoint
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname
    try:  # fail fast: the SDK's exporter would retry each batch for ~10 s and only log
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        err.print(f"[red]nothing listens at {endpoint}[/red] ({e}); start a sidecar with `relyscope serve` "
                  "(OTLP gRPC :4317, HTTP :4318) or pass --endpoint")
        raise typer.Exit(1) from None
    if (protocol, port) in (("grpc", 4318), ("http/protobuf", 4317)):
        err.print(f"[yellow]warning: --protocol {protocol} to port {port}, the sidecar's "
                  f"{'OTLP/HTTP' if port == 4318 else 'OTLP/gRPC'} port by default[/yellow]")
    exporter = CountingExporter(otlp_exporter(endpoint, protocol,
                                               {"authorization": f"Bearer {token}"} if token else None))
    from relyscope.instrumentation import configure

    # the protocol given, so OTEL_EXPORTER_OTLP_PROTOCOL cannot override (or break) it
    tp = configure(exporter=exporter, protocol=protocol, service_name="support-agent", service_version=version)
    ended = EndedSpans()
    tp.add_span_processor(ended)
    tp.id_generator = SeededIdGenerator(seed, stream=version)  # another version: other trace ids

    done, stop = [0], [False]

    class _Stopped(Exception):
        pass

    def on_sigint(signum, frame) -> None:  # noqa: ANN001
        # Ctrl-C: end the run under way and send what has ended. A KeyboardInterrupt inside a flush
        # (which exports in this thread) lost the batch it had taken off the SDK's queue. A second
        # Ctrl-C interrupts at once.
        stop[0] = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def on_run(n: int) -> None:
        done[0] = n
        prog.update(bar, completed=n)
        if n % 20 == 0:  # the SDK's batch queue (2 048 spans) drops spans when a burst overfills it
            tp.force_flush()
        if stop[0]:
            raise _Stopped

    summary = None
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with _progress() as prog:
            bar = prog.add_task(f"simulated agent → {endpoint}", total=tasks * trials)
            try:
                summary = run_demo(tp, tasks=tasks, trials=trials, seed=seed, version=version, on_run=on_run)
            except _Stopped:
                pass
        tp.shutdown()  # run_demo flushed at its end; shutdown exports anything left
    finally:
        signal.signal(signal.SIGINT, previous)
    lost = ended.n - exporter.ok - exporter.failed  # dropped by the SDK before any export
    counts = (f"{ended.n} spans; {exporter.ok} acknowledged by {endpoint}, {exporter.failed} not"
              + (f", {lost} dropped before sending" if lost else ""))
    if summary is None:
        err.print(f"[yellow]interrupted[/yellow] after {done[0]} of {tasks * trials} runs: {counts}")
        raise typer.Exit(130)
    err.print(f"simulated agent: {summary['runs']} runs, {summary['successes']} successes, {counts}")
    if not ended.n:
        err.print("[red]no span was recorded[/red]: is OTEL_SDK_DISABLED or OTEL_TRACES_SAMPLER set in this shell?")
        raise typer.Exit(1)
    if exporter.failed or lost:
        err.print("[red]some spans were not acknowledged[/red]: see the exporter's messages above (a wrong "
                  "--protocol for that port, a missing or wrong --token, the sidecar's backpressure)")
        raise typer.Exit(1)
    default = endpoint in ("http://127.0.0.1:4317", "http://127.0.0.1:4318")
    err.print("scores appear after the sidecar's grace period and its next scoring cycle (by default 5 s and "
              "10 s): `relyscope report`" + ("" if default else " --api HOST:PORT (that sidecar's API; or set "
                                               "RELYSCOPE_API)") + ", or /metrics of the sidecar")


DEMO_POLICY = Path(__file__).resolve().parents[1] / "demo" / "policy.yaml"


def demo_next_steps(data_dir: Path) -> str:
    """What to do after the demo: keep a sidecar running, point an agent at it, where to look."""
    exe = Path(sys.executable).parent / "relyscope"
    if shutil.which("relyscope") == str(exe):
        rs = "relyscope"
    else:  # as the user would type it from here: .venv/bin/relyscope after `make demo`
        rs = os.path.relpath(exe) if exe.resolve().is_relative_to(Path.cwd().resolve()) else str(exe)
    store = f"chdb://{data_dir.resolve()}/data"
    policy = DEMO_POLICY.resolve()
    if policy.is_relative_to(Path.cwd().resolve()):
        policy = policy.relative_to(Path.cwd().resolve())
    return "\n".join([
        "",
        "next steps:",
        f"  keep a sidecar running:   {rs} serve            (OTLP :4317 gRPC / :4318 HTTP, API :9464;",
        "                            embedded store ./.relyscope/data; Ctrl-C stops it, data is kept)",
        f"  browse the demo's data:   {rs} serve --store {store} --policy {policy}",
        "                            (with the demo's safety policy, so gates and S_* read as in the demo)",
        f"  send it the demo's agent: {rs} demo-agent       (while `serve` runs, in another shell)",
        "  point your agent at it:   OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 "
        "(README: \"Point an already-instrumented agent at it\")",
        "  give runs a task and an outcome: README \"First ten minutes with your framework\"",
        f"  replay and gate versions: README \"Shadow replays and release gates\" ({rs} shadow, {rs} gate)",
        f"  the demo's report again:  RELYSCOPE_POLICY_FILE={policy} {rs} report --store {store}",
        f"  with a sidecar running:   {rs} report   ·   http://localhost:9464/docs   ·   "
        "http://localhost:9464/metrics",
    ])


def _wait_http(url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def _demo_shadow(sc, seed: int) -> list[dict]:
    """Replay one run of every task against each demo version, wait, gate 1.0.0 → 1.0.1 and
    1.0.0 → 1.1.0. Returns the two gate results (JSON)."""
    from relyscope.shadow.gating import run_gate
    from relyscope.store.shadow import FINISHED

    pipe = sc.pipeline
    # one run per task, a verified success where the task has one: its replays can all be graded
    # by side-effect equivalence (a replay of a failure that does differently stays unknown)
    first: dict[str, object] = {}
    for t in sorted(pipe.load_trials(run_kind="production"), key=lambda t: (t.outcome != "success", t.start_ns)):
        first.setdefault(t.task_id, t)
    plan = sc.shadow.plan_now(trial_ids=[t.trial_id for t in first.values()])
    ids = plan["replay_ids"]
    err.print(f"shadow: {len(ids)} replays of {len(plan['trials'])} production runs "
              f"(nominal, prompt, fault, env × {DEMO_K} each, for each of {len(DEMO_VERSIONS)} versions)")
    with _progress() as prog:
        task = prog.add_task("replaying", total=len(ids))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = len(sc.shadow.ledger.replays(replay_ids=ids, status=FINISHED, limit=len(ids)))
            prog.update(task, completed=done)
            if done >= len(ids):
                break
            time.sleep(0.5)
    pipe.flush(timeout_s=120)
    out = []
    for cand in ("1.0.1", "1.1.0"):
        res, exp = run_gate(pipe.load_trials, pipe.store, baseline="1.0.0", candidate=cand,
                            policy=pipe.gate_policy, safety_policy=pipe.policy, mode="shadow")
        pipe.gate_results.publish((exp["agent"], "1.0.0", cand, "shadow"), res)
        out.append({**res.to_json(), "baseline": "1.0.0", "candidate": cand, "mode": "shadow",
                    "agent": exp["agent"], "experiment": exp})
    return out


@app.command()
def schema(
    cluster: Optional[str] = typer.Option(None, "--cluster", help="print the ClickHouse cluster variant for this "
                                          "cluster name (ON CLUSTER, Replicated*MergeTree, <table>_dist Distributed tables)"),
    database: str = typer.Option("relyscope", "--database", help="database the statements create and use"),
    zk_path: str = typer.Option("/clickhouse/tables/{shard}/{database}/{table}", "--zk-path",
                                help="Keeper path of the replicated tables ({shard}/{database}/{table} macros)"),
) -> None:
    """Print every table and view of a relyscope store as ClickHouse DDL (statements end with ';',
    for clickhouse-client --multiquery), with the retention TTLs of the current settings
    (RELYSCOPE_SPANS_TTL_DAYS, RELYSCOPE_TRIALS_TTL_DAYS, …)."""
    from relyscope.store.schema import Retention, check_database, check_zk_path, cluster_schema, statements

    # checked before anything is printed: each goes into the DDL verbatim (BadParameter: exit 2)
    for check, value, opt in ((check_database, database, "--database"), (check_zk_path, zk_path, "--zk-path")):
        try:
            check(value)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint=opt) from None
    if cluster is not None and not cluster.strip():
        raise typer.BadParameter("empty cluster name (omit --cluster for the single-node DDL)", param_hint="--cluster")
    ret = Retention.from_settings(_settings())
    try:
        ddl = cluster_schema(cluster, ret, zk_path=zk_path) if cluster is not None else statements(ret)
    except ValueError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    for stmt in ddl:
        print(stmt.replace("{db}", database).strip() + ";\n")


def main() -> None:  # console-script entry point
    stdout = sys.stdout
    try:
        app()
    except SystemExit as e:
        # click answers a write to a closed pipe (EPIPE) by swapping sys.stdout for a wrapper that
        # silences the final flush, then exit 1: that swap tells it from a command's own exit 1
        if e.code == 1 and sys.stdout is not stdout:
            raise SystemExit(EXIT_BROKEN_PIPE) from None
        raise


if __name__ == "__main__":
    main()
