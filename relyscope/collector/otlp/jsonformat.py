"""The OTLP/JSON path: a JSON body → :class:`DecodeResult`, with the tolerances listed in the
package docstring (each counted in ``DecodeResult.warnings``)."""

from __future__ import annotations

import base64
import binascii
import collections
import json as _json
import math
import re
from typing import Any

from relyscope.collector.normalize.versions import never_truncate
from relyscope.model import CanonicalSpan, SpanEvent
from relyscope.collector.otlp.result import DecodeResult, _DEFAULT_LIMITS, Limits, OTLPRequestError
from relyscope.collector.otlp.common import (
    _Batch,
    _cap,
    _CODE,
    _EMPTY_FLAGS,
    _event_time,
    _internal,
    _MAX_DEPTH,
    no_signal_json,
    _Rejected,
    _SURR,
    _times,
    _too_large,
    _truncate,
    _U64,
)

_KIND_NAMES = {
    "SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5,
}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}

# AnyValue member name (camelCase or snake_case) -> kind
_ANY_KEYS = {
    "stringValue": "s", "string_value": "s",
    "boolValue": "b", "bool_value": "b",
    "intValue": "i", "int_value": "i",
    "doubleValue": "d", "double_value": "d",
    "arrayValue": "a", "array_value": "a",
    "kvlistValue": "k", "kvlist_value": "k",
    "bytesValue": "y", "bytes_value": "y",
}


class _JCtx:
    """Per-request JSON walk state: limits and the warnings counter."""

    __slots__ = ("lim", "warn")

    def __init__(self, lim: Limits, warn: collections.Counter):
        self.lim = lim
        self.warn = warn

    def get(self, d: dict, camel: str, snake: str) -> Any:
        v = d.get(camel)
        if v is None and snake in d:
            v = d[snake]
            if v is not None:
                self.warn["snake_case_keys"] += 1
        return v


