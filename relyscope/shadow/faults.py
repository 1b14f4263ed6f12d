"""Fault injection for shadow replays (metrics.md §4 "fault" [R26 App. F.3]).

During a fault replay each tool call is independently faulted with probability ``p_fault``
(default 0.2); the fault type is drawn from :data:`FAULT_MIX`. The injector only decides *what the
agent sees*: there is no simulated retry or recovery here (unlike HAL) — the tool proxy answers the
call with the :class:`Fault` and the agent must recover by itself.

Pure and deterministic: :meth:`FaultInjector.draw` depends only on its arguments and the
injector's configuration (a BLAKE2b hash of ``(seed, call_index, tool_name)`` seeds a private
:class:`random.Random`; Python's randomized ``hash()`` is never used), so a replay can be repeated
exactly from its recorded seed. No I/O, no clock, no globals; instances are immutable and safe to
share between threads.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

__all__ = [
    "FAULT_MIX",
    "FAULT_TYPES",
    "Fault",
    "FaultInjector",
    "serialize_result",
]

#: Fault types in their canonical order (the order the cumulative draw walks, whatever the order
#: of a configured mix's keys).
FAULT_TYPES: Final[tuple[str, ...]] = (
    "timeout",
    "http_500",
    "rate_limit",
    "network_error",
    "partial_response",
    "invalid_response",
    "empty_response",
)

#: Default fault-type mix of metrics.md §4 [R26 App. F.3]; weights sum to 1.
FAULT_MIX: Final[Mapping[str, float]] = MappingProxyType({
    "timeout": 0.30,
    "http_500": 0.25,
    "rate_limit": 0.20,
    "network_error": 0.15,
    "partial_response": 0.05,
    "invalid_response": 0.03,
    "empty_response": 0.02,
})

_MIX_TOLERANCE: Final = 1e-9


@dataclass(frozen=True, slots=True)
class Fault:
    """What the agent sees instead of the recorded tool result.

    Attributes:
        type: one of :data:`FAULT_TYPES` (the value of the ``relyscope.fault.type`` span attribute).
        status: HTTP status the tool answers with: 500 (``http_500``), 429 (``rate_limit``), 200 for
            the body faults (``partial_response``, ``invalid_response``, ``empty_response``: the
            transport succeeded, the content is broken); None when no response arrives at all
            (``timeout``, ``network_error``).
        retry_after_s: seconds the 429 asks the client to wait (``Retry-After``); None otherwise.
        delay_s: seconds the proxy must really wait before answering (``timeout``: the injector's
            ``timeout_s``, after which the proxy fails the call without a response); 0.0 otherwise.
        body: response body the agent receives as the tool result for the body faults — a strict,
            unparseable prefix of the recorded result's serialization (``partial_response``), a
            malformed body such as an HTML gateway page or JSON with a syntax error
            (``invalid_response``), ``""`` (``empty_response``); None for the other types.
        message: the error text a real HTTP client library (httpx-style) would show.
    """

    type: str
    status: int | None
    retry_after_s: float | None
    delay_s: float
    body: str | None
    message: str

    @property
    def retry_after_header(self) -> str | None:
        """``Retry-After`` header value (HTTP delta-seconds: a non-negative integer, rounded up),
        or None when the fault is not a 429."""
        if self.retry_after_s is None:
            return None
        return str(math.ceil(self.retry_after_s))


def serialize_result(result: Any) -> str:
    """The body a tool answered with for a recorded ``result``: a ``str`` is the recorded body
    itself; any other value is ``json.dumps(result, ensure_ascii=False, default=str)`` (default
    separators ``", "`` and ``": "``). Partial responses are prefixes of this text."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, default=str)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _decode_error(text: str) -> str:
    try:
        json.loads(text)
    except ValueError as exc:
        return f"JSONDecodeError: {exc}"
    return "JSONDecodeError"  # pragma: no cover - only called on unparseable text


_HTML_PAGES: Final[tuple[str, ...]] = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Service Unavailable</title></head>\n"
    "<body><h1>Service Unavailable</h1><p>The server is temporarily unable to service your request "
    "due to maintenance downtime or capacity problems. Please try again later.</p></body>\n</html>\n",
)


