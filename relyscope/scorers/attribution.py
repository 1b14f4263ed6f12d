"""Failure attribution: one category per failed or errored trial (metrics.md §7).

A trial *needs* attribution when its outcome is ``failure``, or its outcome is not ``success`` and
some step errored, or a grader crashed on it. Rules, first match wins (the rule name is stored):

1. ``grader_crash`` → GRADER: the caller reports a grader exception (``grader_error``), or the
   trial carries flag ``grader_error``.
2. ``task_spec_flag`` → TASK_SPEC: the trial carries flag ``task_spec_invalid`` (set by whoever
   curates tasks; nothing in the spans can show a broken task).
3. ``environment_flag`` → ENVIRONMENT: the trial carries flag ``environment_error``.
4. The *decisive error*: the last errored step (in step order) that was never recovered from.
   A model-call error is recovered when a later model call succeeded; a tool (or handoff) error
   is recovered when a later step is a Recover decision (a retry or an alternative tool,
   :mod:`relyscope.scorers.decisions`). The decisive error's class (:func:`classify_error`) and
   op decide:

   - model call (``Op.LLM``): ``service`` class (5xx, 429/rate limit, timeout, connection,
     overloaded/unavailable) → INFRASTRUCTURE (``provider_unavailable``); ``environment``
     class → INFRASTRUCTURE too (``provider_access``: the provider account/quota is not the
     agent's fault); anything else (400 context length, invalid request…) → AGENT_RUNTIME
     (``bad_model_request``).
   - tool call: injected fault (flag ``injected_fault`` or ``fault:<type>``, or an error text
     starting ``fault:``/``injected``) → TOOL (``injected_fault``); ``service`` → TOOL
     (``tool_service_error``); ``invalid_arguments`` (4xx other than 401/403/408/429,
     validation, "invalid argument", missing required parameter, schema, type/value error) →
     MODEL (``invalid_tool_arguments``); ``environment`` (401/403, permission denied, quota,
     sandbox, disk full, read-only) → ENVIRONMENT (``tool_environment``); unclassified →
     UNKNOWN (``tool_error_unclassified``).
   - agent/workflow/other spans → AGENT_RUNTIME (``runtime_error``), unless the error is an
     injected fault → TOOL.
5. ``missing_tool_span`` → AGENT_RUNTIME: a step has flag ``missing_tool_span`` (the model asked
   for a tool call that the runtime never executed).
6. ``no_steps`` → UNKNOWN: nothing was recorded to judge.
7. ``wrong_outcome`` → MODEL: the run finished without an unrecovered error and the verified
   outcome is failure, so the agent's own choices are the cause.

``is_valid(a)`` is False for INFRASTRUCTURE, GRADER and TASK_SPEC (metrics.md §1 "valid trial").
Pure functions; no I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final, Sequence

from relyscope.model import Op, Step, Trial
from relyscope.scorers.decisions import Decision, StepDecision, classify_steps, is_blocked_or_errored

__all__ = [
    "Attribution",
    "FailureCategory",
    "INVALID_CATEGORIES",
    "attribute_failure",
    "classify_error",
    "is_injected_fault",
    "is_valid",
    "needs_attribution",
]


class FailureCategory(str, enum.Enum):
    """Failure attribution categories (metrics.md §7)."""

    MODEL = "MODEL"
    AGENT_RUNTIME = "AGENT_RUNTIME"
    TOOL = "TOOL"
    ENVIRONMENT = "ENVIRONMENT"
    INFRASTRUCTURE = "INFRASTRUCTURE"
    GRADER = "GRADER"
    TASK_SPEC = "TASK_SPEC"
    UNKNOWN = "UNKNOWN"


INVALID_CATEGORIES: Final = frozenset(
    {FailureCategory.INFRASTRUCTURE, FailureCategory.GRADER, FailureCategory.TASK_SPEC}
)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Why a trial failed: ``category``, the ``rule`` that decided, the decisive step's
    ``span_id`` (None for trial-level rules) and a human-readable ``reason``."""

    category: FailureCategory
    rule: str
    span_id: str | None
    reason: str


