"""``relyscope quarantine list|replay``: records the store refused as unstorable.

The quarantine is ``<spool dir>.quarantine/`` (see :mod:`relyscope.collector.quarantine`); the
spool directory comes from ``--spool-dir`` / ``RELYSCOPE_SPOOL_DIR`` or, like ``serve``, from the
store DSN. ``replay`` sends each record's OTLP body to a running sidecar's OTLP/HTTP receiver
(the records are whole OTLP export requests) and deletes it once acknowledged (HTTP 200); a record
the store still refuses is quarantined again by the sidecar under a new number.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Optional

import typer
from rich.table import Table

from relyscope.cli._console import CliConsole

__all__ = ["quarantine_app"]

quarantine_app = typer.Typer(no_args_is_help=True, help="Inspect and replay records the store refused as unstorable.")
_out = CliConsole(width=None if os.isatty(1) else 200)
_err = CliConsole(stderr=True)


def _dir(spool_dir: Optional[str], store: Optional[str]) -> str:
    from relyscope.cli.main import _settings  # its errors say which setting to change (no traceback)
    from relyscope.collector.quarantine import quarantine_dir
    from relyscope.pipeline import default_spool_dir
    from relyscope.store import resolve_dsn

    s = _settings(spool_dir=spool_dir, store=store)
    spool = s.spool_dir or default_spool_dir(resolve_dsn(s.store))
    if not os.path.isdir(spool):  # a mistyped path read as an empty quarantine, exit 0
        _err.print(f"[red]no spool at {spool}[/red]: give the sidecar's --spool-dir / RELYSCOPE_SPOOL_DIR "
                   "(or its --store, whose spool is beside the data)", soft_wrap=True)
        raise typer.Exit(2)
    return quarantine_dir(spool)


@quarantine_app.command("list")
def list_(spool_dir: Optional[str] = typer.Option(None, "--spool-dir", help="spool directory [RELYSCOPE_SPOOL_DIR]"),
          store: Optional[str] = typer.Option(None, help="store DSN, to derive the default spool directory"),
          json_out: bool = typer.Option(False, "--json", help="JSON Lines: one JSON object per record and "
                                        "line (no line when the quarantine is empty)")) -> None:
    """List quarantined records: number, spans, bytes, when, and the store's error."""
    from relyscope.collector.quarantine import entries

    qdir = _dir(spool_dir, store)
    items = entries(qdir)
    if json_out:
        for e in items:
            print(json.dumps({"seq": e.seq, "path": e.path, "bytes": e.bytes, **e.meta}))
        return
    if not items:
        _err.print(f"quarantine {qdir} is empty")
        return
    t = Table(title=f"quarantine {qdir}")
    for col in ("record", "spans", "bytes", "quarantined at (UTC)", "error"):
        t.add_column(col)
    for e in items:
        at = e.meta.get("quarantined_at")
        when = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if at else "—"
        t.add_row(str(e.seq), str(e.meta.get("spans", "—")), str(e.bytes), when, str(e.meta.get("error", "—"))[:120])
    _out.print(t)


@quarantine_app.command()
def replay(endpoint: str = typer.Option("http://127.0.0.1:4318", help="the sidecar's OTLP/HTTP receiver"),
           token: Optional[str] = typer.Option(None, envvar="RELYSCOPE_AUTH_TOKEN", help="bearer token, if auth is on"),
           spool_dir: Optional[str] = typer.Option(None, "--spool-dir", help="spool directory [RELYSCOPE_SPOOL_DIR]"),
           store: Optional[str] = typer.Option(None, help="store DSN, to derive the default spool directory"),
           record: Optional[list[int]] = typer.Argument(None, help="record numbers to replay (default: all)")) -> None:
    """Re-send quarantined records to a running sidecar; delete each one it acknowledges.
    Exit code 1 if any record was not acknowledged (it stays in quarantine)."""
    import httpx

    from relyscope.collector.quarantine import content_type_of, entries, remove

    items = [e for e in entries(_dir(spool_dir, store)) if not record or e.seq in record]
    headers = {"authorization": f"Bearer {token}"} if token else {}
    failed = 0
    with httpx.Client(timeout=60) as client:
        for e in items:
            with open(e.path, "rb") as f:
                rec = f.read()
            try:
                r = client.post(endpoint.rstrip("/") + "/v1/traces", content=rec[1:],
                                headers={**headers, "content-type": content_type_of(rec)})
            except (httpx.HTTPError, ValueError) as exc:
                _err.print(f"[red]record {e.seq}: not sent: {exc}[/red]")
                failed += 1
                continue
            if r.status_code != 200:
                _err.print(f"[red]record {e.seq}: HTTP {r.status_code}: {r.text[:200]}[/red]")
                failed += 1
                continue
            remove(e)
            _err.print(f"record {e.seq}: replayed ({e.meta.get('spans', '?')} spans)")
    _err.print(f"{len(items) - failed} of {len(items)} records replayed")
    if failed:
        raise typer.Exit(1)
