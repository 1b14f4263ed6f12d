"""Safety policy files: one YAML document per agent, validated by pydantic v2 (metrics.md §8).

A policy lists rules; every rule has a unique ``id``, a ``type`` and a ``severity``:

========== ====== =========================================
severity   weight effect
========== ====== =========================================
low        0.25
medium     0.5
high       1.0
critical   1.0    and a hard gate (release is blocked)
========== ====== =========================================

Rule types (the ``type`` key selects the model):

- ``forbidden_tool`` — ``tools``: names or ``fnmatch`` globs (``admin_*``) that must never be called.
- ``argument_constraint`` — ``tools``: the tools it applies to; ``path``: a JSON path into the tool
  call's arguments; ``op``: one of ``== != < <= > >= in not_in matches``; and exactly one of
  ``value`` (a constant) or ``other_path`` (another JSON path into the same arguments), e.g.
  ``$.amount <= $.order.total``. ``on_missing``: ``ignore`` (default) or ``violate`` when a path
  does not resolve. A comparison that cannot be made (``"abc" <= 3``) is a violation (fail closed).
- ``require_confirmation`` — ``tools``: irreversible tools that need a prior ``confirm`` control
  decision in the same trial; ``include_marked_irreversible`` (default true) adds every tool
  whose side effect is ``irreversible`` (span attribute ``relyscope.tool.side_effect`` or the
  policy's ``side_effects`` table).
- ``pii`` — ``builtin``: any of ``email``, ``phone``, ``credit_card`` (Luhn-checked), ``us_ssn``;
  ``patterns``: extra named regexes; ``scope``: any of ``tool_arguments``, ``tool_results``,
  ``model_outputs`` (default all three).
- ``budget`` — any of ``max_tokens``, ``max_cost_usd`` (USD), ``max_tool_calls``,
  ``max_wall_time_s`` (seconds); at least one.

JSON paths are a deliberately small subset: ``$`` followed by ``.name``, ``[index]`` (negative
counts from the end) or ``['key']`` / ``["key"]`` segments, e.g. ``$.order.items[0].price``.

Top level: ``agent`` (the agent the policy is for), ``version`` (free text, stored with grades),
``side_effects`` (tool name → ``none | read | write | irreversible``), ``rules``.
Unknown keys anywhere are errors (``extra="forbid"``).

Errors: :func:`load_policy` raises :class:`PolicyError` (a ``ValueError``) whose message names
the file and every bad field as a dotted path (``rules[1].severity: Input should be …``).
``Policy.model_validate(d)`` raises pydantic's ``ValidationError`` as usual;
:func:`parse_policy` wraps it into a :class:`PolicyError` with the same field naming.
"""

from __future__ import annotations

import enum
import fnmatch
import json
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "ArgumentConstraintRule",
    "BUILTIN_PII",
    "BudgetRule",
    "ForbiddenToolRule",
    "MISSING",
    "PiiRule",
    "Policy",
    "PolicyError",
    "RequireConfirmationRule",
    "Rule",
    "Severity",
    "format_validation_error",
    "load_policy",
    "luhn_valid",
    "parse_json_path",
    "parse_policy",
    "resolve_json_path",
]


class PolicyError(ValueError):
    """A policy file or mapping is invalid; the message names each bad field."""


class Severity(str, enum.Enum):
    """Rule severity (metrics.md §8). ``weight`` in [0, 1]; ``critical`` is also a hard gate."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def weight(self) -> float:
        """Severity weight: low 0.25, medium 0.5, high 1.0, critical 1.0."""
        return _WEIGHTS[self]

    @property
    def hard_gate(self) -> bool:
        """True for ``critical`` only."""
        return self is Severity.CRITICAL


_WEIGHTS: Final = {
    Severity.LOW: 0.25,
    Severity.MEDIUM: 0.5,
    Severity.HIGH: 1.0,
    Severity.CRITICAL: 1.0,
}

# --- JSON path subset ----------------------------------------------------------------------------


class _Missing:
    """Sentinel: a JSON path did not resolve."""

    _instance: "_Missing | None" = None

    def __new__(cls) -> "_Missing":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()

_SEGMENT = re.compile(
    r"""\.(?P<name>[A-Za-z_][A-Za-z0-9_\-]*)"""
    r"""|\[(?P<index>-?\d+)\]"""
    r"""|\[\s*'(?P<sq>(?:[^'\\]|\\.)*)'\s*\]"""
    r"""|\[\s*"(?P<dq>(?:[^"\\]|\\.)*)"\s*\]"""
)


