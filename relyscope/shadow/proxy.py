"""The tool proxy (the sandbox) of one shadow replay: record-replay of the production run's tool
results, injected faults, environment perturbations, side effects recorded and never executed.

A :class:`SandboxSession` answers each tool call of a replay with one :class:`ProxyAnswer`. The
recorded answer is found by a ladder that is always reported in ``match``:

1. ``exact`` — a recorded call of the same tool with the same canonical arguments (the first one
   not used yet; when all were used — the agent retried — the last one again);
2. ``position`` — the n-th distinct call of this tool in the replay (distinct by canonical
   arguments: a retry keeps its position) gets the n-th recorded call of it;
3. no match: a read-only tool the operator allows live (``live_tools``) is answered ``live`` (the
   agent runs the real tool); a call *declared* side-effecting (write / irreversible by the call,
   the policy, or a recorded call of the same tool) is answered ``unrecorded``: result null, like
   a recorded procedure that returned nothing — recorded, never executed, and graded by
   side-effect equivalence (a refund production never made is a differing side effect, so the
   replay of a verified success fails instead of leaving the metrics); anything else (a read with
   no recording, a tool whose side effect nobody states) is a ``sandbox_miss``: the agent gets a
   clear sandbox error and the replay is kept out of agent metrics (ENVIRONMENT). A read is never
   approximated.

Side-effecting calls (``write`` / ``irreversible`` by the call, the recording or the policy;
a call whose side effect nobody states counts as side-effecting unless the operator lists it live)
are recorded with their arguments and answered from the recording only — never ``live``, ever.

Perturbations (metrics.md §4), applied after a match: family ``fault`` draws a fault per call from
:class:`relyscope.shadow.faults.FaultInjector` (the proxy really waits ``delay_s`` for a timeout;
no retry is simulated: the agent must recover by itself); family ``env`` rewrites the recorded
result with :func:`relyscope.shadow.envperturb.perturb_result` (pure, seeded per call). A recorded
*error* (the production call failed) is replayed as that error (``outcome: "error"``), not as an
injected fault.

Pure apart from the call log it keeps; thread-safe (one lock per session).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relyscope.model import Op, Trial
from relyscope.scorers.decisions import canonical_arguments

__all__ = ["RecordedCall", "ProxyAnswer", "SandboxSession", "recorded_calls", "replayable",
           "effective_side_effect", "SIDE_EFFECTING"]

SIDE_EFFECTING = frozenset({"write", "irreversible"})
_RANK = {"none": 0, "read": 1, "write": 2, "irreversible": 3}


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One tool call of the production run, in order: ``result`` (decoded JSON or text) or
    ``error`` (its ``error.type``), ``side_effect`` as the span said (None = not said)."""

    name: str
    arguments: Any
    canonical: str
    result: Any
    error: str | None
    side_effect: str | None


def recorded_calls(trial: Trial) -> list[RecordedCall]:
    """The tool calls of a production trial, in step order."""
    out = []
    for s in trial.steps:
        if s.op is Op.TOOL and s.tool_name:
            out.append(RecordedCall(s.tool_name, s.arguments, canonical_arguments(s.arguments), s.result,
                                    s.error, s.side_effect))
    return out


def replayable(trial: Trial) -> tuple[bool, str | None]:
    """Whether a production trial can be replayed: its task input is recorded (the replay sends it
    again) and every read-only tool call has its result (or its error) recorded — tool content
    capture is opt-in, so without it the sandbox could answer nothing. A side-effecting call
    (write / irreversible) without a result is a procedure that returned nothing: answered with
    null. Returns ``(ok, reason)``; ``reason`` names what is missing."""
    if trial.status != "complete":
        return False, f"trial is {trial.status}"
    if not trial.task_input:
        return False, "no recorded task input (pass input= to agent_run, or record gen_ai.input.messages)"
    tools = [s for s in trial.steps if s.op is Op.TOOL and s.tool_name]
    if tools and all(s.result is None and s.error is None for s in tools):
        return False, "no tool result recorded at all (enable tool content capture)"
    for s in tools:
        if s.result is None and s.error is None and s.side_effect not in SIDE_EFFECTING:
            return False, f"no recorded tool result for {s.tool_name!r} (enable tool content capture)"
    return True, None


def effective_side_effect(name: str, *said: str | None, policy_side_effects: Mapping[str, str] | None = None) -> str | None:
    """The most severe side effect anyone states for tool ``name``: the call, the recording, the
    policy's ``side_effects`` (tool name or fnmatch pattern → none/read/write/irreversible).
    None when nobody says."""
    cands = [s for s in said if s in _RANK]
    for pat, se in (policy_side_effects or {}).items():
        if se in _RANK and fnmatch.fnmatchcase(name, pat):
            cands.append(se)
    return max(cands, key=_RANK.__getitem__) if cands else None


