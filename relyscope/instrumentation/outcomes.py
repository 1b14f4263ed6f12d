"""Post an outcome after the run has ended, by trace id or trial id (stdlib only).

Frameworks end their agent span before the application knows whether the run succeeded (the
database check, the user's thumbs-up), and most never hand the caller a trace id. The trace id
comes from :class:`relyscope.instrumentation.AgentRunHandle` (``run.trace_id``), from
:class:`relyscope.instrumentation.baggage.TaskScope` (``scope.trace_id``) or from
:func:`current_trace_id` inside the run; :func:`post_outcome` sends it to the sidecar's outcome API
(``POST /api/v1/outcomes``, metrics.md §6) with ``urllib`` — no dependency of the sidecar enters
the agent's process.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from opentelemetry import trace

__all__ = ["post_outcome", "current_trace_id", "OutcomePostError", "DEFAULT_API"]

DEFAULT_API = "http://127.0.0.1:9464"


class OutcomePostError(Exception):
    """The sidecar did not take the outcome. ``status``: the HTTP status (None: not reached);
    ``detail``: the sidecar's reason (a 422 names the field). A 4xx is permanent (fix the call);
    a 503 or ``status`` None is retryable."""

    def __init__(self, message: str, status: int | None, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def current_trace_id() -> str | None:
    """Trace id (32 lowercase hex) of the span current in this context, or None outside any span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def post_outcome(
    success: bool | None = None,
    *,
    trace_id: str | None = None,
    trial_id: str | None = None,
    outcome: str | None = None,
    score: float | None = None,
    source: str = "api",
    verifier: bool = False,
    api: str = DEFAULT_API,
    token: str | None = None,
    timeout_s: float = 10.0,
) -> dict:
    """``POST {api}/api/v1/outcomes`` for one trace (``trace_id``) or trial (``trial_id``).

    ``success`` True/False, or ``outcome`` ``success | failure | unknown``; ``score`` in [0, 1];
    ``verifier=True`` when the application's own environment check decided (it outranks the
    span's outcome, metrics.md §6). Returns the sidecar's reply: ``status`` is ``recorded``,
    ``overridden_by_verifier`` or ``no_effect``; ``known`` is False while the trial is not
    finalized yet (the outcome still applies once it is). Blocks for at most ``timeout_s``.

    Raises ValueError for a call that gives neither or both ids, or neither ``success`` nor
    ``outcome``; :class:`OutcomePostError` when the sidecar refuses it or cannot be reached.
    """
    if (trace_id is None) == (trial_id is None):
        raise ValueError("give exactly one of trace_id or trial_id")
    if success is None and outcome is None:
        raise ValueError("give success or outcome")
    body: dict[str, Any] = {"source": source, "verifier": bool(verifier)}
    body.update({k: v for k, v in (("trace_id", trace_id), ("trial_id", trial_id), ("outcome", outcome),
                                   ("score", score)) if v is not None})
    if success is not None:
        body["success"] = bool(success)
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(api.rstrip("/") + "/api/v1/outcomes", data=json.dumps(body).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - the caller's URL
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            detail = json.loads(raw).get("detail")
        except (ValueError, AttributeError):
            detail = raw[:500].decode("utf-8", "replace")
        raise OutcomePostError(f"the sidecar at {api} refused the outcome ({e.code}): {detail}",
                               e.code, detail) from None
    except (urllib.error.URLError, OSError) as e:
        raise OutcomePostError(f"cannot reach the sidecar at {api}: {e} (the sidecar's management API: pass "
                               f"api='http://HOST:PORT' where it listens, the default is {DEFAULT_API})",
                               None) from None