def _int64(v: Any) -> int | None:
    """A JSON int64/uint64 (number or decimal string) as int, or None if not one."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        s = v.strip()
        if s[:1] == "-":
            return -int(s[1:]) if s[1:].isdigit() and s[1:].isascii() else None
        return int(s) if s.isdigit() and s.isascii() else None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _any_json(v: Any, cx: _JCtx, fl: set, depth: int, max_len: int | None) -> Any:
    if not isinstance(v, dict):
        fl.add("invalid_attribute_value")
        return None
    for k, x in v.items():
        t = _ANY_KEYS.get(k)
        if t is None or x is None:
            continue
        if "_" in k:
            cx.warn["snake_case_keys"] += 1
        if t == "s":
            if isinstance(x, str):
                return _truncate(x, max_len, fl)
        elif t == "i":
            n = _int64(x)
            if n is not None and -(1 << 63) <= n < (1 << 63):
                return n
        elif t == "d":
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                return float(x)
            if isinstance(x, str):
                try:
                    return float(x)  # "NaN", "Infinity", "-Infinity" per proto3 JSON
                except ValueError:
                    pass
        elif t == "b":
            if isinstance(x, bool):
                return x
        elif t == "y":
            if isinstance(x, str):
                b = _b64(x)
                if b is not None:
                    return b
        elif depth >= _MAX_DEPTH:
            fl.add("attribute_too_deep")  # kept as its OTLP/JSON text: nothing is dropped
            return _truncate(_json.dumps({k: x}, ensure_ascii=False), max_len, fl)
        elif isinstance(x, dict):
            vals = x.get("values", ())
            if isinstance(vals, list):
                if t == "a":
                    return [_any_json(e, cx, fl, depth + 1, max_len) for e in vals]
                return _attrs_json(vals, cx, fl, _KVLIST_NOLIMIT, depth + 1, max_len)
        fl.add("invalid_attribute_value")
        return None
    fl.add("empty_attribute")
    return None


_KVLIST_NOLIMIT = 1 << 30


_INHERIT: Any = object()


def _attrs_json(kvs: Any, cx: _JCtx, fl: set, max_n: int, depth: int = 0, max_len: Any = _INHERIT,
                drops: list | None = None) -> dict[str, Any]:
    """OTLP/JSON KeyValue list -> dict. ``max_len``: the string length limit for every value
    (nested kvlists inherit their key's); by default the limits' own, waived for the keys of
    :func:`never_truncate`. Over ``max_n`` keys: :func:`_cap`."""
    out: dict[str, Any] = {}
    if not kvs:
        return out
    if not isinstance(kvs, list):
        fl.add("invalid_attribute")
        return out
    per_key = max_len is _INHERIT
    lim_len = cx.lim.max_attribute_length if per_key else max_len
    for kv in kvs:
        if not isinstance(kv, dict):
            fl.add("invalid_attribute")
            continue
        key = kv.get("key")
        if not isinstance(key, str):
            fl.add("invalid_attribute")
            continue
        ml = lim_len
        if per_key and ml is not None and never_truncate(key):
            ml = None
        v = kv.get("value")
        if v is None:
            fl.add("empty_attribute")
            out[key] = None
            continue
        # fast path: the common one-member stringValue / intValue objects
        if isinstance(v, dict) and len(v) == 1:
            x = v.get("stringValue")
            if type(x) is str:
                if ml is not None and len(x) > ml:
                    fl.add("truncated_attribute")
                    x = x[:ml]
                out[key] = x
                continue
            x = v.get("intValue")
            if type(x) is str and len(x) < 19 and x.isdigit() and x.isascii():
                out[key] = int(x)  # < 10**18 fits int64
                continue
        out[key] = _any_json(v, cx, fl, depth, ml)
    if len(out) > max_n:
        return _cap(out, max_n, fl, drops)
    return out


def _b64(s: str) -> bytes | None:
    """Standard or URL-safe base64, padding optional; None if not base64."""
    if len(s) % 4:
        s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        try:
            return base64.b64decode(s, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None


def _json_id(v: Any, n: int, name: str, cx: _JCtx | None) -> str:
    """Hex id from OTLP/JSON (hex any case, or base64); raises _Rejected."""
    code = _CODE[name]
    if v is None or v == "":
        raise _Rejected(f"{name} missing", f"{code}_missing")
    if not isinstance(v, str):
        raise _Rejected(f"{name} is not a string", f"{code}_invalid")
    raw = None
    if len(v) == 2 * n:
        try:
            raw = bytes.fromhex(v)
        except ValueError:
            raw = None
        if raw is not None and len(raw) == n:
            h = raw.hex()
            if h != v and cx is not None:
                cx.warn["uppercase_hex"] += 1
            if raw == bytes(n):
                raise _Rejected(f"{name} is all zeros", f"{code}_zero")
            return h
        raw = None
    if raw is None and len(v) in (4 * ((n + 2) // 3), math.ceil(n * 4 / 3)):
        raw = _b64(v)
        if raw is not None and len(raw) == n:
            if cx is not None:
                cx.warn["base64_id"] += 1
            if raw == bytes(n):
                raise _Rejected(f"{name} is all zeros", f"{code}_zero")
            return raw.hex()
    raise _Rejected(f"{name} invalid (expected {2 * n} hex chars or base64 of {n} bytes)",
                    f"{code}_invalid")


def _json_time(v: Any, fl: set) -> int:
    if v is None:
        return 0
    t = _int64(v)
    if t is None or not 0 <= t < _U64:
        fl.add("invalid_time")
        return 0
    return t


def _json_enum(v: Any, names: dict[str, int], hi: int, cx: _JCtx, fl: set, bad_flag: str) -> int:
    if v is None:
        return 0
    if type(v) is int:
        if 0 <= v <= hi:
            return v
    elif isinstance(v, str):
        if v in names:
            cx.warn["enum_name"] += 1
            return names[v]
        n = _int64(v)
        if n is not None and 0 <= n <= hi:
            return n
    fl.add(bad_flag)
    return 0


def _str(v: Any, fl: set) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    fl.add("invalid_field_type")
    return ""


def _span_json(sp: Any, resource: dict, scope_name: str, scope_version: str, cx: _JCtx,
               extra: frozenset[str], slow: bool) -> CanonicalSpan:
    if not isinstance(sp, dict):
        raise _Rejected("span is not a JSON object", "malformed")
    fl: set[str] = set(extra) if extra else set()
    if slow:
        sp, bad = _deep_clean(sp)
        if bad:
            fl.add("invalid_utf8")
    g = cx.get
    tid = _json_id(g(sp, "traceId", "trace_id"), 16, "traceId", cx)
    sid = _json_id(g(sp, "spanId", "span_id"), 8, "spanId", cx)
    pv = g(sp, "parentSpanId", "parent_span_id")
    parent = ""
    if pv is not None and pv != "":
        try:
            parent = _json_id(pv, 8, "spanId", cx)
        except _Rejected:
            fl.add("invalid_parent_span_id")
    kind = _json_enum(sp.get("kind"), _KIND_NAMES, 5, cx, fl, "invalid_kind")
    if kind == 0 and "invalid_kind" not in fl:
        fl.add("missing_kind")
    start, end, raw_end = _times(_json_time(g(sp, "startTimeUnixNano", "start_time_unix_nano"), fl),
                                 _json_time(g(sp, "endTimeUnixNano", "end_time_unix_nano"), fl), fl)
    st = sp.get("status")
    code, smsg = 0, ""
    if st is not None:
        if isinstance(st, dict):
            code = _json_enum(st.get("code"), _STATUS_NAMES, 2, cx, fl, "invalid_status")
            smsg = _str(st.get("message"), fl)
        else:
            fl.add("invalid_status")
    lim = cx.lim
    drops = [0]
    attrs = _attrs_json(sp.get("attributes"), cx, fl, lim.max_attributes, drops=drops)
    events: tuple[SpanEvent, ...] = ()
    evs = sp.get("events")
    if evs:
        if not isinstance(evs, list):
            fl.add("invalid_events")
        else:
            if len(evs) > lim.max_events:
                fl.add("dropped_events")
                evs = evs[: lim.max_events]
            out = []
            for e in evs:
                if not isinstance(e, dict):
                    fl.add("invalid_events")
                    continue
                out.append(SpanEvent(_str(e.get("name"), fl),
                                     _event_time(_json_time(g(e, "timeUnixNano", "time_unix_nano"), fl), fl),
                                     _attrs_json(e.get("attributes"), cx, fl, lim.max_attributes,
                                                 drops=drops)))
            events = tuple(out)
    links: tuple[tuple[str, str], ...] = ()
    lks = sp.get("links")
    if lks:
        out_l = []
        for link in lks if isinstance(lks, list) else ():
            try:
                out_l.append((_json_id(g(link, "traceId", "trace_id"), 16, "traceId", cx),
                              _json_id(g(link, "spanId", "span_id"), 8, "spanId", cx)))
            except (_Rejected, AttributeError):
                fl.add("invalid_link")
        if not isinstance(lks, list):
            fl.add("invalid_link")
        links = tuple(out_l)
    return CanonicalSpan(tid, sid, parent, _str(sp.get("name"), fl), kind, start, end, code, smsg,
                         attrs, resource, scope_name, scope_version, events, links,
                         _str(g(sp, "traceState", "trace_state"), fl),
                         frozenset(fl) if fl else _EMPTY_FLAGS, raw_end, drops[0])


def _repair_str(s: str) -> tuple[str, bool]:
    if _SURR.search(s) is None:
        return s, False

    def run(m: re.Match) -> str:
        chunk = m.group()
        try:  # bytes of an invalid sequence that came in the body (surrogateescape) -> U+FFFD
            return chunk.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # lone surrogates from "\ud800" escapes
            return "\ufffd" * len(chunk)

    return _SURR.sub(run, s), True


def _deep_clean(obj: Any) -> tuple[Any, bool]:
    """Copy of a json.loads value with lone surrogates replaced by U+FFFD; True if any was."""
    if isinstance(obj, str):
        return _repair_str(obj)
    if isinstance(obj, list):
        bad = False
        out = []
        for x in obj:
            y, b = _deep_clean(x)
            bad |= b
            out.append(y)
        return out, bad
    if isinstance(obj, dict):
        bad = False
        d = {}
        for k, x in obj.items():
            k2, b1 = _repair_str(k) if isinstance(k, str) else (k, False)
            y, b2 = _deep_clean(x)
            bad |= b1 | b2
            d[k2] = y
        return d, bad
    return obj, False


def _body_text(body: bytes | str) -> tuple[str, bool]:
    """Body as text and whether a repair pass is needed (invalid UTF-8 or surrogate escapes)."""
    if isinstance(body, str):
        text = body
        slow = not text.isascii() and _SURR.search(text) is not None
    else:
        try:
            text = body.decode("utf-8")
            slow = False
        except UnicodeDecodeError:
            text = body.decode("utf-8", "surrogateescape")
            slow = True
    if text[:1] == "\ufeff":
        text = text[1:]
    if not slow and ("\\ud" in text or "\\uD" in text):
        slow = True
    return text, slow


def _walk_json(doc: Any, cx: _JCtx, slow: bool) -> DecodeResult:
    batch = _Batch()
    batch.result.warnings = cx.warn
    if not isinstance(doc, dict):
        raise OTLPRequestError("OTLP/JSON body must be a JSON object")
    rss = cx.get(doc, "resourceSpans", "resource_spans")
    if rss is None:
        no_signal_json(doc)
        return batch.finish()
    if not isinstance(rss, list):
        raise OTLPRequestError("resourceSpans must be a JSON array")
    g = cx.get
    for ri, rs in enumerate(rss):
        where_r = f"resource {ri}"
        try:
            if not isinstance(rs, dict):
                batch.reject_many(0, where_r, "not a JSON object", "malformed")
                continue
            rfl: set[str] = set()
            res = rs.get("resource")
            resource: dict[str, Any] = {}
            if res is not None:
                if slow:
                    res, bad = _deep_clean(res)
                    if bad:
                        rfl.add("invalid_utf8")
                if isinstance(res, dict):
                    # not subject to the span limits (as protobuf: _RESOURCE_LIMITS)
                    resource = _attrs_json(res.get("attributes"), cx, rfl, _KVLIST_NOLIMIT, max_len=None)
                else:
                    rfl.add("invalid_resource")
            sss = g(rs, "scopeSpans", "scope_spans")
            if sss is None:
                continue
            if not isinstance(sss, list):
                batch.reject_many(0, where_r, "scopeSpans is not a JSON array", "malformed")
                continue
        except Exception as exc:  # noqa: BLE001
            batch.reject_many(0, where_r, f"internal: {type(exc).__name__}", "internal")
            continue
        for si, ss in enumerate(sss):
            try:
                if not isinstance(ss, dict):
                    batch.reject_many(0, f"scope {si} of {where_r}", "not a JSON object",
                                      "malformed")
                    continue
                sfl = set(rfl)
                scope = ss.get("scope")
                sname = sversion = ""
                if scope is not None:
                    if slow:
                        scope, bad = _deep_clean(scope)
                        if bad:
                            sfl.add("invalid_utf8")
                    if isinstance(scope, dict):
                        sname = _str(scope.get("name"), sfl)
                        sversion = _str(scope.get("version"), sfl)
                    else:
                        sfl.add("invalid_scope")
                spans = ss.get("spans")
                if spans is None:
                    continue
                if not isinstance(spans, list):
                    batch.reject_many(0, f"scope {si} of {where_r}", "spans is not a JSON array",
                                      "malformed")
                    continue
                base = frozenset(sfl) if sfl else _EMPTY_FLAGS
            except Exception as exc:  # noqa: BLE001
                batch.reject_many(0, f"scope {si} of {where_r}", f"internal: {type(exc).__name__}",
                                  "internal")
                continue
            for pi, sp in enumerate(spans):
                try:
                    batch.add(_span_json(sp, resource, sname, sversion, cx, base, slow))
                except _Rejected as rej:
                    batch.reject(f"span {pi} (scope {si}) of {where_r}", rej.args[0], rej.code)
                except Exception as exc:  # noqa: BLE001
                    _internal(f"span {pi} (scope {si}) of {where_r}", exc, batch)
    return batch.finish()


def decode_json(body: bytes | str, limits: Limits = _DEFAULT_LIMITS) -> DecodeResult:
    """Decode an OTLP/JSON ``ExportTraceServiceRequest`` (already decompressed).

    Invalid UTF-8 bytes and lone-surrogate escapes inside strings are replaced by U+FFFD (flag
    ``invalid_utf8`` on the spans they touch); 64-bit integers keep full precision.

    Raises:
        OTLPRequestError: 400 if the body is not JSON or not an object with a ``resourceSpans``
            array; 413 if it is longer than ``limits.max_body_bytes``.
    """
    try:
        if len(body) > limits.max_body_bytes:
            raise _too_large(limits)
        text, slow = _body_text(body)
        try:
            doc = _json.loads(text, strict=False)
        except (ValueError, RecursionError) as exc:
            raise OTLPRequestError(f"cannot decode JSON body: {exc}") from None
        return _walk_json(doc, _JCtx(limits, collections.Counter()), slow)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None
