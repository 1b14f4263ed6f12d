"""Small, total value helpers shared by the mapping modules: never raise on odd input.

Attribute values arrive as ``str | bool | int | float | bytes | list | dict`` (CanonicalSpan).
"""

from __future__ import annotations

import json
import math
from typing import Any, Final, Iterable, Mapping

from relyscope.model import MAX_COUNT

__all__ = [
    "first",
    "decode_json_once",
    "as_str",
    "as_int",
    "as_float",
    "as_outcome",
    "as_bool",
    "as_unit",
    "as_enum",
    "as_str_tuple",
    "message_text",
    "first_user_text",
    "requested_call_ids",
]

_JSON_OPENERS = frozenset('{["')


def first(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """First value among ``keys`` that is present and not ``None``/``""``; else ``None``."""
    for k in keys:
        v = attrs.get(k)
        if v is not None and v != "":
            return v
    return None


def decode_json_once(value: Any) -> Any:
    """Decode a JSON string exactly once; anything else is returned unchanged.

    Only strings whose first non-blank character opens a JSON object, array or string are decoded
    (``"42"``, ``"true"``, ``"null"`` stay strings: a bare scalar is more likely text than JSON).
    A string that decodes to a string is returned as that string and never decoded again; a
    string that is not valid JSON is returned as is. dict/list values (kvlist/array attributes)
    are returned unchanged, never re-encoded.
    """
    if isinstance(value, str):
        s = value.lstrip()
        if s[:1] in _JSON_OPENERS:
            try:
                return json.loads(s)
            except ValueError:
                return value
        return value
    return value


def as_str(value: Any) -> str | None:
    """Non-empty string (ints are formatted); else None."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def as_int(value: Any) -> int | None:
    """Non-negative integer count (at most :data:`relyscope.model.MAX_COUNT`) from int, integral
    float or decimal string; else None (unknown)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and 0 <= value <= MAX_COUNT:
            return int(value)
        return None
    if isinstance(value, str):
        s = value.strip()
        if s.isdigit() and len(s.lstrip("0")) <= 16:  # MAX_COUNT has 16 digits: no big-int parse of more
            n = int(s)
            return n if n <= MAX_COUNT else None
    return None


def as_float(value: Any) -> float | None:
    """Finite float from int, float or numeric string; else None (bools rejected)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        f = float(value)
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def as_bool(value: Any) -> bool | None:
    """bool from a bool, ``"true"``/``"false"`` (any case) or 0/1; else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        s = value.strip().lower()
        if s == "true":
            return True
        if s == "false":
            return False
        return None
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def as_unit(value: Any) -> float | None:
    """A float in the closed interval [0, 1]; anything outside (or non-numeric) gives None."""
    f = as_float(value)
    if f is None or f < 0.0 or f > 1.0:
        return None
    return f


#: outcome words besides the enum (conventions.md ``relyscope.outcome``: success, failure, unknown)
_OUTCOME_WORDS: Final = {"success": "success", "failure": "failure", "unknown": "unknown", "pass": "success",
                         "passed": "success", "succeeded": "success", "fail": "failure", "failed": "failure",
                         "1": "success", "0": "failure"}


def as_outcome(value: Any) -> str | None:
    """``success`` / ``failure`` / ``unknown`` from ``relyscope.outcome``: the enum (any case), a
    bool or what :func:`as_bool` reads as one (``true``/``false``, 1/0), 1.0 / 0.0, ``"1"`` / ``"0"``,
    or pass(ed) / succeeded / fail(ed); anything else None (not given). A bool is what ``span.set_attribute(…, True)``
    writes: it was refused, and the run's outcome stayed unknown."""
    if isinstance(value, str):
        word = _OUTCOME_WORDS.get(value.strip().lower())
        if word is not None:
            return word
    if isinstance(value, float) and value in (0.0, 1.0):  # a double 1.0 / 0.0, as some SDKs send ints
        return "success" if value else "failure"
    b = as_bool(value)
    return None if b is None else "success" if b else "failure"


def as_enum(value: Any, allowed: Iterable[str]) -> str | None:
    """Lower-cased, stripped string if it is one of ``allowed``; else None."""
    if not isinstance(value, str):
        return None
    s = value.strip().lower()
    return s if s in allowed else None


def as_str_tuple(value: Any) -> tuple[str, ...]:
    """Tuple of non-empty strings from a list of strings or a single string (JSON array strings
    are decoded once)."""
    value = decode_json_once(value) if isinstance(value, str) and value[:1] == "[" else value
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value if isinstance(v, str) and v)
    return ()


# --- message content -----------------------------------------------------------------------------

_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part or None
    if not isinstance(part, Mapping):
        return None
    text = part.get("text")
    if isinstance(text, str):
        return text or None
    ptype = part.get("type")
    if ptype is None or ptype in _TEXT_TYPES:
        content = part.get("content")
        if isinstance(content, str):
            return content or None
    return None


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content or None
    if isinstance(content, list):
        texts = [t for t in (_part_text(p) for p in content) if t]
        return "\n".join(texts) if texts else None
    return None


