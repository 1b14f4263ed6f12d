"""The protobuf path: ``ExportTraceServiceRequest`` → :class:`DecodeResult`, its validation-only
twin, and the lenient schema that survives invalid UTF-8."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from relyscope.collector.normalize.versions import never_truncate
from relyscope.model import CanonicalSpan, SpanEvent
from relyscope.collector.otlp.result import (
    DecodeResult,
    _DEFAULT_LIMITS,
    Limits,
    OTLPRequestError,
    PB_REPORTED_FLAGS,
    Validation,
)
from relyscope.collector.otlp.common import (
    _Batch,
    _cap,
    _CODE,
    _EMPTY_FLAGS,
    _event_time,
    _internal,
    _keep,
    _MAX_DEPTH,
    _MAX_TIME_NS,
    _other_signal_pb,
    _Rejected,
    _times,
    _truncate,
    _Z16,
    _Z8,
)

_SCALAR_ONEOFS = frozenset(("int_value", "double_value", "bool_value"))


def _any_pb(v: Any, max_len: int | None, fl: set, depth: int) -> Any:
    w = v.WhichOneof("value")
    if w == "string_value":
        return _truncate(v.string_value, max_len, fl)
    if w in _SCALAR_ONEOFS:
        return getattr(v, w)
    if w is None:
        fl.add("empty_attribute")
        return None
    if depth >= _MAX_DEPTH:
        fl.add("attribute_too_deep")
        return _truncate(_deep_text_pb(v), max_len, fl)
    if w == "array_value":
        return [_any_pb(x, max_len, fl, depth + 1) for x in v.array_value.values]
    if w == "kvlist_value":
        out = {}
        for kv in v.kvlist_value.values:
            out[kv.key] = _any_pb(kv.value, max_len, fl, depth + 1)
        return out
    if w == "bytes_value":
        return v.bytes_value
    fl.add("invalid_attribute_value")  # an oneof member added by a future proto
    return None


def _deep_text_pb(v: Any) -> str:
    """A value nested past ``_MAX_DEPTH``, kept as its OTLP/JSON text (nothing is dropped)."""
    return json_format.MessageToJson(v, indent=None)


def _attrs_pb(kvs: Any, lim: Limits, fl: set, drops: list | None = None) -> dict[str, Any]:
    """OTLP KeyValue list -> dict (last duplicate key wins; over ``max_attributes``: see
    :func:`_cap`). ``drops``: a one-element list the number of dropped attributes is added to."""
    out: dict[str, Any] = {}
    if not kvs:
        return out
    max_len = lim.max_attribute_length
    for kv in kvs:
        v = kv.value
        # Hot path without WhichOneof: a non-empty string / non-zero int can only be the set member
        # of the oneof. Empty strings, zeros, doubles, bools and composites take the general path.
        x = v.string_value
        if x:
            if max_len is not None and len(x) > max_len and not never_truncate(kv.key):
                fl.add("truncated_attribute")
                x = x[:max_len]
            out[kv.key] = x
            continue
        x = v.int_value
        if x:
            out[kv.key] = x
            continue
        out[kv.key] = _any_pb(v, None if max_len is None or never_truncate(kv.key) else max_len, fl, 0)
    if len(out) > lim.max_attributes:
        return _cap(out, lim.max_attributes, fl, drops)
    return out


def _pb_id(raw: bytes, n: int, zero: bytes, name: str) -> str:
    if len(raw) != n:
        if not raw:
            raise _Rejected(f"{name} missing", f"{_CODE[name]}_missing")
        raise _Rejected(f"{name} has {len(raw)} bytes, expected {n}", f"{_CODE[name]}_invalid")
    if raw == zero:
        raise _Rejected(f"{name} is all zeros", f"{_CODE[name]}_zero")
    return raw.hex()


def _span_pb(sp: Any, resource: dict, scope_name: str, scope_version: str, lim: Limits,
             extra_flags: frozenset[str]) -> CanonicalSpan:
    raw = sp.trace_id
    if len(raw) != 16 or raw == _Z16:  # the checks of _pb_id, inlined for the valid case
        tid = _pb_id(raw, 16, _Z16, "traceId")
    else:
        tid = raw.hex()
    raw = sp.span_id
    if len(raw) != 8 or raw == _Z8:
        sid = _pb_id(raw, 8, _Z8, "spanId")
    else:
        sid = raw.hex()
    fl: set[str] = set(extra_flags) if extra_flags else set()
    praw = sp.parent_span_id
    if not praw:
        parent = ""
    elif len(praw) != 8 or praw == _Z8:
        fl.add("invalid_parent_span_id")
        parent = ""
    else:
        parent = praw.hex()
    kind = sp.kind
    if kind == 0:
        fl.add("missing_kind")
    elif not 0 < kind <= 5:
        fl.add("invalid_kind")
        kind = 0
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    if 0 < start <= end <= _MAX_TIME_NS:  # the usual case of _times: nothing to flag or repair
        raw_end = None
    else:
        start, end, raw_end = _times(start, end, fl)
    st = sp.status
    code = st.code
    if not 0 <= code <= 2:
        fl.add("invalid_status")
        code = 0
    drops = [0]
    attrs = _attrs_pb(sp.attributes, lim, fl, drops)
    events: tuple[SpanEvent, ...] = ()
    if sp.events:
        evs = sp.events
        if len(evs) > lim.max_events:
            fl.add("dropped_events")
            evs = evs[: lim.max_events]
        events = tuple(SpanEvent(e.name, _event_time(e.time_unix_nano, fl), _attrs_pb(e.attributes, lim, fl, drops))
                       for e in evs)
    links: tuple[tuple[str, str], ...] = ()
    if sp.links:
        lk = []
        for link in sp.links:
            lt, ls = link.trace_id, link.span_id
            if len(lt) == 16 and len(ls) == 8 and lt != _Z16 and ls != _Z8:
                lk.append((lt.hex(), ls.hex()))
            else:
                fl.add("invalid_link")
        links = tuple(lk)
    return CanonicalSpan(tid, sid, parent, sp.name, kind, start, end, code, st.message, attrs,
                         resource, scope_name, scope_version, events, links, sp.trace_state,
                         frozenset(fl) if fl else _EMPTY_FLAGS, raw_end, drops[0])


def _walk_pb(req: Any, lim: Limits, bad: _Repairs | None = None) -> DecodeResult:
    batch = _Batch(PB_REPORTED_FLAGS)
    for ri, rs in enumerate(req.resource_spans):
        try:
            rfl: set[str] = set()
            resource = _attrs_pb(rs.resource.attributes, _RESOURCE_LIMITS, rfl)
            if bad is not None and ri in bad.resources:
                rfl.add("invalid_utf8")
        except Exception as exc:  # noqa: BLE001 - never fail the batch (style.md lesson 12)
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            batch.reject_many(n, f"resource {ri}", f"internal: {type(exc).__name__}", "internal")
            continue
        for si, ss in enumerate(rs.scope_spans):
            scope = ss.scope
            sname, sversion = scope.name, scope.version
            sfl = rfl
            if bad is not None and (ri, si) in bad.scopes:
                sfl = rfl | {"invalid_utf8"}
            base = frozenset(sfl) if sfl else _EMPTY_FLAGS
            for pi, sp in enumerate(ss.spans):
                flags = base
                if bad is not None:
                    if (ri, si, pi) in bad.undecodable:
                        batch.reject(f"span {pi} (scope {si}) of resource {ri}", bad.undecodable[(ri, si, pi)],
                                     "malformed")
                        continue
                    if (ri, si, pi) in bad.spans:
                        flags = base | {"invalid_utf8"}
                try:
                    batch.add(_span_pb(sp, resource, sname, sversion, lim, flags))
                except _Rejected as rej:
                    batch.reject(f"span {pi} (scope {si}) of resource {ri}", rej.args[0], rej.code)
                except Exception as exc:  # noqa: BLE001
                    _internal(f"span {pi} (scope {si}) of resource {ri}", exc, batch)
    result = batch.finish()
    if result.rejected and not result.spans:
        _other_signal_pb(req)
    return result


# Resource attributes are not subject to the span attribute limits.
_RESOURCE_LIMITS = Limits(max_attributes=1 << 30)


def _validate_pb(req: Any, lim: Limits = _DEFAULT_LIMITS, bad: "_Repairs | None" = None) -> Validation:
    """The reply fields of ``_walk_pb(req, lim, bad)`` without building spans (see :class:`Validation`).

    Mirrors ``_walk_pb`` step for step. ``_walk_pb`` rejects a span (a) when ``_pb_id`` refuses its
    trace id, then its span id, or (b) ``internal`` when anything else in ``_span_pb`` raises, or
    every span of a resource when its attribute conversion raises. Past the ids, ``_span_pb`` only
    reads fields of an already parsed message (total in upb), compares ints, converts attributes
    with a depth cap (no RecursionError) and builds slotted dataclasses without validation: it
    raises only MemoryError, so (b) is not reproduced per span; the resource conversion is redone
    here (once per resource, cheap) to mirror it exactly. The :data:`REPORTED_FLAGS` repairs of
    each accepted span are recomputed by :func:`_report_pb` (the last copy of a duplicate counts).
    """
    rejected = 0
    errors: list[str] = []
    reasons: collections.Counter = collections.Counter()
    keys: dict[bytes, tuple[frozenset[str], int]] = {}
    clean = (_EMPTY_FLAGS, 0)
    max_n, max_e = lim.max_attributes, lim.max_events
    slow_all = lim.max_attribute_length is not None  # every value must be looked at
    for ri, rs in enumerate(req.resource_spans):
        rfl: set[str] = set()
        try:
            _attrs_pb(rs.resource.attributes, _RESOURCE_LIMITS, rfl)
        except Exception as exc:  # noqa: BLE001 - as _walk_pb
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            where, reason = f"resource {ri}", f"internal: {type(exc).__name__}"
            if n <= 0:
                errors.append(f"{where}: {reason}")
            else:
                rejected += n
                reasons["internal"] += n
                errors.extend(f"{where} span {i}: {reason}" for i in range(n))
            continue
        if bad is not None and ri in bad.resources:
            rfl.add("invalid_utf8")
        for si, ss in enumerate(rs.scope_spans):
            sfl = rfl
            if bad is not None and (ri, si) in bad.scopes:
                sfl = rfl | {"invalid_utf8"}
            for pi, sp in enumerate(ss.spans):
                if bad is not None and (ri, si, pi) in bad.undecodable:
                    rejected += 1
                    errors.append(f"span {pi} (scope {si}) of resource {ri}: {bad.undecodable[(ri, si, pi)]}")
                    reasons["malformed"] += 1
                    continue
                tid = sp.trace_id
                sid = sp.span_id
                if len(tid) == 16 and len(sid) == 8 and tid != _Z16 and sid != _Z8:
                    # fast path: nothing in this span can have been altered (the common case)
                    if (not sfl and not slow_all and (bad is None or (ri, si, pi) not in bad.spans)
                            and len(sp.attributes) <= max_n):
                        evs = sp.events
                        ok = True
                        if evs:
                            if len(evs) > max_e:
                                ok = False
                            else:
                                for e in evs:
                                    if len(e.attributes) > max_n:
                                        ok = False
                                        break
                        if ok:
                            keys[tid + sid] = clean
                            continue
                    fl = set(sfl)
                    if bad is not None and (ri, si, pi) in bad.spans:
                        fl.add("invalid_utf8")
                    keys[tid + sid] = _report_pb(sp, lim, fl)
                    continue
                try:
                    _pb_id(tid, 16, _Z16, "traceId")
                    _pb_id(sid, 8, _Z8, "spanId")
                except _Rejected as rej:
                    rejected += 1
                    errors.append(f"span {pi} (scope {si}) of resource {ri}: {rej.args[0]}")
                    reasons[rej.code] += 1
    if rejected and not keys:
        _other_signal_pb(req)
    repaired: collections.Counter = collections.Counter()
    dropped = 0
    for fl, n in keys.values():
        if fl:
            repaired.update(fl)
            dropped += n
    return Validation(len(keys), rejected, tuple(errors), reasons, None, repaired, dropped)


def _report_pb(sp: Any, lim: Limits, fl: set) -> tuple[frozenset[str], int]:
    """The :data:`PB_REPORTED_FLAGS` flags ``_span_pb`` would set on ``sp`` (``fl``: flags it
    starts from) and the attributes its count limit drops, without converting any value."""
    drops = [0]
    _scan_attrs_pb(sp.attributes, lim, fl, drops)
    if sp.events:
        evs = sp.events
        if len(evs) > lim.max_events:
            fl.add("dropped_events")
            evs = evs[: lim.max_events]
        for e in evs:
            _scan_attrs_pb(e.attributes, lim, fl, drops)
    if not fl:
        return _EMPTY_FLAGS, drops[0]
    return frozenset(f for f in fl if f in PB_REPORTED_FLAGS), drops[0]


def _scan_attrs_pb(kvs: Any, lim: Limits, fl: set, drops: list) -> None:
    """The :data:`PB_REPORTED_FLAGS` flags of ``_attrs_pb(kvs, lim, fl, drops)`` (and the drop
    count), reading no more than it must: values only under a length limit."""
    if not kvs:
        return
    max_len = lim.max_attribute_length
    if max_len is not None:  # with no length limit no value can be altered: nothing to read
        for kv in kvs:
            v = kv.value
            x = v.string_value
            if x:
                if len(x) > max_len and not never_truncate(kv.key):
                    fl.add("truncated_attribute")
                continue
            if not v.int_value:
                _scan_any_pb(v, None if never_truncate(kv.key) else max_len, fl, 0)
    if len(kvs) > lim.max_attributes:
        seen = dict.fromkeys(kv.key for kv in kvs)
        kept = _keep(seen, lim.max_attributes)
        if kept is not None:
            fl.add("dropped_attributes")
            drops[0] += len(seen) - len(kept)


def _scan_any_pb(v: Any, max_len: int | None, fl: set, depth: int) -> None:
    """Flags of ``_any_pb(v, max_len, fl, depth)`` (same order of checks)."""
    w = v.WhichOneof("value")
    if w == "string_value":
        if max_len is not None and len(v.string_value) > max_len:
            fl.add("truncated_attribute")
        return
    if w in _SCALAR_ONEOFS or w is None:
        return
    if depth >= _MAX_DEPTH:
        if max_len is not None and len(_deep_text_pb(v)) > max_len:
            fl.add("truncated_attribute")
        return
    if w == "array_value":
        for x in v.array_value.values:
            _scan_any_pb(x, max_len, fl, depth + 1)
        return
    if w == "kvlist_value":
        for kv in v.kvlist_value.values:
            _scan_any_pb(kv.value, max_len, fl, depth + 1)
        return
    if w == "bytes_value":
        return
    fl.add("invalid_attribute_value")  # unreachable with a known schema, as in _any_pb


# --- lenient protobuf: the same schema with every `string` field typed `bytes` ----------------
# upb validates UTF-8 in proto3 string fields and fails the whole parse on one bad byte
# (C08). The wire format of `string` and `bytes` is identical, so a copy of the schema with
# bytes fields parses anything; we repair the strings (U+FFFD) and re-parse strictly.
# The split schema also types ScopeSpans.spans `bytes` (a message field's wire format is bytes):
# when one span cannot be parsed (nesting past upb's depth limit, bad bytes), the request parses
# with its spans as byte strings, each is parsed alone and only the undecodable ones are rejected.


def _build_lenient(split: bool = False) -> tuple[descriptor_pool.DescriptorPool, frozenset[str]]:
    pool = descriptor_pool.DescriptorPool()
    string_fields: set[str] = set()

    def fix(msg: descriptor_pb2.DescriptorProto, prefix: str) -> None:
        for f in msg.field:
            if f.type == FieldDescriptor.TYPE_STRING:
                f.type = FieldDescriptor.TYPE_BYTES
                string_fields.add(f"{prefix}.{msg.name}.{f.name}")
            elif split and f"{prefix}.{msg.name}.{f.name}" == "opentelemetry.proto.trace.v1.ScopeSpans.spans":
                f.type = FieldDescriptor.TYPE_BYTES
                f.ClearField("type_name")
        for nested in msg.nested_type:
            fix(nested, f"{prefix}.{msg.name}")

    for mod in (common_pb2, resource_pb2, trace_pb2, trace_service_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fdp)
        for m in fdp.message_type:
            fix(m, fdp.package)
        pool.Add(fdp)
    return pool, frozenset(string_fields)


def _message_class(pool: descriptor_pool.DescriptorPool, strict: Any) -> Any:
    """The class of ``pool`` for the message type of the strict class ``strict``."""
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(strict.DESCRIPTOR.full_name))


_LENIENT_POOL, _LENIENT_STRING_FIELDS = _build_lenient()
_LenientRequest = _message_class(_LENIENT_POOL, ExportTraceServiceRequest)
_SplitRequest = _message_class(_build_lenient(split=True)[0], ExportTraceServiceRequest)


@dataclass
class _Repairs:
    """What parsing a request repaired: invalid UTF-8 (by resource, scope and span position) and
    the spans that could not be parsed at all (position → reason)."""

    resources: set[int] = field(default_factory=set)
    scopes: set[tuple[int, int]] = field(default_factory=set)
    spans: set[tuple[int, int, int]] = field(default_factory=set)
    undecodable: dict[tuple[int, int, int], str] = field(default_factory=dict)


def _repair_lenient(msg: Any) -> bool:
    """Replace invalid UTF-8 in every former string field in place; True if any was found."""
    bad = False
    for fd, value in msg.ListFields():
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if fd.is_repeated else (value,)
            if fd.message_type.GetOptions().map_entry:  # no maps in OTLP traces; be safe
                continue
            for item in items:
                bad |= _repair_lenient(item)
        elif fd.full_name in _LENIENT_STRING_FIELDS:
            if fd.is_repeated:
                for i, b in enumerate(value):
                    fixed = _fix_bytes(b)
                    if fixed is not None:
                        value[i] = fixed
                        bad = True
            else:
                fixed = _fix_bytes(value)
                if fixed is not None:
                    setattr(msg, fd.name, fixed)
                    bad = True
    return bad


def _fix_bytes(b: bytes) -> bytes | None:
    try:
        b.decode("utf-8")
        return None
    except UnicodeDecodeError:
        return b.decode("utf-8", "replace").encode("utf-8")


def _parse_pb(body: bytes) -> tuple[Any, _Repairs | None]:
    """Parse protobuf bytes strictly, falling back to the lenient schema on invalid UTF-8, then to
    a span-by-span parse (:func:`_salvage`). Raises OTLPRequestError when even that fails."""
    try:
        return ExportTraceServiceRequest.FromString(body), None
    except Exception as strict_exc:  # noqa: BLE001 - upb raises DecodeError; anything else is 400 too
        try:
            lenient = _LenientRequest.FromString(body)
        except Exception:  # noqa: BLE001
            return _salvage(body, strict_exc)
    return _from_lenient(lenient)


def _parse_into(msg: Any, data: bytes) -> bool:
    """Parse ``data`` into the strict message ``msg``, repairing invalid UTF-8 on the way (True
    when it did). Raises what upb raises when the bytes cannot be parsed at all."""
    try:
        msg.ParseFromString(data)
        return False
    except Exception:  # noqa: BLE001 - retried leniently; a second failure propagates
        lenient = _message_class(_LENIENT_POOL, type(msg)).FromString(data)
        _repair_lenient(lenient)
        msg.ParseFromString(lenient.SerializeToString())
        return True


def _salvage(body: bytes, exc: Exception) -> tuple[Any, _Repairs]:
    """The request a whole parse refused, rebuilt span by span: its envelope (resources, scopes)
    parsed with the spans as byte strings, each span parsed alone into a request built in memory
    (so a span at upb's depth limit still fits: a lone span is 3 levels shallower); a span that
    cannot be parsed is left empty and named in ``undecodable`` (the walkers reject it with its
    reason). Raises OTLPRequestError (400) when the envelope itself cannot be parsed."""
    try:
        split = _SplitRequest.FromString(body)
    except Exception:  # noqa: BLE001
        raise OTLPRequestError(f"cannot decode protobuf body: {exc}") from None
    req = ExportTraceServiceRequest()
    rep = _Repairs()
    for ri, srs in enumerate(split.resource_spans):
        rs = req.resource_spans.add()
        try:
            if srs.HasField("resource") and _parse_into(rs.resource, srs.resource.SerializeToString()):
                rep.resources.add(ri)
            for si, sss in enumerate(srs.scope_spans):
                ss = rs.scope_spans.add()
                if sss.HasField("scope") and _parse_into(ss.scope, sss.scope.SerializeToString()):
                    rep.scopes.add((ri, si))
                for pi, raw in enumerate(sss.spans):
                    sp = ss.spans.add()
                    try:
                        if _parse_into(sp, raw):
                            rep.spans.add((ri, si, pi))
                    except Exception as span_exc:  # noqa: BLE001 - this span only
                        sp.Clear()
                        rep.undecodable[(ri, si, pi)] = f"cannot decode span: {span_exc}"
        except Exception:  # noqa: BLE001 - a resource or scope that cannot be parsed alone either
            raise OTLPRequestError(f"cannot decode protobuf body: {exc}") from None
    return req, rep


def _from_lenient(lenient: Any) -> tuple[Any, _Repairs]:
    bad = _Repairs()
    for ri, rs in enumerate(lenient.resource_spans):
        if rs.HasField("resource") and _repair_lenient(rs.resource):
            bad.resources.add(ri)
        for si, ss in enumerate(rs.scope_spans):
            if ss.HasField("scope") and _repair_lenient(ss.scope):
                bad.scopes.add((ri, si))
            for pi, sp in enumerate(ss.spans):
                if _repair_lenient(sp):
                    bad.spans.add((ri, si, pi))
        # schema_url fields of resource/scope spans are not read; repair them so the strict parse works
        _repair_lenient(rs)
    try:
        strict = ExportTraceServiceRequest.FromString(lenient.SerializeToString())
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"cannot decode protobuf body: {exc}") from None
    return strict, bad


class _Undecodable:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


class _Parsed:
    """A request :func:`_parse_pb` had to repair or salvage, with its :class:`_Repairs`."""

    __slots__ = ("req", "repairs")

    def __init__(self, req: Any, repairs: _Repairs | None):
        self.req, self.repairs = req, repairs


def deserialize_request(data: bytes) -> Any:
    """A gRPC ``request_deserializer`` that never raises.

    Returns an ``ExportTraceServiceRequest``, or — when a strict parse fails — a marker object:
    the request :func:`_parse_pb` repaired (invalid UTF-8) or salvaged span by span, which
    :func:`decode_request` decodes as :func:`decode_http` would, or one for which it raises
    ``OTLPRequestError`` (INVALID_ARGUMENT). grpcio turns an exception in a deserializer into an
    INTERNAL status, which OTLP clients may retry forever; this avoids it.
    """
    try:
        return ExportTraceServiceRequest.FromString(data)
    except Exception:  # noqa: BLE001
        try:
            return _Parsed(*_parse_pb(data))
        except OTLPRequestError as exc:
            return _Undecodable(exc.message)


def decode_request(req: Any, limits: Limits = _DEFAULT_LIMITS) -> DecodeResult:
    """Decode an already parsed ``ExportTraceServiceRequest`` (the gRPC path).

    Args:
        req: an ``ExportTraceServiceRequest``, or whatever :func:`deserialize_request` returned.
        limits: attribute / event limits (``max_body_bytes`` is the gRPC server's job here).

    Returns:
        DecodeResult. Raises OTLPRequestError only for a :func:`deserialize_request` failure marker.
    """
    try:
        if isinstance(req, _Undecodable):
            raise OTLPRequestError(req.reason)
        bad = None
        if isinstance(req, _Parsed):
            req, bad = req.req, req.repairs
        return _walk_pb(req, limits, bad)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None