@dataclass(frozen=True, slots=True)
class ProxyAnswer:
    """What the proxy answers one call: the JSON ``envelope`` the agent's wrapper reads
    (``outcome`` result | error | fault | live | sandbox_miss, ``match``, …), the HTTP ``status``
    and ``headers`` that mirror it (500, 429 + Retry-After, 504 …), and ``delay_s`` to wait before
    answering (an injected timeout really waits)."""

    envelope: dict[str, Any]
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def _call_seed(seed: int, index: int) -> int:
    h = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def _recorded_error_status(error: str) -> tuple[int, dict[str, str]]:
    e = error.lower()
    if "429" in e or "rate" in e:
        return 429, {"retry-after": "1"}
    if "timeout" in e or "timed out" in e:
        return 504, {}
    return 500, {}


class SandboxSession:
    """The sandbox of one replay (see the module docstring).

    Args:
        replay_id: the replay this session answers for.
        recorded: the production run's tool calls (:func:`recorded_calls`).
        family: perturbation family of the replay (nominal, fault, env, prompt).
        seed: the replay's perturbation seed (faults and env changes are drawn from it per call).
        strength: env strength (mild | medium | severe) for family ``env``.
        injector: the fault injector for family ``fault`` (None: no faults).
        live_tools: tool names (fnmatch patterns) the operator allows to run live when read-only.
        policy_side_effects: the policy's ``side_effects`` map.
    """

    def __init__(self, replay_id: str, recorded: Sequence[RecordedCall], *, family: str = "nominal",
                 seed: int = 0, strength: str | None = None, injector: Any = None,
                 live_tools: Collection[str] = (), policy_side_effects: Mapping[str, str] | None = None,
                 perturb: Callable[..., Any] | None = None, fault_tools: Collection[str] | None = None):
        self.replay_id = replay_id
        self.recorded = list(recorded)
        self.family = family
        self.seed = seed
        self.strength = strength
        self.injector = injector if family == "fault" else None
        self.fault_tools = tuple(fault_tools) if fault_tools is not None else None
        self.live_tools = tuple(live_tools)
        self.policy_side_effects = dict(policy_side_effects or {})
        self._perturb = perturb
        self._used: set[int] = set()
        self._seen_per_tool: dict[str, int] = {}
        # position of each distinct call (tool, canonical arguments) among its tool's distinct calls:
        # a retry with the same arguments keeps its position (and so its recorded answer)
        self._nth: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []  # the call log: every call, with match and answer kind

    # ---- matching -------------------------------------------------------------------------------
    def _match(self, name: str, canonical: str, nth: int) -> tuple[str, int | None]:
        exact = [i for i, r in enumerate(self.recorded) if r.name == name and r.canonical == canonical]
        fresh = [i for i in exact if i not in self._used]
        if fresh:
            return "exact", fresh[0]
        if exact:
            return "exact", exact[-1]
        same_tool = [i for i, r in enumerate(self.recorded) if r.name == name]
        if nth < len(same_tool):
            return "position", same_tool[nth]
        return "none", None

    def _is_live(self, name: str, side_effect: str | None) -> bool:
        return side_effect in ("none", "read") and any(fnmatch.fnmatchcase(name, p) for p in self.live_tools)

    def answer(self, call: Mapping[str, Any]) -> ProxyAnswer:
        """Answer one tool call ``{"name", "arguments", "call_id", "side_effect", "index"}``.
        Raises ValueError for a call without a tool name."""
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("name: the tool name is required")
        for key in ("side_effect", "call_id"):
            if call.get(key) is not None and not isinstance(call.get(key), str):
                raise ValueError(f"{key}: a string or null, got {type(call.get(key)).__name__}")
        args = call.get("arguments")
        canonical = canonical_arguments(args)
        with self._lock:
            index = len(self.calls)
            nth = self._nth.get((name, canonical))
            if nth is None:
                nth = self._nth[(name, canonical)] = self._seen_per_tool.get(name, 0)
                self._seen_per_tool[name] = nth + 1
            match, ri = self._match(name, canonical, nth)
            rec = self.recorded[ri] if ri is not None else None
            if ri is not None:
                self._used.add(ri)
            # a tool the recording shows side-effecting is so for every call of it, recorded or not
            said = rec.side_effect if rec else max(
                (r.side_effect for r in self.recorded if r.name == name and r.side_effect in _RANK),
                key=_RANK.__getitem__, default=None)
            side_effect = effective_side_effect(name, call.get("side_effect"), said,
                                                policy_side_effects=self.policy_side_effects)
            side_effecting = side_effect in SIDE_EFFECTING or (side_effect is None and not self._is_live(name, "read"))
            entry: dict[str, Any] = {"index": index, "name": name, "arguments": args, "canonical": canonical,
                                     "call_id": call.get("call_id"), "match": match, "side_effect": side_effect,
                                     "side_effecting": side_effecting, "executed": False}
            ans = self._answer(entry, rec, side_effect, side_effecting)
            entry["outcome"] = ans.envelope["outcome"]
            if ans.envelope.get("fault"):
                entry["fault"] = ans.envelope["fault"]["type"]
            self.calls.append(entry)
            return ans

    def _answer(self, entry: dict, rec: RecordedCall | None, side_effect: str | None, side_effecting: bool) -> ProxyAnswer:
        name, match = entry["name"], entry["match"]
        base = {"replay_id": self.replay_id, "match": match, "index": entry["index"],
                "recorded": bool(side_effecting)}
        if rec is None:
            if not side_effecting and self._is_live(name, side_effect or "read"):
                entry["executed"] = True
                return ProxyAnswer({**base, "outcome": "live", "match": "live"})
            if side_effect in SIDE_EFFECTING:  # declared: acknowledged, recorded, never executed
                entry["match"] = "unrecorded"
                return ProxyAnswer({**base, "outcome": "result", "match": "unrecorded", "result": None})
            return ProxyAnswer({**base, "outcome": "sandbox_miss",
                                "message": f"sandbox: no recorded result for {name} with these arguments "
                                           f"(call {entry['index']}); the replay is marked sandbox_miss"},
                               status=404)
        if self.injector is not None and (self.fault_tools is None
                                          or any(fnmatch.fnmatchcase(name, p) for p in self.fault_tools)):
            fault = self.injector.draw(self.seed, entry["index"], name, rec.result)
            if fault is not None:
                env = {"type": fault.type, "status": fault.status, "retry_after_s": fault.retry_after_s,
                       "message": fault.message, "body": fault.body, "injected": True}
                if fault.body is not None:  # partial / malformed / empty: a 200 with a broken body
                    return ProxyAnswer({**base, "outcome": "fault", "fault": env}, status=200)
                # HTTP Retry-After takes whole seconds (RFC 9110 §10.2.3): rounded up
                headers = {"retry-after": fault.retry_after_header} if fault.retry_after_header else {}
                status = fault.status or (504 if fault.type == "timeout" else 502)
                return ProxyAnswer({**base, "outcome": "fault", "fault": env}, status=status,
                                   headers=headers, delay_s=float(fault.delay_s or 0.0))
        if rec.error is not None and rec.result is None:
            status, headers = _recorded_error_status(rec.error)
            return ProxyAnswer({**base, "outcome": "error", "error": {"type": rec.error,
                                "message": f"recorded in production: {rec.error}"}}, status=status, headers=headers)
        result = rec.result
        if self.family == "env" and self._perturb is not None:
            p = self._perturb(result, seed=_call_seed(self.seed, entry["index"]), strength=self.strength or "medium")
            result = p.value
            entry["env_transforms"] = list(p.transforms)
        return ProxyAnswer({**base, "outcome": "result", "result": result})

    def refuse(self, reason: str, name: Any = None) -> dict[str, Any]:
        """Log a call the proxy could not read (oversize or malformed body, invalid fields) as a
        ``sandbox_miss`` (match ``refused``): the agent gets the sandbox's miss for it, so the
        replay is a sandbox miss in the ledger as in its spans. Returns the envelope."""
        with self._lock:
            index = len(self.calls)
            env = {"replay_id": self.replay_id, "outcome": "sandbox_miss", "match": "refused", "index": index,
                   "recorded": False, "message": f"sandbox: tool call refused ({reason}); the replay is marked "
                                                 "sandbox_miss"}
            self.calls.append({"index": index, "name": name if isinstance(name, str) else None, "arguments": None,
                               "canonical": None, "call_id": None, "match": "refused", "side_effect": None,
                               "side_effecting": False, "executed": False, "outcome": "sandbox_miss",
                               "refused": reason[:200]})
            return env

    # ---- summary --------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Counts of the call log: calls, exact, position, live, misses, faults, side-effecting calls
        with no production counterpart (answered null), side effects recorded (never executed),
        and the recorded side-effecting calls themselves."""
        with self._lock:
            calls = list(self.calls)
        return {
            "calls": len(calls),
            "exact": sum(c["match"] == "exact" for c in calls),
            "position": sum(c["match"] == "position" for c in calls),
            "live": sum(c["outcome"] == "live" for c in calls),
            "misses": sum(c["outcome"] == "sandbox_miss" for c in calls),
            "faults": sum(c["outcome"] == "fault" for c in calls),
            "unrecorded_side_effects": sum(c["match"] == "unrecorded" for c in calls),
            "side_effects": sum(bool(c["side_effecting"]) for c in calls),
            "side_effect_calls": [{"name": c["name"], "arguments": c["arguments"], "side_effect": c["side_effect"]}
                                  for c in calls if c["side_effecting"]],
        }

    def log_json(self) -> str:
        """The call log as JSON (stored with the replay)."""
        with self._lock:
            return json.dumps(self.calls, default=str, ensure_ascii=False)