def message_text(message: Any) -> str | None:
    """Text of one chat message in any common shape: GenAI ``{"role", "parts": [{"type": "text",
    "content"}]}``, OpenAI ``{"role", "content": str | [{"type": "text", "text"}]}``, Gemini/Genkit
    ``{"role", "parts"|"content": [{"text"}]}``. Several text parts are joined with a newline."""
    if isinstance(message, str):
        return message or None
    if not isinstance(message, Mapping):
        return None
    for key in ("parts", "content", "contents"):
        if key in message:
            text = _content_text(message[key])
            if text:
                return text
    return None


_USER_ROLES = frozenset({"user", "human"})


def first_user_text(messages: Any) -> str | None:
    """Text of the first user message in a message list (a JSON string is decoded once; a dict
    holding ``messages``/``contents`` is unwrapped). None when there is no user message."""
    messages = decode_json_once(messages)
    if isinstance(messages, Mapping):
        for key in ("messages", "contents", "input"):
            inner = messages.get(key)
            if isinstance(inner, list):
                messages = inner
                break
        else:
            return None
    if not isinstance(messages, list):
        return None
    for m in messages:
        if isinstance(m, Mapping) and m.get("role") in _USER_ROLES:
            text = message_text(m)
            if text:
                return text
    return None


def requested_call_ids(messages: Any) -> tuple[str, ...]:
    """Tool-call ids a model's output messages request, in order, without duplicates.

    Shapes: GenAI parts ``{"type": "tool_call", "id"}``, OpenAI ``"tool_calls": [{"id"}]``,
    Anthropic content ``{"type": "tool_use", "id"}``, Responses API ``{"type": "function_call",
    "call_id"}``, Gemini parts ``{"function_call"|"functionCall": {"id"}}``, Genkit
    ``{"toolRequest": {"ref"}}``. A single message dict is accepted as well as a list.
    """
    messages = decode_json_once(messages)
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, list):
        return ()
    out: list[str] = []

    def add(v: Any) -> None:
        s = as_str(v)
        if s and s not in out:
            out.append(s)

    for m in messages:
        if not isinstance(m, Mapping):
            continue
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            for c in calls:
                if isinstance(c, Mapping):
                    add(c.get("id"))
        for key in ("parts", "content"):
            parts = m.get(key)
            if not isinstance(parts, list):
                continue
            for p in parts:
                if not isinstance(p, Mapping):
                    continue
                ptype = p.get("type")
                if ptype in ("tool_call", "tool_use"):
                    add(p.get("id"))
                elif ptype == "function_call":
                    add(p.get("call_id") or p.get("id"))
                else:
                    fc = p.get("function_call") or p.get("functionCall")
                    if isinstance(fc, Mapping):
                        add(fc.get("id"))
                    tr = p.get("toolRequest")
                    if isinstance(tr, Mapping):
                        add(tr.get("ref"))
    return tuple(out)


def requested_calls(messages: Any) -> tuple[tuple[str, str | None, Any], ...]:
    """``(call id, tool name, arguments)`` of each tool call a model's output messages request,
    in order, one per id (the shapes of :func:`requested_call_ids`, plus the Vercel AI SDK's
    ``ai.response.toolCalls`` items ``{"toolCallId", "toolName", "args"|"input"}``). Arguments
    holding JSON text are decoded once. Lets a call the model asked for be graded even when no
    tool span follows (a client-side tool, D15)."""
    messages = decode_json_once(messages)
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, list):
        return ()
    out: dict[str, tuple[str, str | None, Any]] = {}

    def add(cid: Any, name: Any, args: Any) -> None:
        c = as_str(cid)
        if c and c not in out:
            out[c] = (c, as_str(name), decode_json_once(args))

    for m in messages:
        if not isinstance(m, Mapping):
            continue
        if "toolCallId" in m:  # Vercel AI SDK
            add(m.get("toolCallId"), m.get("toolName"), m.get("args", m.get("input")))
            continue
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            for c in calls:
                if isinstance(c, Mapping):
                    fn = c.get("function") if isinstance(c.get("function"), Mapping) else {}
                    add(c.get("id"), c.get("name") or fn.get("name"), c.get("arguments", fn.get("arguments")))
        for key in ("parts", "content"):
            parts = m.get(key)
            if not isinstance(parts, list):
                continue
            for p in parts:
                if not isinstance(p, Mapping):
                    continue
                ptype = p.get("type")
                if ptype in ("tool_call", "tool_use"):
                    add(p.get("id"), p.get("name"), p.get("arguments", p.get("input")))
                elif ptype == "function_call":
                    add(p.get("call_id") or p.get("id"), p.get("name"), p.get("arguments"))
                else:
                    fc = p.get("function_call") or p.get("functionCall")
                    if isinstance(fc, Mapping):
                        add(fc.get("id"), fc.get("name"), fc.get("args"))
    return tuple(out.values())
