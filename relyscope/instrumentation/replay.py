"""The agent's side of shadow replays: the replay-target protocol, a plain-Python runner, an ASGI
app to mount, and the tool-proxy client the wrappers use while a replay runs.

How a replay works (README "Shadow replays and release gates"):

1. The sidecar POSTs a :class:`ReplayRequest` (JSON, protocol ``relyscope.replay/v1``) to the
   agent's replay target: the task input (possibly a rewritten prompt), the replay id, the
   perturbation spec, a W3C ``traceparent`` to continue and the URL of the tool proxy.
2. :func:`run_replay` attaches the trace context, marks the current context as a replay and calls
   the agent's own entry point with a :class:`ReplayTask`. The outermost :func:`agent_run` then
   carries ``relyscope.run.kind=shadow`` (or ``canary``), ``relyscope.shadow.of``,
   ``relyscope.replay.id`` and the ``relyscope.perturbation.*`` attributes, and the production
   task id — so the replay's spans flow through the normal pipeline and are scored like any run.
3. Inside a replay every tool executed through the wrappers (``@tool_call`` decorated functions,
   or ``handle.execute(fn, …)`` inside ``with tool_call(...)``) is sent to the sidecar's tool proxy
   instead of running: the proxy answers from the production run's recorded results, injects
   faults (:class:`ToolTimeout`, :class:`ToolHTTPError`, :class:`ToolNetworkError`, or a partial /
   malformed / empty body returned as the result), or refuses with :class:`SandboxMiss`. Only
   tools the operator allows as live read-only tools run for real. **Code written inside a
   ``with tool_call(...)`` block that does not go through ``execute`` runs for real** — route
   side-effecting tools through ``execute`` or the decorator.

Only the standard library and the OpenTelemetry API/SDK are used (the agent must not need the
sidecar's dependencies). Thread-safety: one replay per call of :func:`run_replay`; concurrent
replays in one process are isolated by ``contextvars``.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import math
import json
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "PROTOCOL",
    "ReplayApp",
    "ReplayProtocolError",
    "ReplayRequest",
    "ReplayTask",
    "SandboxMiss",
    "ToolFault",
    "ToolHTTPError",
    "ToolNetworkError",
    "ToolTimeout",
    "current_replay",
    "run_replay",
]

PROTOCOL = "relyscope.replay/v1"
_RUN_KINDS = ("shadow", "canary")
_FAMILIES = ("nominal", "fault", "env", "prompt")
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


class ReplayProtocolError(ValueError):
    """The replay request is not a valid ``relyscope.replay/v1`` body; the message names the field."""


class ToolFault(Exception):
    """A tool call failed inside a replay, as the sandbox decided. ``error_type`` becomes the tool
    span's ``error.type`` (``timeout``, ``http_500``, ``rate_limit``, ``network_error``,
    ``sandbox_miss``); ``fault_type`` is the injected fault (None for a sandbox miss)."""

    error_type = "tool_fault"

    def __init__(self, message: str, *, error_type: str | None = None, fault_type: str | None = None):
        super().__init__(message)
        if error_type:
            self.error_type = error_type
        self.fault_type = fault_type


class ToolTimeout(ToolFault, TimeoutError):
    """The tool did not answer in time (the proxy really waited)."""


class ToolHTTPError(ToolFault):
    """The tool service answered an HTTP error: ``status`` (500, 429 …), ``retry_after_s`` for 429."""

    def __init__(self, message: str, *, status: int, retry_after_s: float | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.status = status
        self.retry_after_s = retry_after_s


class ToolNetworkError(ToolFault, ConnectionError):
    """The connection to the tool service failed."""


class SandboxMiss(ToolFault):
    """The sandbox has no recorded answer for this call and will not approximate one: the replay is
    marked ``sandbox_miss`` (ENVIRONMENT) and kept out of agent metrics."""

    error_type = "sandbox_miss"


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """What the agent is asked to do: ``input`` (the user's request, possibly rewritten),
    ``task_id`` (the production task id every replay of it shares), ``agent`` (agent name of the
    production run), ``metadata`` (free-form, from the production run)."""

    task_id: str
    input: str | None
    agent: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One replay request (protocol ``relyscope.replay/v1``). ``deadline_s``: how long the sidecar
    waits for the reply (seconds)."""

    replay_id: str
    run_kind: str
    shadow_of: str
    task: ReplayTask
    family: str
    strength: str | None
    seed: int
    traceparent: str | None
    tool_proxy_url: str | None
    deadline_s: float = 60.0
    target_version: str | None = None  # the agent version the sidecar sent this replay to

    @classmethod
    def from_json(cls, body: Any) -> ReplayRequest:
        """Validate a decoded JSON body. Raises :class:`ReplayProtocolError` naming the field."""
        if not isinstance(body, Mapping):
            raise ReplayProtocolError("body must be a JSON object")
        proto = body.get("protocol", PROTOCOL)
        if proto != PROTOCOL:
            raise ReplayProtocolError(f"protocol: expected {PROTOCOL!r}, got {proto!r}")

        def text(obj: Mapping, key: str, where: str, *, required: bool = True) -> str | None:
            v = obj.get(key)
            if v is None and not required:
                return None
            if not isinstance(v, str) or not v:
                raise ReplayProtocolError(f"{where}{key}: a non-empty string is required")
            return v

        task = body.get("task")
        if not isinstance(task, Mapping):
            raise ReplayProtocolError("task: an object with task_id and input is required")
        meta = task.get("metadata") or {}
        if not isinstance(meta, Mapping):
            raise ReplayProtocolError("task.metadata: must be an object")
        inp = task.get("input")
        if inp is not None and not isinstance(inp, str):
            raise ReplayProtocolError("task.input: must be a string or null")
        pert = body.get("perturbation") or {}
        if not isinstance(pert, Mapping):
            raise ReplayProtocolError("perturbation: must be an object")
        family = pert.get("family", "nominal")
        if family not in _FAMILIES:
            raise ReplayProtocolError(f"perturbation.family: one of {_FAMILIES}, got {family!r}")
        seed = pert.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ReplayProtocolError("perturbation.seed: an integer is required")
        run_kind = body.get("run_kind", "shadow")
        if run_kind not in _RUN_KINDS:
            raise ReplayProtocolError(f"run_kind: one of {_RUN_KINDS}, got {run_kind!r}")
        tp = body.get("traceparent")
        if tp is not None and (not isinstance(tp, str) or not _TRACEPARENT.match(tp)):
            raise ReplayProtocolError("traceparent: a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>) is required")
        proxy = body.get("tool_proxy") or {}
        if not isinstance(proxy, Mapping):
            raise ReplayProtocolError("tool_proxy: must be an object with a url")
        url = text(proxy, "url", "tool_proxy.", required=False)
        if url is not None and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ReplayProtocolError("tool_proxy.url: an http(s) URL is required")
        deadline = body.get("deadline_s", 60.0)
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline) \
                or deadline <= 0:
            raise ReplayProtocolError("deadline_s: a positive number of seconds is required")
        strength = pert.get("strength")
        if strength is not None and not isinstance(strength, str):
            raise ReplayProtocolError("perturbation.strength: must be a string")
        tv = body.get("target_version")
        if tv is not None and (not isinstance(tv, str) or not tv):
            raise ReplayProtocolError("target_version: a non-empty string or null")
        return cls(
            replay_id=text(body, "replay_id", ""),  # type: ignore[arg-type]
            run_kind=run_kind,
            shadow_of=text(body, "shadow_of", ""),  # type: ignore[arg-type]
            task=ReplayTask(task_id=text(task, "task_id", "task."), input=inp,  # type: ignore[arg-type]
                            agent=task.get("agent") if isinstance(task.get("agent"), str) else None,
                            metadata=dict(meta)),
            family=family, strength=strength, seed=seed, traceparent=tp, tool_proxy_url=url,
            deadline_s=float(deadline), target_version=tv,
        )

    def to_json(self) -> dict[str, Any]:
        """The wire form (what the sidecar sends)."""
        return {
            "protocol": PROTOCOL, "replay_id": self.replay_id, "run_kind": self.run_kind,
            "shadow_of": self.shadow_of,
            "task": {"task_id": self.task.task_id, "input": self.task.input, "agent": self.task.agent,
                     "metadata": dict(self.task.metadata)},
            "perturbation": {"family": self.family, "strength": self.strength, "seed": self.seed},
            "traceparent": self.traceparent, "tool_proxy": {"url": self.tool_proxy_url},
            "deadline_s": self.deadline_s, "target_version": self.target_version,
        }


