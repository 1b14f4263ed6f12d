"""The latest published release-gate verdicts, kept in the store so they survive a restart.

``relyscope_gate_verdict`` (and the ``RelyscopeCandidateBlocked`` alert on it), the report's
gates section and ``GET /api/v1/report`` show the latest verdict of each (agent, baseline,
candidate, mode) reached under the sidecar's configured gate policy. They lived in the sidecar's
memory only: after a restart (a pod rescheduled, an upgrade) a blocked candidate's gauge and alert
went away until someone ran the gate again. :class:`GateVerdicts` writes each published verdict
to ``gate_verdicts`` (one row per publication; ReplacingMergeTree, retention as scores) and, once
the store answers, takes up the latest one of each comparison stored under the same policy
(:func:`relyscope.scorers.gate.policy_digest`). A verdict reached under another policy is not
taken up: the gauge promises the configured policy's verdict.
"""

from __future__ import annotations

import logging
from typing import Any

from relyscope.scorers.gate import GatePolicy, GateResult, policy_digest
from relyscope.store import StoreError

log = logging.getLogger(__name__)

__all__ = ["GateVerdicts"]

Key = tuple[str, str, str, str]  # (agent, baseline, candidate, mode)


class GateVerdicts(dict):
    """``key → GateResult`` of the latest published verdicts (a dict: what readers iterate),
    with :meth:`publish` (memory and store) and :meth:`load` (the store's, once). Thread-safe as
    far as a dict's single item operations are."""

    def __init__(self, store: Any, policy: GatePolicy):
        super().__init__()
        self.store = store
        self.policy = policy_digest(policy)
        self.loaded = False
        self.unsaved = 0  # publications the store refused (kept in memory only)

    def publish(self, key: Key, result: GateResult) -> bool:
        """Make ``result`` the latest verdict of ``key`` and keep it in the store. Returns False
        (logged, counted in ``unsaved``) when the store refused it: the verdict is still shown,
        but a restart before the next publication loses it."""
        self[key] = result
        try:
            self.store.insert_gate_verdict(key, self.policy, result.to_json())
            return True
        except StoreError as e:
            self.unsaved += 1
            log.warning("gate verdict %s not stored (shown until a restart): %s", key, e)
            return False

    def load(self) -> bool:
        """Take up the stored verdicts (once; a verdict published since wins over the stored one).
        Returns whether they are loaded; False while the store does not answer (tried again at the
        next call)."""
        if self.loaded:
            return True
        try:
            stored = self.store.latest_gate_verdicts(self.policy)
        except StoreError as e:
            log.warning("stored gate verdicts not loaded yet: %s", e)
            return False
        for key, d in stored.items():
            try:
                self.setdefault(key, GateResult.from_json(d))
            except (KeyError, TypeError, ValueError) as e:
                log.warning("stored gate verdict %s unreadable, skipped: %s", key, e)
        self.loaded = True
        return True
