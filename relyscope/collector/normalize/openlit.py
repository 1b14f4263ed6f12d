"""OpenLIT: GenAI semconv (pre-move names, read by :mod:`.genai`) plus ``gen_ai.usage.cost``
(USD) and the prompt as a ``gen_ai.content.prompt`` event holding ``"role: content"`` lines."""

from __future__ import annotations

from typing import Any, Final

from relyscope.model import CanonicalSpan

from ._values import as_float, first
from .versions import CONVENTIONS

__all__ = ["NAME", "detect", "extract"]

NAME: Final = "openlit"
_A = CONVENTIONS[NAME].attrs

_COST = _A["cost"]
_PROMPT_EVENT = _A["prompt_event"][0]
_PROMPT_ATTR = _A["prompt_event_attr"][0]
_SDK_NAME = _A["sdk_name_value"][0]
_ROLES: Final = ("user", "system", "assistant", "tool", "developer", "function")


def detect(span: CanonicalSpan) -> bool:
    """True for ``gen_ai.usage.cost``, an ``openlit`` scope, or an ``openlit`` telemetry SDK."""
    return (
        _COST[0] in span.attributes
        or span.scope_name.startswith(_SDK_NAME)
        or span.resource.get("telemetry.sdk.name") == _SDK_NAME
    )


def _user_text(prompt: str) -> str | None:
    """The first ``user: ...`` block of OpenLIT's formatted prompt (continuation lines kept until
    the next ``<role>: `` line)."""
    lines: list[str] | None = None
    for line in prompt.split("\n"):
        role, sep, rest = line.partition(": ")
        is_role_line = bool(sep) and role in _ROLES
        if lines is None:
            if is_role_line and role == "user":
                lines = [rest]
        elif is_role_line:
            break
        else:
            lines.append(line)
    if lines is None:
        return None
    text = "\n".join(lines).strip()
    return text or None


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """Cost and prompt text of an OpenLIT span (absent fields omitted)."""
    out: dict[str, Any] = {"cost_usd": as_float(first(span.attributes, _COST))}
    for e in span.events:
        if e.name == _PROMPT_EVENT:
            prompt = e.attributes.get(_PROMPT_ATTR)
            if isinstance(prompt, str):
                out["first_user_input"] = _user_text(prompt)
            break
    return out