def parse_json_path(path: str) -> tuple[str | int, ...]:
    """Parse a JSON path of the supported subset into keys (``str``) and list indexes (``int``).

    ``"$.a.b[0]"`` → ``("a", "b", 0)``; ``"$"`` → ``()``. Raises ``ValueError`` naming the
    offending position for anything outside the subset (wildcards, filters, slices, ``..``).
    """
    if not isinstance(path, str) or not path.startswith("$"):
        raise ValueError(f"JSON path must start with '$': {path!r}")
    out: list[str | int] = []
    pos = 1
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if m is None:
            raise ValueError(
                f"unsupported JSON path syntax at position {pos} in {path!r} "
                "(supported: $.name, [index], ['key'])"
            )
        if m.group("name") is not None:
            out.append(m.group("name"))
        elif m.group("index") is not None:
            out.append(int(m.group("index")))
        else:
            raw = m.group("sq") if m.group("sq") is not None else m.group("dq")
            out.append(re.sub(r"\\(.)", r"\1", raw))
        pos = m.end()
    return tuple(out)


def resolve_json_path(document: Any, path: str | tuple[str | int, ...]) -> Any:
    """Value at ``path`` in ``document`` (dicts and lists), or :data:`MISSING` if absent.

    ``path`` is a path string or the output of :func:`parse_json_path`. A ``str`` document is
    decoded as JSON first (tool arguments sometimes arrive undecoded); undecodable → MISSING.
    Raises ``ValueError`` only for a malformed path string.
    """
    keys = parse_json_path(path) if isinstance(path, str) else path
    cur = _maybe_json(document)
    for key in keys:
        if isinstance(key, int):
            if isinstance(cur, list) and -len(cur) <= key < len(cur):
                cur = cur[key]
            else:
                return MISSING
        elif isinstance(cur, dict) and key in cur:
            cur = cur[key]
        else:
            return MISSING
    return cur


def _maybe_json(value: Any) -> Any:
    """Decode a JSON string/bytes document; a non-JSON string stays a string."""
    if isinstance(value, (str, bytes, bytearray)):
        try:
            return json.loads(value)
        except (ValueError, TypeError):
            return value
    return value


# --- built-in PII --------------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """Luhn (mod 10) check of a digit string (ISO/IEC 7812-1 Annex B). Non-digits → False."""
    if not digits or not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


BUILTIN_PII: Final[dict[str, re.Pattern[str]]] = {
    # RFC 5322 "dot-atom" in practice; no quoted local parts.
    "email": re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    # NANP with separators ((555) 123-4567, 555-123-4567, +1 555.123.4567) or E.164 (+4915123456789).
    # A bare 10-digit run without '+' is NOT matched: too many order/booking ids look like that.
    "phone": re.compile(
        r"(?<![\w+])(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}(?!\d)"
        r"|(?<![\w+])\+[1-9]\d{7,14}(?!\d)"
    ),
    # 13–19 digits, optionally grouped by single spaces/dashes; kept only if Luhn-valid.
    "credit_card": re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"),
    # Dashed/spaced SSN; area 000/666/9xx, group 00 and serial 0000 are never issued (SSA).
    "us_ssn": re.compile(r"(?<!\d)(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?!\d)"),
}

PiiName = Literal["email", "phone", "credit_card", "us_ssn"]
PiiScope = Literal["tool_arguments", "tool_results", "model_outputs"]
SideEffect = Literal["none", "read", "write", "irreversible"]

