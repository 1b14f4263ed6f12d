"""Redaction policy applied to spans before storage (attribute allow/deny lists, regex masks).

Deny and allow entries are attribute keys or shell-style globs (``fnmatch``: ``llm.input_messages.*``),
matched **case-insensitively** (``User.Email`` denies ``user.email`` and ``USER.EMAIL``). They apply
to span attributes, event attributes and resource attributes. An allow list names the attributes
kept *besides* the identity and other exact values scoring reads (below): those are never dropped
for not being listed (an allow list of content keys would otherwise drop every task id and outcome).
A deny entry drops what it names, identity keys included (denying is explicit).

Mask patterns (regular expressions, replaced by ``[REDACTED]``) apply to **every string that is
stored or served**: the span name, the status message, every string attribute value (nested in
lists and maps too) of the span, of its events and of its resource, event names, and the scope
name and version — whatever convention carries the content (GenAI ``gen_ai.*.messages``,
OpenInference ``input.value`` / ``tool_call.function.arguments``, Vercel ``ai.prompt`` /
``ai.toolCall.args``, ADK ``gcp.vertex.agent.*``, Langfuse ``langfuse.observation.*``, Genkit
``genkit:*``, OpenAI Agents ``tool_arguments``, …). Trials are assembled from the redacted spans,
so the steps ``/api/v1/trials`` serves are masked too. Not masked: ids, attribute keys, numbers
and booleans, and W3C trace state. Redaction never rejects a span.

**Identity values** — the attributes an attribute-length limit never cuts
(:func:`~relyscope.collector.normalize.versions.never_truncate`: ``relyscope.*`` such as
``relyscope.task.id`` / ``trial.id`` / ``run.kind``, agent name / id / version, ``service.name`` /
``service.version``, session and conversation ids, tool and model names, …) and the span name (the
agent's or tool's name where no attribute carries it) — get a *token* instead of ``[REDACTED]``:
each match becomes ``[REDACTED:<16 hex>]``, the first 16 hex digits of HMAC-SHA256(key, matched
text) (RFC 2104). Equal secrets give equal tokens and different ones different tokens (up to a
2^-64 collision), so two tasks whose ids both match a pattern stay two tasks and a trial id and the
``relyscope.shadow.of`` that names it still agree — while the secret itself is stored nowhere. The
key is secret (``RELYSCOPE_REDACT_KEY``, else a random key kept beside the spool:
:func:`load_or_create_key`), so a low-entropy secret cannot be found by hashing guesses. Spans with
a tokenized value are flagged ``redacted_identity`` as well as ``redacted``.

Cost: each pattern is one ``re.sub`` per string (an identity value's matches one HMAC each);
figures in ``bench/README.md`` (``bench/bench_redaction.py``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import hmac
import os
import re
import secrets
from typing import Any, Iterable, Mapping

from relyscope import semconv as sc
from relyscope.collector.normalize.versions import never_truncate
from relyscope.model import CanonicalSpan

__all__ = ["Redactor", "CONTENT_KEYS", "MASK", "TOKEN_HEX", "identity_token", "load_or_create_key"]

MASK = "[REDACTED]"
#: hex digits of HMAC-SHA256 kept in an identity value's token ``[REDACTED:<hex>]`` (64 bits)
TOKEN_HEX = 16
_KEY_BYTES = 32  # a generated key: 256 bits (the HMAC-SHA256 block is 512, so it is used as is)
_TOKEN_RE = re.compile(r"\[REDACTED:[0-9a-f]{%d}\]" % TOKEN_HEX)
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


def identity_token(key: bytes, text: str) -> str:
    """``[REDACTED:<hex>]``: the first :data:`TOKEN_HEX` hex digits of HMAC-SHA256(``key``, UTF-8
    of ``text``) (RFC 2104) — what a secret inside an identity value is replaced by. Pure."""
    mac = hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return f"[REDACTED:{mac[:TOKEN_HEX]}]"


def load_or_create_key(path: str) -> bytes:
    """The redaction key kept in the file ``path`` (hex text), created once with 32 random bytes
    (mode 0600; written to a temporary file and linked into place, so concurrent starts agree on
    one key). Raises OSError when the file cannot be read or created, ValueError when it holds no
    hex key."""
    try:
        with open(path, encoding="ascii") as f:
            return bytes.fromhex(f.read().strip())
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(_KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process created it first: theirs wins
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    with open(path, encoding="ascii") as f:
        return bytes.fromhex(f.read().strip())


class Redactor:
    """``apply(span) -> span`` with denied keys dropped, only allowed keys kept (if an allow list is
    given; identity keys always) and mask patterns replaced in every string — by ``[REDACTED]``,
    or in identity values by their keyed token (module docstring). Safe from any thread (the key
    cache is a dict only ever filled; a race costs one recomputation); picklable (decode processes).

    ``key``: the HMAC key of identity tokens (bytes); None draws a random one, so tokens agree
    only within this redactor — pass a kept key (:func:`load_or_create_key`) where they must agree
    across restarts. Raises ``re.error`` at construction for an invalid pattern (fail fast at
    start-up)."""

    def __init__(self, deny: Iterable[str] = (), patterns: Iterable[str] = (), allow: Iterable[str] = (),
                 key: bytes | None = None):
        self.deny = tuple(d.lower() for d in deny)
        self.allow = tuple(a.lower() for a in allow)
        self.key = key if key is not None else secrets.token_bytes(_KEY_BYTES)
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
        keep = not (self.allow and not never_truncate(key) and not any(fnmatch.fnmatchcase(k, a)
                                                                         for a in self.allow)) and \
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

    def _token(self, m: re.Match) -> str:
        return identity_token(self.key, m.group(0))

    def _tokenize_str(self, value: str, p: re.Pattern) -> str:
        """One pattern's tokens in ``value``, leaving tokens already there as they are (so a
        value read back from the store and sent again — a replay's ``relyscope.shadow.of`` —
        keeps its token even when a pattern matches hex digits)."""
        if "[REDACTED:" not in value:
            return p.sub(self._token, value)
        out, pos = [], 0
        for t in _TOKEN_RE.finditer(value):
            out += [p.sub(self._token, value[pos:t.start()]), t.group(0)]
            pos = t.end()
        out.append(p.sub(self._token, value[pos:]))
        return "".join(out)

    def tokenize(self, value: Any) -> Any:
        """``value`` with every pattern match in its strings replaced by its keyed token
        (:func:`identity_token`; lists and maps recursively, other types unchanged): what identity
        values get instead of ``[REDACTED]``. Pure for a given key, and idempotent: a token already
        in the value is left whole."""
        if isinstance(value, str):
            for p in self.patterns:
                value = self._tokenize_str(value, p)
            return value
        if isinstance(value, list):
            return [self.tokenize(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.tokenize(v) for v in value)
        if isinstance(value, dict):
            return {k: self.tokenize(v) for k, v in value.items()}
        return value

    def _attrs(self, attrs: Mapping[str, Any], ident: list[bool]) -> dict[str, Any]:
        """The kept attributes, masked; ``ident[0]`` set when an identity value was tokenized."""
        if self.deny or self.allow:
            items = [(k, v) for k, v in attrs.items() if self._keep(k)]
        else:
            items = list(attrs.items())
        if not self.patterns:
            return dict(items)
        out = {}
        for k, v in items:
            if never_truncate(k):
                t = self.tokenize(v)
                if t != v:
                    ident[0] = True
                out[k] = t
            else:
                out[k] = self.mask(v)
        return out

    def apply(self, span: CanonicalSpan) -> CanonicalSpan:
        """The span with the policy applied (module docstring); flagged ``redacted`` when anything
        changed, and ``redacted_identity`` too when an identity value (or the span name) got a
        token. An inactive redactor returns ``span`` itself."""
        if not self.active:
            return span
        m = self.mask if self.patterns else (lambda v: v)
        ident = [False]
        attrs = self._attrs(span.attributes, ident)
        events = tuple(dataclasses.replace(e, name=m(e.name), attributes=self._attrs(e.attributes, ident))
                       for e in span.events)
        resource = self._attrs(span.resource, ident)
        name = self.tokenize(span.name) if self.patterns else span.name
        if name != span.name:
            ident[0] = True
        status, scope, scope_v = m(span.status_message), m(span.scope_name), m(span.scope_version)
        if (attrs == dict(span.attributes) and events == span.events and resource == dict(span.resource)
                and (name, status, scope, scope_v) == (span.name, span.status_message, span.scope_name,
                                                      span.scope_version)):
            return span
        flags = span.flags | ({"redacted", "redacted_identity"} if ident[0] else {"redacted"})
        return dataclasses.replace(span, name=name, status_message=status, scope_name=scope, scope_version=scope_v,
                                   attributes=attrs, events=events, resource=resource, flags=flags)