def _seed_rng(*parts: Any) -> random.Random:
    material = json.dumps(["relyscope.shadow.faults", *parts], separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.blake2b(material.encode("utf-8"), digest_size=16).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _partial_body(full: str, rng: random.Random) -> str:
    """A strict prefix of ``full`` cut at 25–90 % of its length, moved earlier until it is not
    parseable JSON (the empty prefix never is), as a connection dropped mid-body leaves it."""
    if not full:
        return ""
    n = len(full)
    cut = min(n - 1, max(1, int(n * rng.uniform(0.25, 0.9))))
    while cut > 0 and _is_json(full[:cut]):
        cut -= 1
    return full[:cut]


def _malformed_bodies(full: str, result: Any) -> list[str]:
    """Realistic broken bodies for ``result``, each verified unparseable: a trailing comma before
    the closing bracket, a Python repr sent as JSON (single quotes, True/None), a body cut after
    its last value, and HTML error pages from a gateway."""
    candidates: list[str] = []
    stripped = full.rstrip()
    if stripped[-1:] in ("}", "]") and len(stripped) > 2:
        candidates.append(stripped[:-1].rstrip() + ",\n" + stripped[-1])  # trailing comma
    if not isinstance(result, str):
        candidates.append(repr(result))  # a Python dict/list written instead of JSON
    if stripped[-1:] in ("}", "]"):
        candidates.append(stripped[:-1])  # closing bracket lost
    candidates.extend(_HTML_PAGES)
    return [c for c in candidates if c and not _is_json(c)]


class FaultInjector:
    """Decides, per tool call of a fault replay, whether and how the call fails.

    Args:
        p_fault: probability in [0, 1] that a call is faulted (metrics.md §4 default 0.2).
        mix: fault type -> weight; keys from :data:`FAULT_TYPES` (missing types weigh 0), weights
            finite and >= 0, summing to 1 within 1e-9. Default :data:`FAULT_MIX`.
        timeout_s: seconds a ``timeout`` fault really waits before failing the call (> 0, finite).
        retry_after_s: seconds a ``rate_limit`` (429) asks the client to wait (>= 0, finite).
        tools: if given, only calls to these tool names can be faulted; others never are.

    Raises:
        ValueError: any argument out of range, an unknown fault type, a mix that does not sum to 1.
        TypeError: ``tools`` given as a single string or holding non-strings.

    Immutable; safe to share between threads.
    """

    __slots__ = ("_p", "_mix", "_cumulative", "_timeout_s", "_retry_after_s", "_tools")

    def __init__(
        self,
        p_fault: float = 0.2,
        mix: Mapping[str, float] = FAULT_MIX,
        *,
        timeout_s: float = 5.0,
        retry_after_s: float = 1.0,
        tools: Collection[str] | None = None,
    ) -> None:
        if isinstance(p_fault, bool) or not isinstance(p_fault, (int, float)) or not 0.0 <= p_fault <= 1.0:
            raise ValueError(f"p_fault must be a probability in [0, 1], got {p_fault!r}")
        if not isinstance(mix, Mapping) or not mix:
            raise ValueError(f"mix must be a non-empty mapping of fault type -> weight, got {mix!r}")
        unknown = sorted(str(k) for k in mix if k not in FAULT_TYPES)
        if unknown:
            raise ValueError(f"unknown fault type(s) in mix: {unknown}; known types: {list(FAULT_TYPES)}")
        for k, w in mix.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ValueError(f"mix weight for {k!r} must be a finite number >= 0, got {w!r}")
        total = math.fsum(float(w) for w in mix.values())
        if abs(total - 1.0) > _MIX_TOLERANCE:
            raise ValueError(f"mix weights must sum to 1 (within {_MIX_TOLERANCE:g}), got {total!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
        if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, (int, float)) \
                or not math.isfinite(retry_after_s) or retry_after_s < 0:
            raise ValueError(f"retry_after_s must be a finite number of seconds >= 0, got {retry_after_s!r}")
        if tools is not None:
            if isinstance(tools, (str, bytes)):
                raise TypeError(f"tools must be a collection of tool names, not a single string: {tools!r}")
            bad = [t for t in tools if not isinstance(t, str)]
            if bad:
                raise TypeError(f"tools must hold tool names (str), got {bad!r}")
        self._p = float(p_fault)
        self._mix: Mapping[str, float] = MappingProxyType({t: float(mix.get(t, 0.0)) for t in FAULT_TYPES})
        cumulative: list[tuple[float, str]] = []
        acc = 0.0
        for t in FAULT_TYPES:
            if self._mix[t] > 0:
                acc += self._mix[t]
                cumulative.append((acc, t))
        self._cumulative = tuple(cumulative)
        self._timeout_s = float(timeout_s)
        self._retry_after_s = float(retry_after_s)
        self._tools: frozenset[str] | None = None if tools is None else frozenset(tools)

    @property
    def p_fault(self) -> float:
        """Per-call fault probability."""
        return self._p

    @property
    def mix(self) -> Mapping[str, float]:
        """Read-only mix over all of :data:`FAULT_TYPES` (unconfigured types weigh 0.0)."""
        return self._mix

    @property
    def timeout_s(self) -> float:
        """Seconds a timeout fault waits."""
        return self._timeout_s

    @property
    def retry_after_s(self) -> float:
        """Seconds a 429 asks the client to wait."""
        return self._retry_after_s

    @property
    def tools(self) -> frozenset[str] | None:
        """Tool names that can be faulted, or None for every tool."""
        return self._tools

    def __repr__(self) -> str:
        tools = None if self._tools is None else sorted(self._tools)
        return (f"FaultInjector(p_fault={self._p!r}, mix={dict(self._mix)!r}, timeout_s={self._timeout_s!r}, "
                f"retry_after_s={self._retry_after_s!r}, tools={tools!r})")

    def draw(self, seed: int, call_index: int, tool_name: str, result: Any) -> Fault | None:
        """The fault for one tool call, or None when the call is answered normally.

        Args:
            seed: the replay's perturbation seed (``relyscope.perturbation.seed``).
            call_index: position of the call in the replay (0-based, >= 0).
            tool_name: ``gen_ai.tool.name`` of the call.
            result: the recorded result the call would have returned (any JSON value, or the
                recorded body as ``str``); used only to build partial/invalid bodies.

        Returns:
            None with probability ``1 - p_fault`` (always None for a tool outside ``tools``),
            else a :class:`Fault` whose type is drawn from the mix. Same arguments, same answer.

        Raises:
            TypeError: ``seed``/``call_index`` not ints or ``tool_name`` not a str.
            ValueError: negative ``call_index``.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if isinstance(call_index, bool) or not isinstance(call_index, int):
            raise TypeError(f"call_index must be an int, got {call_index!r}")
        if call_index < 0:
            raise ValueError(f"call_index must be >= 0, got {call_index}")
        if not isinstance(tool_name, str):
            raise TypeError(f"tool_name must be a str, got {tool_name!r}")
        if self._tools is not None and tool_name not in self._tools:
            return None
        rng = _seed_rng(seed, call_index, tool_name)
        u_fault, u_type = rng.random(), rng.random()
        if u_fault >= self._p:
            return None
        return self._build(self._pick(u_type), result, rng)

    def force(self, fault_type: str, result: Any, *, seed: int = 0) -> Fault:
        """The fault of type ``fault_type`` for a call whose recorded result is ``result``, with
        this injector's ``timeout_s`` and ``retry_after_s`` (for single-type, p = 1 tests and
        replays). ``seed`` picks the cut point / malformed variant of body faults.

        Raises:
            ValueError: unknown ``fault_type``.
            TypeError: ``seed`` not an int.
        """
        if fault_type not in FAULT_TYPES:
            raise ValueError(f"unknown fault type {fault_type!r}; known types: {list(FAULT_TYPES)}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        return self._build(fault_type, result, _seed_rng("force", seed, fault_type))

    def _pick(self, u: float) -> str:
        for edge, t in self._cumulative:
            if u < edge:
                return t
        return self._cumulative[-1][1]  # u within rounding of 1.0

    def _build(self, fault_type: str, result: Any, rng: random.Random) -> Fault:
        if fault_type == "timeout":
            return Fault(fault_type, None, None, self._timeout_s, None,
                         f"ReadTimeout: timed out (no response within {self._timeout_s:g} s)")
        if fault_type == "http_500":
            return Fault(fault_type, 500, None, 0.0, None,
                         "HTTPStatusError: Server error '500 Internal Server Error'")
        if fault_type == "rate_limit":
            return Fault(fault_type, 429, self._retry_after_s, 0.0, None,
                         f"HTTPStatusError: Client error '429 Too Many Requests' "
                         f"(Retry-After: {math.ceil(self._retry_after_s)})")
        if fault_type == "network_error":
            return Fault(fault_type, None, None, 0.0, None, "ConnectError: [Errno 111] Connection refused")
        if fault_type == "empty_response":
            return Fault(fault_type, 200, None, 0.0, "", _decode_error(""))
        full = serialize_result(result)
        if fault_type == "partial_response":
            body = _partial_body(full, rng)
            got, expected = len(body.encode("utf-8")), len(full.encode("utf-8"))
            return Fault(fault_type, 200, None, 0.0, body,
                         "RemoteProtocolError: peer closed connection without sending complete message body "
                         f"(received {got} bytes, expected {expected})")
        # invalid_response
        body = rng.choice(_malformed_bodies(full, result))
        return Fault(fault_type, 200, None, 0.0, body, _decode_error(body))
