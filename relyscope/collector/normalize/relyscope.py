"""relyscope extension attributes (``relyscope.*``, conventions.md §2), applied on top of any
convention. Enumerations are validated (case-insensitive); values outside them, and
``relyscope.confidence``/``relyscope.outcome.score`` outside [0, 1], become None.
``relyscope.outcome`` also reads a bool and a few verdict words (:func:`._values.as_outcome`)."""

from __future__ import annotations

from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan

from ._values import as_bool, as_enum, as_outcome, as_str, as_unit, first
from .versions import CONVENTIONS

__all__ = ["NAME", "detect", "extract"]

NAME: Final = "relyscope"
_A = CONVENTIONS[NAME].attrs

_TASK_ID = _A["task_id"]
_TRIAL_ID = _A["trial_id"]
_RUN_KIND = _A["run_kind"]
_OUTCOME = _A["outcome"]
_OUTCOME_SCORE = _A["outcome_score"]
_OUTCOME_SOURCE = _A["outcome_source"]
_CLAIMED = _A["claimed_success"]
_CONFIDENCE = _A["confidence"]
_DECISION = _A["decision"]
_SIDE_EFFECT = _A["side_effect"]
_SHADOW_OF = _A["shadow_of"]
_PERT_FAMILY = _A["perturbation_family"]
_PERT_STRENGTH = _A["perturbation_strength"]
_FAULT_TYPE = _A["fault_type"]
_SEPARATE = _A["trial_separate"]
_ALL_KEYS: Final = tuple(k for names in _A.values() for k in names)


def detect(span: CanonicalSpan) -> bool:
    """True when any ``relyscope.*`` extension attribute is present."""
    a = span.attributes
    for k in _ALL_KEYS:
        if k in a:
            return True
    return False


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields from ``relyscope.*`` attributes (invalid values become None)."""
    a = span.attributes
    return {
        "task_id": as_str(first(a, _TASK_ID)),
        "trial_id": as_str(first(a, _TRIAL_ID)),
        "run_kind": as_enum(first(a, _RUN_KIND), sc.RUN_KINDS),
        "outcome": as_outcome(first(a, _OUTCOME)),
        "outcome_score": as_unit(first(a, _OUTCOME_SCORE)),
        "outcome_source": as_str(first(a, _OUTCOME_SOURCE)),
        "claimed_success": as_bool(first(a, _CLAIMED)),
        "confidence": as_unit(first(a, _CONFIDENCE)),
        "decision": as_enum(first(a, _DECISION), sc.DECISIONS),
        "side_effect": as_enum(first(a, _SIDE_EFFECT), sc.SIDE_EFFECTS),
        "shadow_of": as_str(first(a, _SHADOW_OF)),
        "perturbation_family": as_enum(first(a, _PERT_FAMILY), sc.PERTURBATION_FAMILIES),
        "perturbation_strength": as_str(first(a, _PERT_STRENGTH)),
        "fault_type": as_str(first(a, _FAULT_TYPE)),
        "separate_trial": as_bool(first(a, _SEPARATE)),
    }