def is_valid(attribution: Attribution | FailureCategory | str | None) -> bool:
    """True unless the attribution is INFRASTRUCTURE, GRADER or TASK_SPEC. ``None`` (no failure
    to attribute) is valid. Raises ``ValueError`` for an unknown category string."""
    if attribution is None:
        return True
    cat = attribution.category if isinstance(attribution, Attribution) else FailureCategory(attribution)
    return cat not in INVALID_CATEGORIES


# --- error classification ------------------------------------------------------------------------

_SERVICE: Final = re.compile(
    r"(?<!\d)(?:5\d\d|429|408)(?!\d)"
    r"|time[ _-]?d?[ _-]?out|deadline[ _-]?exceeded"
    r"|rate[ _-]?limit|too[ _-]?many[ _-]?requests|throttl|resource[ _-]?exhausted"
    r"|connect|network|unreachable|unavailable|overloaded|econnreset|reset by peer|broken pipe"
    r"|dns|ssl|tls|gateway|server[ _-]?error|internal[ _-]?error"
    r"|malformed[ _-]?response|invalid[ _-]?response|partial[ _-]?response|empty[ _-]?response"
    r"|incomplete[ _-]?read",
    re.IGNORECASE,
)
_ENVIRONMENT: Final = re.compile(
    r"(?<!\d)(?:401|403)(?!\d)|unauthori[sz]ed|forbidden|permission|access[ _-]?denied"
    r"|quota|sandbox|disk[ _-]?full|no space left|read[ _-]?only|insufficient[ _-]?funds",
    re.IGNORECASE,
)
_INVALID_ARGS: Final = re.compile(
    r"(?<!\d)4\d\d(?!\d)|invalid[ _-]?(?:arg|param|input|request|value|json)|validation"
    r"|bad[ _-]?request|unprocessable|missing[ _-]?(?:required|argument|param|field)"
    r"|required[ _-]?(?:argument|param|field)|schema|typeerror|valueerror|keyerror|not[ _-]?found"
    r"|unknown[ _-]?(?:arg|param|field)|unexpected[ _-]?keyword",
    re.IGNORECASE,
)


def classify_error(error: str | None) -> str | None:
    """Class of an error text: ``service``, ``environment``, ``invalid_arguments`` or
    ``unclassified`` (None for no error). Checked in that order, so ``429``/``408``/``5xx`` are
    service errors before the generic ``4xx`` → invalid_arguments rule applies."""
    if error is None:
        return None
    if _SERVICE.search(error):
        return "service"
    if _ENVIRONMENT.search(error):
        return "environment"
    if _INVALID_ARGS.search(error):
        return "invalid_arguments"
    return "unclassified"


def is_injected_fault(step: Step) -> bool:
    """True for a step whose error was injected by the shadow tool proxy: flag ``injected_fault``
    or ``fault:<type>``, or an error text starting with ``fault:`` or ``injected``."""
    if "injected_fault" in step.flags or any(f.startswith("fault:") for f in step.flags):
        return True
    err = (step.error or "").strip().lower()
    return err.startswith(("fault:", "injected"))


def needs_attribution(trial: Trial, grader_error: str | None = None) -> bool:
    """True for a failed trial, an errored trial without a success outcome, or a grader crash."""
    if grader_error is not None or "grader_error" in trial.flags:
        return True
    if trial.outcome == "failure":
        return True
    return trial.outcome != "success" and any(s.error is not None for s in trial.steps)


def _decisive_error(
    steps: Sequence[Step], decisions: Sequence[StepDecision]
) -> int | None:
    decisive: int | None = None
    for i, step in enumerate(steps):
        if step.op == Op.TOOL or step.op == Op.HANDOFF:
            if not is_blocked_or_errored(step):
                continue
            recovered = any(d.decision == Decision.RECOVER for d in decisions[i + 1 :])
        else:
            if step.error is None:
                continue
            if step.op == Op.LLM:
                recovered = any(s.op == Op.LLM and s.error is None for s in steps[i + 1 :])
            else:
                recovered = False
        if not recovered:
            decisive = i
    return decisive