# --- rule models ---------------------------------------------------------------------------------


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _RuleBase(_Base):
    id: str = Field(min_length=1, description="unique rule id, stored with every violation")
    severity: Severity
    description: str = ""


class ForbiddenToolRule(_RuleBase):
    """Tools that must never be called (names or fnmatch globs)."""

    type: Literal["forbidden_tool"]
    tools: tuple[str, ...] = Field(min_length=1)

    def matches(self, tool_name: str | None) -> bool:
        """True when ``tool_name`` equals or glob-matches one of ``tools``."""
        return tool_name is not None and any(fnmatch.fnmatchcase(tool_name, t) for t in self.tools)


_OPS: Final = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", "matches")


class ArgumentConstraintRule(_RuleBase):
    """``resolve(args, path) <op> (value | resolve(args, other_path))`` must hold for each call."""

    type: Literal["argument_constraint"]
    tools: tuple[str, ...] = Field(min_length=1)
    path: str
    op: Literal["==", "!=", "<", "<=", ">", ">=", "in", "not_in", "matches"]
    value: Any = None
    other_path: str | None = None
    on_missing: Literal["ignore", "violate"] = "ignore"

    @field_validator("path", "other_path")
    @classmethod
    def _check_path(cls, v: str | None) -> str | None:
        if v is not None:
            parse_json_path(v)  # raises ValueError → reported on this field
        return v

    @model_validator(mode="after")
    def _one_rhs(self) -> "ArgumentConstraintRule":
        has_value = "value" in self.model_fields_set
        if has_value == (self.other_path is not None):
            raise ValueError("give exactly one of 'value' or 'other_path'")
        if self.op in ("in", "not_in") and has_value and not isinstance(self.value, (list, tuple)):
            raise ValueError(f"op {self.op!r} needs 'value' to be a list")
        if self.op == "matches":
            if not has_value or not isinstance(self.value, str):
                raise ValueError("op 'matches' needs 'value' to be a regex string")
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(f"invalid regex in 'value': {exc}") from exc
        return self

    def matches(self, tool_name: str | None) -> bool:
        """True when the rule applies to ``tool_name`` (exact name or fnmatch glob)."""
        return tool_name is not None and any(fnmatch.fnmatchcase(tool_name, t) for t in self.tools)


class RequireConfirmationRule(_RuleBase):
    """Irreversible tools need a prior ``confirm`` decision step in the same trial."""

    type: Literal["require_confirmation"]
    tools: tuple[str, ...] = ()
    include_marked_irreversible: bool = True

    @model_validator(mode="after")
    def _something(self) -> "RequireConfirmationRule":
        if not self.tools and not self.include_marked_irreversible:
            raise ValueError("rule covers no tool: give 'tools' or include_marked_irreversible: true")
        return self


class PiiRule(_RuleBase):
    """PII that must not appear in tool arguments, tool results or model outputs."""

    type: Literal["pii"]
    builtin: tuple[PiiName, ...] = ()
    patterns: dict[str, str] = Field(default_factory=dict)
    scope: tuple[PiiScope, ...] = ("tool_arguments", "tool_results", "model_outputs")

    @field_validator("patterns")
    @classmethod
    def _compile(cls, v: dict[str, str]) -> dict[str, str]:
        for name, rx in v.items():
            try:
                re.compile(rx)
            except re.error as exc:
                raise ValueError(f"pattern {name!r} is not a valid regex: {exc}") from exc
        return v

    @model_validator(mode="after")
    def _nonempty(self) -> "PiiRule":
        if not self.builtin and not self.patterns:
            raise ValueError("give at least one of 'builtin' or 'patterns'")
        if not self.scope:
            raise ValueError("'scope' must not be empty")
        return self

    def compiled(self) -> dict[str, re.Pattern[str]]:
        """Name → compiled regex, built-ins first."""
        out = {n: BUILTIN_PII[n] for n in self.builtin}
        out.update({n: re.compile(rx) for n, rx in self.patterns.items()})
        return out


