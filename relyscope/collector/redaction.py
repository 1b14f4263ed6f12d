"""Redaction policy applied to spans before storage (attribute allow/deny lists, regex masks).

Deny and allow entries are attribute keys or shell-style globs (``fnmatch``: ``llm.input_messages.*``),
matched **case-insensitively** (``User.Email`` denies ``user.email`` and ``USER.EMAIL``). They apply
to span attributes, event attributes and resource attributes.

Mask patterns (regular expressions, replaced by ``[REDACTED]``) apply to **every string that is
stored or served**: the span name, the status message, every string attribute value (nested in
lists and maps too) of the span, of its events and of its resource, event names, and the scope
name and version — whatever convention carries the content (GenAI ``gen_ai.*.messages``,
OpenInference ``input.value`` / ``tool_call.function.arguments``, Vercel ``ai.prompt`` /
``ai.toolCall.args``, ADK ``gcp.vertex.agent.*``, Langfuse ``langfuse.observation.*``, Genkit
``genkit:*``, OpenAI Agents ``tool_arguments``, …). Trials are assembled from the redacted spans,
so the steps ``/api/v1/trials`` serves are masked too. Not masked: ids, attribute keys, numbers
and booleans, and W3C trace state. Redaction never rejects a span.

Cost: each pattern is one ``re.sub`` per string; figures in ``bench/README.md``
(``bench/bench_redaction.py``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Any, Iterable, Mapping

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan

__all__ = ["Redactor", "CONTENT_KEYS", "MASK"]

MASK = "[REDACTED]"
#: Attributes that carry prompts, messages, tool arguments and results in the conventions
#: relyscope reads (documentation of where content travels; masks apply to every string).
CONTENT_KEYS = (
    sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
    sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.GEN_AI_TOOL_CALL_RESULT, "input.value", "output.value",
    "traceloop.entity.input", "traceloop.entity.output", "gen_ai.prompt*", "gen_ai.completion*",
    "llm.input_messages*", "llm.output_messages*", "tool_call.function.arguments", "ai.prompt*",
    "ai.toolCall.args", "ai.toolCall.result", "ai.response.*", "gcp.vertex.agent.*",
    "langfuse.observation.input", "langfuse.observation.output", "genkit:input", "genkit:output",
    "tool_arguments",
)
_SELF_REF = re.compile(r"\\[1-9]|\(\?P=")
_KEY_CACHE_MAX = 8192  # distinct attribute keys whose keep/drop decision is remembered


class Redactor:
    """``apply(span) -> span`` with denied keys dropped, only allowed keys kept (if an allow list is
    given) and mask patterns replaced in every string (module docstring). Safe from any thread
    (the key cache is a dict only ever filled; a race costs one recomputation).

    Raises ``re.error`` at construction for an invalid pattern (fail fast at start-up)."""

    def __init__(self, deny: Iterable[str] = (), patterns: Iterable[str] = (), allow: Iterable[str] = ()):
        self.deny = tuple(d.lower() for d in deny)
        self.allow = tuple(a.lower() for a in allow)
        patterns = list(patterns)
        self.patterns = [re.compile(p) for p in patterns]
        # one alternation scans each string once instead of once per pattern; kept apart when a
        # pattern numbers its own groups (backreferences) or sets global flags, which would break
        if len(patterns) > 1 and not any(_SELF_REF.search(p) or p.startswith("(?") and not p.startswith("(?:")
                                         for p in patterns):
            try:
                self.patterns = [re.compile("|".join(f"(?:{p})" for p in patterns))]
            except re.error:
                pass
        self.active = bool(self.deny or self.allow or self.patterns)
        self._keys: dict[str, bool] = {}

    def _keep(self, key: str) -> bool:
        hit = self._keys.get(key)
        if hit is not None:
            return hit
        k = key.lower()
        keep = not (self.allow and not any(fnmatch.fnmatchcase(k, a) for a in self.allow)) and \
            not any(fnmatch.fnmatchcase(k, d) for d in self.deny)
        if len(self._keys) < _KEY_CACHE_MAX:
            self._keys[key] = keep
        return keep

    def mask(self, value: Any) -> Any:
        """``value`` with every pattern match in its strings replaced by ``[REDACTED]`` (lists and
        maps recursively; other types unchanged). Pure."""
        if isinstance(value, str):
            for p in self.patterns:
                value = p.sub(MASK, value)
            return value
        if isinstance(value, list):
            return [self.mask(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.mask(v) for v in value)
        if isinstance(value, dict):
            return {k: self.mask(v) for k, v in value.items()}
        return value

    def _attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        if self.deny or self.allow:
            items = [(k, v) for k, v in attrs.items() if self._keep(k)]
        else:
            items = list(attrs.items())
        if self.patterns:
            return {k: self.mask(v) for k, v in items}
        return dict(items)

    def apply(self, span: CanonicalSpan) -> CanonicalSpan:
        """The span with the policy applied (module docstring); flagged ``redacted`` when anything
        changed. An inactive redactor returns ``span`` itself."""
        if not self.active:
            return span
        m = self.mask if self.patterns else (lambda v: v)
        attrs = self._attrs(span.attributes)
        events = tuple(dataclasses.replace(e, name=m(e.name), attributes=self._attrs(e.attributes))
                       for e in span.events)
        resource = self._attrs(span.resource)
        name, status, scope, scope_v = m(span.name), m(span.status_message), m(span.scope_name), m(span.scope_version)
        if (attrs == dict(span.attributes) and events == span.events and resource == dict(span.resource)
                and (name, status, scope, scope_v) == (span.name, span.status_message, span.scope_name,
                                                      span.scope_version)):
            return span
        return dataclasses.replace(span, name=name, status_message=status, scope_name=scope, scope_version=scope_v,
                                   attributes=attrs, events=events, resource=resource,
                                   flags=span.flags | {"redacted"})
