"""Quarantine: spool records the store refused with a data error, kept for inspection and replay.

A record lands here only after :class:`relyscope.store.StoreRejected` answers (a ClickHouse data
error code, or rows that cannot be serialized) for a bounded time — never for an outage or a
passing refusal, which are retried. Layout of ``<spool dir>.quarantine/``::

    00000000000000000042.otlp   the spool record: tag byte (b"P" protobuf, b"J" JSON) + OTLP body
    00000000000000000042.json   {"seq", "spans", "error", "code", "quarantined_at", "content_type"}

Both files are written to a temporary name, fsynced and renamed (then the directory is fsynced)
before the spool moves past the record, so a crash never loses one; a crash before the spool
commit writes the same files again on replay. ``relyscope quarantine list`` shows the entries;
``relyscope quarantine replay`` re-sends each body to a sidecar's OTLP/HTTP receiver and removes
the entry once it is acknowledged (after the cause is fixed, e.g. a schema change).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

__all__ = ["quarantine_dir", "put", "entries", "summary", "remove", "Entry", "content_type_of"]

_TYPES = {b"P": "application/x-protobuf", b"J": "application/json"}


def quarantine_dir(spool_dir: str) -> str:
    """The quarantine directory beside a spool directory: ``<spool dir>.quarantine``."""
    return os.path.abspath(spool_dir).rstrip("/") + ".quarantine"


def content_type_of(record: bytes) -> str:
    """OTLP/HTTP content type of a spool record by its tag byte. Raises ValueError if unknown."""
    try:
        return _TYPES[record[:1]]
    except KeyError:
        raise ValueError(f"unknown spool record tag {record[:1]!r}") from None


def _write_durably(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def put(directory: str, seq: int, record: bytes, *, spans: int, error: str, code: int | None) -> str:
    """Keep one spool record (tag byte + body) durably; returns the ``.otlp`` path. Idempotent for
    the same ``seq``. Raises OSError (the caller keeps the record in the spool and retries)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    base = os.path.join(directory, f"{seq:020d}")
    _write_durably(base + ".otlp", record)
    meta = {"seq": seq, "spans": spans, "error": error[:2000], "code": code,
            "quarantined_at": time.time(), "content_type": content_type_of(record)}
    _write_durably(base + ".json", json.dumps(meta).encode())
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return base + ".otlp"


@dataclass(frozen=True, slots=True)
class Entry:
    """One quarantined record. ``bytes``: size of the ``.otlp`` file; ``meta``: its ``.json``
    (empty when that file is missing or unreadable)."""

    seq: int
    path: str
    bytes: int
    meta: dict


def entries(directory: str) -> list[Entry]:
    """Quarantined records in sequence order ([] when the directory does not exist)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".otlp") and n[:-5].isdigit())
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        path = os.path.join(directory, n)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue  # replayed meanwhile
        try:
            with open(path[:-5] + ".json", "rb") as f:
                meta = json.loads(f.read())
        except (OSError, ValueError):
            meta = {}
        out.append(Entry(int(n[:-5]), path, size, meta))
    return out


def summary(directory: str) -> tuple[int, int]:
    """(records, bytes) in quarantine; one directory listing (cheap: the quarantine stays small)."""
    try:
        it = os.scandir(directory)
    except FileNotFoundError:
        return 0, 0
    n = size = 0
    with it:
        for e in it:
            if e.name.endswith(".otlp"):
                try:
                    size += e.stat().st_size
                except FileNotFoundError:
                    continue
                n += 1
    return n, size


def remove(entry: Entry) -> None:
    """Delete a quarantined record (both files). Missing files are fine."""
    for p in (entry.path, entry.path[:-5] + ".json"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