class BudgetRule(_RuleBase):
    """Per-trial resource limits: tokens, USD, tool calls, wall-clock seconds."""

    type: Literal["budget"]
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_wall_time_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _any(self) -> "BudgetRule":
        if all(
            v is None
            for v in (self.max_tokens, self.max_cost_usd, self.max_tool_calls, self.max_wall_time_s)
        ):
            raise ValueError(
                "give at least one of max_tokens, max_cost_usd, max_tool_calls, max_wall_time_s"
            )
        return self


Rule = Annotated[
    Union[ForbiddenToolRule, ArgumentConstraintRule, RequireConfirmationRule, PiiRule, BudgetRule],
    Field(discriminator="type"),
]


class Policy(_Base):
    """A per-agent safety policy. Build with :func:`load_policy` or ``Policy.model_validate``."""

    agent: str = "*"
    version: str = "1"
    side_effects: dict[str, SideEffect] = Field(default_factory=dict)
    rules: tuple[Rule, ...] = ()

    @model_validator(mode="after")
    def _unique_ids(self) -> "Policy":
        seen: set[str] = set()
        for r in self.rules:
            if r.id in seen:
                raise ValueError(f"duplicate rule id {r.id!r}")
            seen.add(r.id)
        return self

    @property
    def policy_id(self) -> str:
        """``agent@version``, stored with every grade."""
        return f"{self.agent}@{self.version}"

    def side_effect_of(self, tool_name: str | None, span_value: str | None = None) -> str | None:
        """Side effect of a tool: the span attribute if set, else this policy's table, else None."""
        if span_value:
            return span_value
        if tool_name is None:
            return None
        return self.side_effects.get(tool_name)


def format_validation_error(exc: ValidationError, data: Any = None) -> str:
    """One line per error: ``rules[1] (id 'refund-cap').severity: Input should be … (got 'huge')``.

    The discriminator tag pydantic inserts into locations (``rules.1.budget.max_tokens``) is
    dropped so the path matches the YAML the user wrote; an unknown or missing rule ``type`` is
    reported on ``.type``. With ``data`` (the validated input) a rule's ``id`` is shown too.
    """
    tags = {"forbidden_tool", "argument_constraint", "require_confirmation", "pii", "budget"}
    lines = []
    for err in exc.errors():
        parts: list[str] = []
        loc = list(err["loc"])
        for i, p in enumerate(loc):
            if isinstance(p, int):
                parts.append(f"[{p}]")
                if i == 1 and loc[0] == "rules":
                    rid = _rule_id(data, p)
                    if rid is not None:
                        parts.append(f" (id {rid!r})")
            elif p in tags and i > 0 and isinstance(loc[i - 1], int):
                continue
            else:
                parts.append(("." if parts else "") + str(p))
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            parts.append(".type")
        where = "".join(parts) or "<policy>"
        msg = err["msg"]
        if err["type"] not in ("missing", "value_error") and "input" in err:
            got = err["input"]
            if not isinstance(got, (dict, list)):
                msg = f"{msg} (got {got!r})"
        lines.append(f"{where}: {msg}")
    return "\n".join(lines)


def _rule_id(data: Any, index: int) -> str | None:
    try:
        rid = data["rules"][index]["id"]
    except (TypeError, KeyError, IndexError):
        return None
    return rid if isinstance(rid, str) else None


def parse_policy(data: Any, *, origin: str = "<policy>") -> Policy:
    """Validate a mapping (e.g. parsed YAML) into a :class:`Policy`.

    Raises :class:`PolicyError` naming ``origin`` and each bad field.
    """
    if not isinstance(data, dict):
        raise PolicyError(f"{origin}: policy must be a mapping, got {type(data).__name__}")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"{origin}: invalid policy\n{format_validation_error(exc, data)}") from exc


def load_policy(path: str | Path) -> Policy:
    """Read and validate a YAML policy file.

    Raises :class:`PolicyError` for YAML syntax errors (with line/column) and invalid fields
    (each named as a dotted path); ``OSError`` if the file cannot be read.
    """
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{p}: YAML syntax error: {exc}") from exc
    return parse_policy(data, origin=str(p))
