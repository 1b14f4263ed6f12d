"""How spans are decoded and redacted before storage, built once from the settings.

:func:`ingest_setup` is the one place the decoder limits (``RELYSCOPE_MAX_BODY_BYTES``,
``RELYSCOPE_MAX_ATTRIBUTES``, ``RELYSCOPE_MAX_ATTRIBUTE_LENGTH``), the redaction policy
(``RELYSCOPE_REDACT_DENY``, ``RELYSCOPE_REDACT_ALLOW``, ``RELYSCOPE_REDACT_PATTERNS``,
``RELYSCOPE_REDACT_KEY``) and the decode path
(``RELYSCOPE_INGEST_DECODER``) are read: the sidecar's :class:`relyscope.pipeline.Pipeline` and
``relyscope score`` both call it, so a file scored offline is stored — truncated, repaired and
redacted — as the sidecar would store the same request.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

from relyscope.collector import fastpath
from relyscope.collector.otlp import DecodeResult, Limits
from relyscope.collector.records import decode_spool_record
from relyscope.collector.redaction import Redactor, load_or_create_key

__all__ = ["IngestSetup", "ingest_setup", "denied_identity_keys"]

log = logging.getLogger("relyscope.collector.decoding")


def denied_identity_keys(deny) -> list[str]:
    """The identity keys (:data:`~relyscope.collector.normalize.versions.EXACT_KEYS`) that the
    ``RELYSCOPE_REDACT_DENY`` entries ``deny`` drop (case-insensitive globs, as the redactor
    matches them), sorted: a deny list drops identity keys too — denying is explicit — so this is
    warned about at start (a ``*.id`` glob would turn every task into a fingerprint). Pure."""
    from relyscope.collector.normalize.versions import EXACT_KEYS

    globs = [d.lower() for d in deny]
    return sorted(k for k in EXACT_KEYS if any(fnmatch.fnmatchcase(k.lower(), g) for g in globs))


@dataclass(frozen=True)
class IngestSetup:
    """Attributes:
        limits: the decoder limits (:class:`~relyscope.collector.otlp.Limits`), applied to every
            request (validation and decode).
        redactor: the redaction policy, applied to every decoded span before it is stored or
            assembled (:class:`~relyscope.collector.redaction.Redactor`; inactive when no
            ``RELYSCOPE_REDACT_*`` setting is given).
        fast: True for the hot path (:func:`relyscope.collector.fastpath.prepare`: redacted,
            normalized and laid out as insert columns), False for the legacy oracle
            (``decode_http`` → ``Redactor.apply`` → row insert + ``normalize``).
        decode_record: spool record (tag byte + decompressed body) → :class:`DecodeResult`, the
            worker's decode (a picklable ``functools.partial``: decode processes run it; fast:
            already prepared, legacy: not yet redacted).
    """

    limits: Limits
    redactor: Redactor
    fast: bool
    decode_record: Callable[[bytes], DecodeResult]


def ingest_setup(settings: Any, key_file: str | None = None) -> IngestSetup:
    """The decoder limits, redactor and decode path of ``settings`` (a
    :class:`relyscope.config.Settings`). The key of identity tokens: ``RELYSCOPE_REDACT_KEY``, else
    the one kept in ``key_file`` (created on first use; the sidecar passes ``<spool dir>.redact-key``,
    so tokens survive restarts), else — no file given (``relyscope score``) — a random key for this
    run; read only when patterns are set. Raises ``re.error`` for an invalid redaction pattern
    (Settings validates them first), ValueError for a limit out of range or a key file holding no
    hex key, OSError when the key file cannot be read or created."""
    limits = Limits(max_body_bytes=settings.max_body_bytes, max_attributes=settings.max_attributes,
                    max_attribute_length=settings.max_attribute_length)
    key = None
    if settings.redact_patterns:
        if settings.redact_key is not None:
            key = settings.redact_key.get_secret_value().encode("utf-8")
        elif key_file is not None:
            key = load_or_create_key(key_file)
    redactor = Redactor(settings.redact_deny, settings.redact_patterns, allow=settings.redact_allow, key=key)
    hit = denied_identity_keys(settings.redact_deny)
    if hit:
        log.warning("RELYSCOPE_REDACT_DENY drops %d identity key(s) scoring reads: %s%s (tasks, agents or "
                    "outcomes may be lost or merged; RELYSCOPE_REDACT_PATTERNS tokenizes secrets in them "
                    "instead)", len(hit), ", ".join(hit[:8]), ", …" if len(hit) > 8 else "")
    fast = settings.ingest_decoder == "fast"
    decode = (functools.partial(fastpath.decode_record, limits=limits, redactor=redactor) if fast
              else functools.partial(decode_spool_record, limits=limits))
    return IngestSetup(limits=limits, redactor=redactor, fast=fast, decode_record=decode)