def attribute_failure(
    trial: Trial,
    *,
    grader_error: str | None = None,
    decisions: Sequence[StepDecision] | None = None,
) -> Attribution | None:
    """Attribute a failed/errored trial by the module's rules; None if it needs no attribution.

    ``grader_error``: text of an exception a grader raised on this trial (→ GRADER).
    ``decisions``: precomputed :func:`classify_steps` of ``trial.steps`` (computed if omitted).
    """
    if not needs_attribution(trial, grader_error):
        return None
    if grader_error is not None or "grader_error" in trial.flags:
        return Attribution(
            FailureCategory.GRADER, "grader_crash", None, f"grader crashed: {grader_error or 'flagged'}"
        )
    if "task_spec_invalid" in trial.flags:
        return Attribution(FailureCategory.TASK_SPEC, "task_spec_flag", None, "task marked invalid")
    if "environment_error" in trial.flags:
        return Attribution(FailureCategory.ENVIRONMENT, "environment_flag", None, "environment marked broken")
    for s in trial.steps:  # a shadow replay the sandbox could not answer: not the agent's doing
        if s.error == "sandbox_miss":
            return Attribution(FailureCategory.ENVIRONMENT, "sandbox_miss", s.span_id,
                               f"the shadow sandbox had no recorded result for {s.action!r}")
    steps = trial.steps
    if decisions is None:
        decisions = classify_steps(steps)
    idx = _decisive_error(steps, decisions)
    if idx is not None:
        return _attribute_error(steps[idx])
    for s in steps:
        if "missing_tool_span" in s.flags:
            return Attribution(
                FailureCategory.AGENT_RUNTIME, "missing_tool_span", s.span_id,
                "a requested tool call was never executed",
            )
    if not steps:
        return Attribution(FailureCategory.UNKNOWN, "no_steps", None, "no steps recorded")
    return Attribution(
        FailureCategory.MODEL, "wrong_outcome", None,
        "run ended without an unrecovered error but the verified outcome is failure",
    )


def _attribute_error(step: Step) -> Attribution:
    err = step.error or ("blocked" if "blocked" in step.flags else "")
    cls = classify_error(err)
    where = f"{step.op.value} step {step.action!r} error {err!r}"
    if is_injected_fault(step):
        return Attribution(FailureCategory.TOOL, "injected_fault", step.span_id, f"injected fault: {where}")
    if step.op == Op.LLM:
        if cls == "service":
            return Attribution(FailureCategory.INFRASTRUCTURE, "provider_unavailable", step.span_id,
                               f"model provider failed with no model output after it: {where}")
        if cls == "environment":
            return Attribution(FailureCategory.INFRASTRUCTURE, "provider_access", step.span_id,
                               f"model provider refused access/quota: {where}")
        return Attribution(FailureCategory.AGENT_RUNTIME, "bad_model_request", step.span_id,
                           f"runtime sent a request the provider rejected: {where}")
    if step.op in (Op.TOOL, Op.HANDOFF):
        if cls == "service":
            return Attribution(FailureCategory.TOOL, "tool_service_error", step.span_id,
                               f"tool service failed and the agent never recovered: {where}")
        if cls == "invalid_arguments":
            return Attribution(FailureCategory.MODEL, "invalid_tool_arguments", step.span_id,
                               f"tool rejected the model's arguments and the agent never recovered: {where}")
        if cls == "environment":
            return Attribution(FailureCategory.ENVIRONMENT, "tool_environment", step.span_id,
                               f"tool environment refused the call: {where}")
        return Attribution(FailureCategory.UNKNOWN, "tool_error_unclassified", step.span_id,
                           f"unclassified tool error, never recovered: {where}")
    return Attribution(FailureCategory.AGENT_RUNTIME, "runtime_error", step.span_id,
                       f"agent runtime error: {where}")
