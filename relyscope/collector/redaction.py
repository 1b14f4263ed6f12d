"""Redaction policy applied to spans before storage (attribute allow/deny lists, regex masks).

Deny and allow entries are attribute keys or shell-style globs (``fnmatch``: ``llm.input_messages.*``),
matched **case-insensitively** (``User.Email`` denies ``user.email`` and ``USER.EMAIL``). They apply
to span attributes, event attributes and resource attributes. An allow list names the attributes
kept *besides* the identity and other exact values scoring reads (below): those are never dropped
for not being listed (an allow list of content keys would otherwise drop every task id and outcome).
A deny entry drops what it names, identity keys included (denying is explicit).

Mask patterns (regular expressions, replaced by ``[REDACTED]``) apply to **every string that is
stored or served**: the span name, the status message, every string attribute value (nested in
lists and maps too) of the span, of its events and of its resource, every attribute key (and the
keys of nested maps), bytes values (matched on their UTF-8 text: a value with a match is stored as
that text, masked, instead of its bytes), event names, the W3C trace state, and the scope name and
version — whatever convention carries the content (GenAI ``gen_ai.*.messages``,
OpenInference ``input.value`` / ``tool_call.function.arguments``, Vercel ``ai.prompt`` /
``ai.toolCall.args``, ADK ``gcp.vertex.agent.*``, Langfuse ``langfuse.observation.*``, Genkit
``genkit:*``, OpenAI Agents ``tool_arguments``, …). Trials are assembled from the redacted spans,
so the steps ``/api/v1/trials`` serves are masked too. Not masked: ids, numbers and booleans.
Two keys that mask to the same text are both kept (the second gets ``#2``, …). Deny entries also
drop the keys of maps nested in a value, matched by the key itself or by its dotted path
(``http.headers.authorization``). Redaction never rejects a span.

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
        self._deny_keys: dict[str, bool] = {}
        self._masked_keys: dict[str, str] = {}

    def _keep(self, key: str) -> bool:
        hit = self._keys.get(key)
        if hit is not None:
            return hit
        k = key.lower()
        keep = not (self.allow and not never_truncate(key) and not any(fnmatch.fnmatchcase(k, a)
                                                                         for a in self.allow)) and \
            not self._denied(key)
        if len(self._keys) < _KEY_CACHE_MAX:
            self._keys[key] = keep
        return keep

    def _denied(self, key: str) -> bool:
        """Whether a deny entry names ``key`` (case-insensitive glob), cached as :meth:`_keep`."""
        hit = self._deny_keys.get(key)
        if hit is None:
            k = key.lower()
            hit = any(fnmatch.fnmatchcase(k, d) for d in self.deny)
            if len(self._deny_keys) < _KEY_CACHE_MAX:
                self._deny_keys[key] = hit
        return hit

    def _drop_nested(self, value: Any, path: str) -> Any:
        """``value`` without the keys of nested maps a deny entry names, by the key itself or by its
        dotted path from the attribute (``path``); lists are walked, other values unchanged."""
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                sub = f"{path}.{k}"
                if not (self._denied(k) or self._denied(sub)):
                    out[k] = self._drop_nested(v, sub)
            return out
        if isinstance(value, (list, tuple)):
            return type(value)(self._drop_nested(v, path) for v in value)
        return value

    def _mask_key(self, key: str) -> str:
        """A map key masked (:meth:`_mask_str`), cached: keys repeat from span to span."""
        hit = self._masked_keys.get(key)
        if hit is None:
            hit = self._mask_str(key)
            if len(self._masked_keys) < _KEY_CACHE_MAX:
                self._masked_keys[key] = hit
        return hit

    def _mask_str(self, value: str) -> str:
        for p in self.patterns:
            value = p.sub(MASK, value)
        return value

    def mask(self, value: Any) -> Any:
        """``value`` with every pattern match in its strings replaced by ``[REDACTED]`` (lists and
        maps recursively, map keys too; bytes matched on their UTF-8 text and, when a pattern
        matches, replaced by that text masked; other types unchanged). Pure."""
        return self._walk(value, self._mask_str)

    def _walk(self, value: Any, on_str: Any) -> Any:
        """``value`` with ``on_str`` applied to each string in it: lists, tuples and maps walked
        (map keys masked), bytes on their UTF-8 text (kept as bytes when nothing changed)."""
        if isinstance(value, str):
            return on_str(value)
        if isinstance(value, list):
            return [self._walk(v, on_str) for v in value]
        if isinstance(value, tuple):
            return tuple(self._walk(v, on_str) for v in value)
        if isinstance(value, dict):
            return _unique_keys((self._mask_key(k) if isinstance(k, str) else k, self._walk(v, on_str))
                                for k, v in value.items())
        if isinstance(value, (bytes, bytearray)):
            text = bytes(value).decode("utf-8", "replace")
            out = on_str(text)
            return value if out == text else out
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
        return self._walk(value, self._tokenize_all)

    def _tokenize_all(self, value: str) -> str:
        for p in self.patterns:
            value = self._tokenize_str(value, p)
        return value

    def _attrs(self, attrs: Mapping[str, Any], ident: list[bool]) -> dict[str, Any]:
        """The kept attributes, masked; ``ident[0]`` set when an identity value was tokenized."""
        if self.deny:
            items = [(k, self._drop_nested(v, k) if type(v) in _NESTED else v)
                     for k, v in attrs.items() if self._keep(k)]
        elif self.allow:
            items = [(k, v) for k, v in attrs.items() if self._keep(k)]
        else:
            items = attrs.items()
        if not self.patterns:
            return dict(items)
        out: dict[str, Any] = {}
        for k, v in items:
            if never_truncate(k):
                t = self.tokenize(v)
                if t != v:
                    ident[0] = True
            else:
                k, t = self._mask_key(k), self.mask(v)
            if k in out:  # two keys masked to the same text: keep both
                k = _free_key(out, k)
            out[k] = t
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
        state = m(span.trace_state)
        if (attrs == dict(span.attributes) and events == span.events and resource == dict(span.resource)
                and (name, status, scope, scope_v, state) == (span.name, span.status_message, span.scope_name,
                                                             span.scope_version, span.trace_state)):
            return span
        flags = span.flags | ({"redacted", "redacted_identity"} if ident[0] else {"redacted"})
        return dataclasses.replace(span, name=name, status_message=status, scope_name=scope, scope_version=scope_v,
                                   trace_state=state, attributes=attrs, events=events, resource=resource,
                                   flags=flags)


_NESTED = (dict, list, tuple)


def _free_key(out: Mapping[Any, Any], k: Any) -> str:
    """``k#2``, ``k#3``, …: the first not in ``out``."""
    n = 2
    while f"{k}#{n}" in out:
        n += 1
    return f"{k}#{n}"


def _unique_keys(items: Iterable[tuple[Any, Any]]) -> dict[Any, Any]:
    """A dict of ``items``; a key seen before (two keys masked to the same text) is kept as
    ``key#2``, ``key#3``, … so neither value is lost."""
    out: dict[Any, Any] = {}
    for k, v in items:
        out[_free_key(out, k) if k in out else k] = v
    return out