class _ActiveReplay:
    """A running replay: the request plus the call counter (tool calls are numbered in call order)."""

    __slots__ = ("request", "_lock", "_next", "_conn")

    def __init__(self, request: ReplayRequest):
        self.request = request
        self._lock = threading.Lock()
        self._next = 0
        self._conn: threading.local = threading.local()

    def next_index(self) -> int:
        with self._lock:
            i, self._next = self._next, self._next + 1
            return i

    def ask_proxy(self, call: dict[str, Any]) -> dict[str, Any]:
        """POST one tool call to the proxy; the decoded answer envelope. A proxy that cannot be
        reached or answers garbage is a :class:`SandboxMiss` (never a silent live call)."""
        url = self.request.tool_proxy_url
        if not url:
            raise SandboxMiss("replay has no tool proxy: tool calls cannot be answered")
        parts = urllib.parse.urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        body = json.dumps(call, default=str).encode()
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = getattr(self._conn, "c", None)
            try:
                if conn is None:
                    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
                    conn = cls(parts.hostname, parts.port, timeout=self.request.deadline_s)
                    self._conn.c = conn
                    conn.connect()
                    # http.client writes head and body separately: without this, Nagle holds the
                    # body until the server's delayed ACK (~40 ms per call)
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.request("POST", path, body=body, headers={"content-type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                self._conn.c = None
                if attempt:
                    raise SandboxMiss(f"tool proxy unreachable: {e}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise SandboxMiss(f"tool proxy answered HTTP {resp.status} without a JSON envelope") from None
        if not isinstance(answer, dict) or "outcome" not in answer:
            raise SandboxMiss(f"tool proxy answered HTTP {resp.status}: {str(answer)[:200]}")
        return answer

    def close(self) -> None:
        conn = getattr(self._conn, "c", None)
        if conn is not None:
            conn.close()


_ACTIVE: ContextVar[_ActiveReplay | None] = ContextVar("relyscope_replay", default=None)

# Replays running in this process (any thread). In a *sandbox process* (one that serves replays
# only: ReplayApp's default) a tool call made outside every replay's context — a thread the agent
# started, an executor without copied context — is attributed to the one running replay, or
# refused when there are several or none: a side effect never runs for real by losing its context.
_RUNNING: set[_ActiveReplay] = set()
_RUNNING_LOCK = threading.Lock()
_SANDBOX_PROCESS = False


def sandbox_process(enabled: bool = True) -> None:
    """Declare this process a replay-only sandbox (see :class:`ReplayApp`, ``exclusive``): every
    tool call through the wrappers is answered by a replay's tool proxy, never run for real."""
    global _SANDBOX_PROCESS
    _SANDBOX_PROCESS = bool(enabled)


def _active() -> _ActiveReplay | None:
    """The replay a tool call belongs to: this context's, else (sandbox process only) the single
    replay running in the process. Raises SandboxMiss in a sandbox process when it cannot tell."""
    active = _ACTIVE.get()
    if active is not None or not _SANDBOX_PROCESS:
        return active
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    if len(running) == 1:
        return running[0]
    raise SandboxMiss(
        "this process serves shadow replays only and this tool call is outside any replay's context "
        f"({len(running)} replays running): run threads with contextvars.copy_context().run(...) or "
        "asyncio.to_thread; the call is refused, never run for real")


def current_replay() -> ReplayRequest | None:
    """The replay running in this context (or, in a sandbox process, the one running replay a
    context-less tool call belongs to), or None in production."""
    active = _active()
    return active.request if active is not None else None


def run_replay(request: ReplayRequest | Mapping[str, Any], agent: Callable[[ReplayTask], Any], *,
               tracer_provider: Any = None, flush: bool = True) -> dict[str, Any]:
    """Run one replay in-process: validate ``request`` (a :class:`ReplayRequest` or its JSON), call
    ``agent(task)`` inside the replay context, flush the spans, and return the reply
    ``{"replay_id", "status": "completed" | "failed", "trace_id", "error"}``.

    An exception raised by ``agent`` is caught and reported as ``failed`` (its spans are recorded
    as in production). Raises :class:`ReplayProtocolError` for an invalid request.
    ``tracer_provider``: flushed at the end (default: the global provider, when it has
    ``force_flush``).
    """
    req = request if isinstance(request, ReplayRequest) else ReplayRequest.from_json(request)
    ctx = otel_context.get_current()
    if req.traceparent:
        ctx = TraceContextTextMapPropagator().extract({"traceparent": req.traceparent}, context=ctx)
    token = otel_context.attach(ctx)
    active = _ActiveReplay(req)
    rtoken = _ACTIVE.set(active)
    with _RUNNING_LOCK:
        _RUNNING.add(active)
    status, error = "completed", None
    try:
        out = agent(req.task)
        if inspect.isawaitable(out):  # an async entry point: run it here (ReplayApp: a worker thread)
            asyncio.run(_awaited(out))
    except Exception as e:  # noqa: BLE001 - the agent's failure is the replay's result, not ours
        status, error = "failed", f"{type(e).__qualname__}: {e}"
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(active)
        _ACTIVE.reset(rtoken)
        otel_context.detach(token)
        active.close()
        if flush:
            provider = tracer_provider or trace.get_tracer_provider()
            fn = getattr(provider, "force_flush", None)
            if callable(fn):
                fn()
    trace_id = req.traceparent.split("-")[1] if req.traceparent else None
    return {"replay_id": req.replay_id, "status": status, "trace_id": trace_id, "error": error}


async def _awaited(aw: Any) -> Any:
    return await aw


class ReplayApp:
    """An ASGI app serving the replay target: ``POST …/replay`` (any path ending in ``/replay``, or
    the mount root) runs :func:`run_replay` in a worker thread and answers its reply as JSON;
    ``GET …/healthz`` answers ``{"status": "ok"}``. A body that is not a valid request gets 400
    with the field to fix; an oversize body (> ``max_body_bytes``) 413.

    ``exclusive`` (default True) makes the process a replay-only sandbox
    (:func:`sandbox_process`): a tool call that lost its replay context (a thread the agent
    started) is answered by the one running replay's proxy or refused — never run for real. Serve
    the replay target as its own deployment or process; pass ``exclusive=False`` only to mount it
    into a service that also serves production traffic, and then keep every tool call in the
    replay's context (``contextvars.copy_context().run``, ``asyncio.to_thread``).
    """

    def __init__(self, agent: Callable[[ReplayTask], Any], *, tracer_provider: Any = None,
                 max_body_bytes: int = 1 << 20, exclusive: bool = True):
        if exclusive:
            sandbox_process(True)
        self.agent = agent
        self.tracer_provider = tracer_provider
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope.get("path", "").rstrip("/")
        root = scope.get("root_path", "").rstrip("/")
        method = scope.get("method", "GET")
        if method == "GET" and path.endswith("/healthz"):
            return await _send_json(send, 200, {"status": "ok", "protocol": PROTOCOL})
        if not (path.endswith("/replay") or path == root):
            return await _send_json(send, 404, {"error": f"no route {path}; POST …/replay"})
        if method != "POST":
            return await _send_json(send, 405, {"error": "use POST"})
        chunks, size = [], 0
        while True:
            msg = await receive()
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return await _send_json(send, 413, {"error": f"body over {self.max_body_bytes} bytes"})
            chunks.append(chunk)
            if not msg.get("more_body"):
                break
        try:
            req = ReplayRequest.from_json(json.loads(b"".join(chunks) or b"null"))
        except (ValueError, RecursionError) as e:  # JSONDecodeError, ReplayProtocolError, deep nesting
            return await _send_json(send, 400, {"error": str(e) or "body nested too deeply"})
        reply = await asyncio.get_running_loop().run_in_executor(
            None, lambda: run_replay(req, self.agent, tracer_provider=self.tracer_provider))
        await _send_json(send, 200, reply)


async def _send_json(send: Callable, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------------
# used by the tool_call wrapper (relyscope.instrumentation._core)
# ------------------------------------------------------------------------------------------------
def sandbox_answer(name: str, arguments: Any, call_id: str | None, side_effect: str | None) -> tuple[str, Any, dict]:
    """Ask the proxy about one tool call of the active replay. Returns ``(kind, value, answer)``:
    ``("result", result, …)``, ``("live", None, …)`` (run the real tool: an allowed read-only
    tool), ``("body", text, …)`` (a partial / malformed / empty body fault: hand ``text`` to the
    agent as the tool's result). Raises the :class:`ToolFault` the agent must see (timeout, HTTP
    error, network error, :class:`SandboxMiss`). Call only while :func:`current_replay` is set."""
    active = _active()
    if active is None:
        raise RuntimeError("no replay is running")
    call = {"name": name, "arguments": arguments, "call_id": call_id, "side_effect": side_effect,
            "index": active.next_index()}
    answer = active.ask_proxy(call)
    kind = answer.get("outcome")
    if kind == "result":
        return "result", answer.get("result"), answer
    if kind == "live":
        return "live", None, answer
    if kind == "sandbox_miss":
        raise SandboxMiss(answer.get("message") or f"no recorded result for {name}")
    if kind == "error":  # the production call failed this way: replayed as recorded, not injected
        e = answer.get("error") or {}
        etype = str(e.get("type") or "tool_error")
        msg = str(e.get("message") or etype)
        low = etype.lower()
        if "timeout" in low or "timed out" in low:
            raise ToolTimeout(msg, error_type=etype)
        if "network" in low or "connection" in low:
            raise ToolNetworkError(msg, error_type=etype)
        raise ToolHTTPError(msg, status=500, error_type=etype)
    if kind == "fault":
        f = answer.get("fault") or {}
        ftype = str(f.get("type") or "fault")
        msg = str(f.get("message") or ftype)
        if ftype in ("partial_response", "invalid_response", "empty_response"):
            return "body", f.get("body", ""), answer
        if ftype == "timeout":
            raise ToolTimeout(msg, error_type="timeout", fault_type=ftype)
        if ftype == "network_error":
            raise ToolNetworkError(msg, error_type="network_error", fault_type=ftype)
        status = int(f.get("status") or 500)
        raise ToolHTTPError(msg, status=status, retry_after_s=f.get("retry_after_s"),
                            error_type=ftype, fault_type=ftype)
    raise SandboxMiss(f"tool proxy answered an unknown outcome {kind!r}")


def replay_root_attributes() -> dict[str, Any]:
    """Attributes the outermost ``agent_run`` of a replay carries (conventions.md §2)."""
    try:
        req = current_replay()
    except SandboxMiss:  # an agent run outside every replay's context: its tool calls are refused
        return {}
    if req is None:
        return {}
    out: dict[str, Any] = {
        "relyscope.run.kind": req.run_kind, "relyscope.shadow.of": req.shadow_of,
        "relyscope.replay.id": req.replay_id, "relyscope.task.id": req.task.task_id,
        "relyscope.perturbation.family": req.family, "relyscope.perturbation.seed": req.seed,
    }
    if req.strength:
        out["relyscope.perturbation.strength"] = req.strength
    if req.target_version:  # used when the agent states no version of its own (see agent_run)
        out["gen_ai.agent.version"] = req.target_version
    return out
