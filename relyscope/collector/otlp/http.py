"""The HTTP edge: content type, content encoding (gzip, deflate, zstd) and size limits, then the
protobuf or JSON decoder (:func:`decode_http`, :func:`validate_http`)."""

from __future__ import annotations

import zlib

from relyscope.collector.otlp.result import (
    DecodeResult,
    _DEFAULT_LIMITS,
    Limits,
    OTLPRequestError,
    Validation,
)
from relyscope.collector.otlp.common import _too_large
from relyscope.collector.otlp.protobuf import _parse_pb, _validate_pb, _walk_pb
from relyscope.collector.otlp.jsonformat import decode_json

_PROTOBUF_TYPES = frozenset(("application/x-protobuf", "application/protobuf"))
_JSON_TYPES = frozenset(("application/json",))
_CHUNK = 64 << 10


def _inflate(data: bytes, wbits: int, cap: int, limits: Limits, name: str) -> bytes:
    """zlib-family decompression that never produces more than ``cap`` bytes (413 beyond)."""
    out = bytearray()
    rest = data
    try:
        while True:
            d = zlib.decompressobj(wbits)
            buf = rest
            while not d.eof:
                chunk = d.decompress(buf, cap + 1 - len(out))
                out += chunk
                if len(out) > cap:
                    raise _too_large(limits, "decompressed body")
                tail = d.unconsumed_tail
                if not tail and not d.eof:  # all input consumed: drain, then it must have ended
                    out += d.flush()
                    if len(out) > cap:
                        raise _too_large(limits, "decompressed body")
                    if not d.eof:
                        raise OTLPRequestError(f"{name} body is truncated")
                elif not chunk and len(tail) == len(buf):
                    raise OTLPRequestError(f"bad {name} data: no progress")
                buf = tail
            rest = d.unused_data
            # only gzip has multi-member streams; trailing zero padding is tolerated like gzip(1)
            if wbits != 31 or not rest.strip(b"\x00"):
                break
    except zlib.error as exc:
        raise OTLPRequestError(f"bad {name} data: {exc}") from None
    return bytes(out)


def _unzstd(data: bytes, cap: int, limits: Limits) -> bytes:
    """zstd decompression, multi-frame, holding at most about ``cap`` + 128 KiB of output.

    One zstd block (at most 128 KiB of output) can be as small as 4 input bytes (an RLE block),
    so input is fed in slices of (remaining budget / 32 768) bytes: one slice can never expand
    past the cap by more than one block before the cap is checked.
    """
    import zstandard  # the sidecar extra installs it

    out = bytearray()
    dctx = zstandard.ZstdDecompressor()
    rest = data
    try:
        while rest:
            d = dctx.decompressobj()
            pos = 0
            while pos < len(rest) and not d.eof:
                step = max(8, (cap + 1 - len(out)) >> 15)
                out += d.decompress(rest[pos:pos + step])
                pos += step
                if len(out) > cap:
                    raise _too_large(limits, "decompressed body")
            if not d.eof:
                raise OTLPRequestError("zstd body is truncated")
            rest = d.unused_data + rest[pos:]
    except zstandard.ZstdError as exc:
        raise OTLPRequestError(f"bad zstd data: {exc}") from None
    return bytes(out)


def decompress(body: bytes, encoding: str | None, limits: Limits) -> bytes:
    """``body`` with the HTTP ``Content-Encoding`` list undone (gzip, deflate as zlib or raw, zstd,
    identity; applied in the order listed), never inflating past ``limits.max_body_bytes``.
    Raises OTLPRequestError (permanent) for an unknown or corrupt encoding or a body too large."""
    if not encoding:
        return body
    codings = [c.strip().lower() for c in encoding.split(",")]
    cap = limits.max_body_bytes
    for c in reversed(codings):  # applied in the order listed, so undone in reverse
        if c in ("", "identity"):
            continue
        if c in ("gzip", "x-gzip"):
            body = _inflate(body, 31, cap, limits, "gzip")
        elif c == "deflate":
            zlib_header = len(body) >= 2 and (body[0] & 0x0F) == 8 and (
                (body[0] << 8) | body[1]) % 31 == 0
            body = _inflate(body, 15 if zlib_header else -15, cap, limits, "deflate")
        elif c == "zstd":
            body = _unzstd(body, cap, limits)
        else:
            raise OTLPRequestError(f"unsupported Content-Encoding {c!r}", 415, "INVALID_ARGUMENT")
    return body


def decode_http(body: bytes, content_type: str | None, content_encoding: str | None,
                limits: Limits = _DEFAULT_LIMITS) -> DecodeResult:
    """Decode the body of ``POST /v1/traces``.

    Args:
        body: the request body as received (possibly compressed).
        content_type: the Content-Type header; parameters are ignored.
        content_encoding: the Content-Encoding header (gzip, deflate, zstd, identity or None).
        limits: size and attribute limits.

    Returns:
        DecodeResult (reply 200 with :func:`encode_response`, partial success if ``rejected``).

    Raises:
        OTLPRequestError: 415 unknown content type / encoding; 413 body or decompressed body over
            ``limits.max_body_bytes`` (message names the limit in bytes); 400 bad compressed data
            or undecodable protobuf / JSON. Never anything else.
    """
    try:
        is_json = _is_json_type(content_type)
        if len(body) > limits.max_body_bytes:
            raise _too_large(limits)
        body = decompress(bytes(body), content_encoding, limits)
        if is_json:
            return decode_json(body, limits)
        req, bad = _parse_pb(body)
        return _walk_pb(req, limits, bad)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None


def validate_http(body: bytes, content_type: str | None, content_encoding: str | None,
                  limits: Limits = _DEFAULT_LIMITS) -> Validation:
    """What :func:`decode_http` would answer for this body, without building the spans.

    Enough to acknowledge a request (OTLP partial success) once its bytes are durable; the spans
    themselves can be decoded later from the same bytes. Protobuf: the upb parse (with the same
    lenient fallback for invalid UTF-8) plus an id check per span, about 10x cheaper than
    :func:`decode_http` (bench/bench_ingest.py). OTLP/JSON: a span's reject reason can come from
    anywhere in its walk (``malformed``, ``internal``), so this runs :func:`decode_json` and
    returns its result in ``Validation.decoded``.

    Args / raises: as :func:`decode_http` (``limits.max_body_bytes`` applies; the attribute and
    event limits never change what is rejected).

    Returns:
        Validation, equal to the reply fields of ``decode_http(body, content_type,
        content_encoding, limits)``.
    """
    try:
        is_json = _is_json_type(content_type)
        if len(body) > limits.max_body_bytes:
            raise _too_large(limits)
        body = decompress(bytes(body), content_encoding, limits)
        if is_json:
            return Validation.of(decode_json(body, limits))
        req, bad = _parse_pb(body)
        return _validate_pb(req, limits, bad)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None


def _is_json_type(content_type: str | None) -> bool:
    """True for OTLP/JSON, False for protobuf; OTLPRequestError 415 for anything else."""
    ct = (content_type or "").split(";", 1)[0].strip().lower()
    if ct in _PROTOBUF_TYPES:
        return False
    if ct in _JSON_TYPES:
        return True
    raise OTLPRequestError(
        f"unsupported Content-Type {content_type!r} (use application/x-protobuf or "
        "application/json)", 415, "INVALID_ARGUMENT")
