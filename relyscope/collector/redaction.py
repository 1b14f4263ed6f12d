"""Redaction policy applied to spans before storage (attribute allow/deny lists, regex masks).

Deny and allow entries are attribute keys or shell-style globs (``fnmatch``: ``llm.input_messages.*``).
Masks are regular expressions replaced by ``[REDACTED]`` in the content attributes that carry
prompts, messages, tool arguments and results (``CONTENT_KEYS``) — the opt-in content of the GenAI
conventions. Redaction never rejects a span.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Any, Iterable

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan

__all__ = ["Redactor", "CONTENT_KEYS", "MASK"]

MASK = "[REDACTED]"
CONTENT_KEYS = (
    sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
    sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.GEN_AI_TOOL_CALL_RESULT, "input.value", "output.value",
    "traceloop.entity.input", "traceloop.entity.output", "gen_ai.prompt*", "gen_ai.completion*",
    "llm.input_messages*", "llm.output_messages*",
)


class Redactor:
    """``apply(span) -> span`` with denied keys dropped, only allowed keys kept (if an allow list is
    given) and mask patterns replaced in content attributes. Pure; safe from any thread.

    Raises ``re.error`` at construction for an invalid pattern (fail fast at start-up)."""

    def __init__(self, deny: Iterable[str] = (), patterns: Iterable[str] = (), allow: Iterable[str] = ()):
        self.deny = tuple(deny)
        self.allow = tuple(allow)
        self.patterns = [re.compile(p) for p in patterns]
        self.active = bool(self.deny or self.allow or self.patterns)

    def _keep(self, key: str) -> bool:
        if self.allow and not any(fnmatch.fnmatchcase(key, a) for a in self.allow):
            return False
        return not any(fnmatch.fnmatchcase(key, d) for d in self.deny)

    def _mask(self, value: Any) -> Any:
        if isinstance(value, str):
            for p in self.patterns:
                value = p.sub(MASK, value)
            return value
        if isinstance(value, list):
            return [self._mask(v) for v in value]
        if isinstance(value, dict):
            return {k: self._mask(v) for k, v in value.items()}
        return value

    def _attrs(self, attrs, *, content: bool):
        out = {}
        for k, v in attrs.items():
            if not self._keep(k):
                continue
            if self.patterns and (content or any(fnmatch.fnmatchcase(k, c) for c in CONTENT_KEYS)):
                v = self._mask(v)
            out[k] = v
        return out

    def apply(self, span: CanonicalSpan) -> CanonicalSpan:
        """The span with the policy applied to its attributes, its events' attributes (event
        payloads — prompts in GenAI events, exception messages — are all treated as content) and
        its resource attributes (deny/allow only)."""
        if not self.active:
            return span
        attrs = self._attrs(span.attributes, content=False)
        events = tuple(dataclasses.replace(e, attributes=self._attrs(e.attributes, content=True))
                       for e in span.events)
        resource = {k: v for k, v in span.resource.items() if self._keep(k)} if (self.deny or self.allow) \
            else span.resource
        if attrs == dict(span.attributes) and events == span.events and resource == dict(span.resource):
            return span
        return dataclasses.replace(span, attributes=attrs, events=events, resource=resource,
                                   flags=span.flags | {"redacted"})
