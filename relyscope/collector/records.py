"""The spool record format of the sidecar's trace path, and its decode.

A record is one tag byte + the decompressed request body: ``P`` OTLP protobuf, ``J`` OTLP/JSON
(the tag says how to decode it again on replay). :func:`decode_spool_record` is what the worker
runs per record — in its own thread, or in a decode process (:mod:`relyscope.decode_pool`); this
module imports only the decoder, so a decode process stays small (no scoring stack).
"""

from __future__ import annotations

import collections

from relyscope.collector.otlp import DecodeResult, Limits, OTLPRequestError, decode_http

__all__ = ["TAG_PROTO", "TAG_JSON", "decode_spool_record"]

TAG_PROTO = b"P"
TAG_JSON = b"J"


def decode_spool_record(payload: bytes, limits: Limits) -> DecodeResult:
    """Decode one spool record (tag byte + decompressed body) into a :class:`DecodeResult`; an
    unusable body (:class:`OTLPRequestError`, which ``accept`` refused already) decodes to an
    empty result. Module-level and pure, so a worker process can run it
    (``functools.partial(decode_spool_record, limits=...)`` pickles)."""
    is_json = payload[:1] == TAG_JSON
    try:
        return decode_http(payload[1:], "application/json" if is_json else "application/x-protobuf",
                           None, limits)
    except OTLPRequestError:
        return DecodeResult(spans=[], rejected=0, errors=[], warnings=collections.Counter())
