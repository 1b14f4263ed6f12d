"""Shadow replay, tool proxy and release-gate routes of the management API.

- ``POST /shadow/v1/sessions/{token}/tool-calls`` — the tool proxy a replayed agent calls (no
  bearer token: the random token of a *running* replay attempt, handed to the agent in its
  request, is the capability; any other token gets 404; bodies over 1 MiB get 413, chunked or not;
  a refused call — 413, 400 — is a sandbox miss of that replay, as the agent sees it). Body ``{"name", "arguments", "call_id", "side_effect", "index"}``; the answer is the
  sandbox's JSON envelope with an HTTP status that mirrors it (an injected timeout really waits).
- ``GET /api/v1/shadow`` — state: paused, targets, decisions and replays by kind, proxy counts.
- ``GET /api/v1/shadow/replays`` (filters ``status``, ``shadow_of``, ``target_version``,
  ``limit``), ``GET /api/v1/shadow/replays/{id}`` (with the call log; ``id`` may be a prefix of
  one replay id, 404 when none starts with it, 409 listing up to 10 candidates when several do),
  ``POST /api/v1/shadow/replays`` (``{"trial_ids": [...]}``, ``{"last": N}`` or ``{"tasks": N}``, optional
  ``"again": true``: replay now; the reply counts the replays that already ``existing`` and were
  not planned again, and gives ``scheduled_at``, the ``gate --since`` of this plan),
  ``POST /api/v1/shadow/status`` (``{"replay_ids": [...]}`` → counts by status, for progress).
- ``GET /api/v1/shadow/samples`` — sample decisions with reasons.
- ``POST /api/v1/shadow/pause`` / ``resume`` → ``{"paused", "persisted"}``, with ``"reason"`` when
  the state could not be saved (the change holds in memory only, until a restart).
- ``GET|POST /api/v1/gate`` — the verdict of metrics.md §10 (``baseline``, ``candidate``,
  ``agent``, ``mode``, ``since``). 404 names the versions that exist. POST may carry a ``policy``
  object **relative to the sidecar's configured policy** (``RELYSCOPE_GATE_POLICY_FILE``, else
  the packaged defaults): the keys it gives replace the configured ones, ``metrics`` changes the
  configured table key by key (``{"metrics": {"C_out": null}}`` removes C_out; a metric given
  is set whole), everything it omits stays as configured — the same semantics as ``relyscope gate
  --policy FILE``, which sends the file as written. 422 names a bad field. The answer has
  ``what_if`` / ``published``: a verdict under the configured policy is *published* — it
  replaces the latest verdict of (agent, baseline, candidate, mode) in ``relyscope_gate_verdict``
  and the report's ``gates`` (what ``RelyscopeCandidateBlocked`` sees); one under a policy that
  differs from it is a *what-if*, answered and never published.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from relyscope.store.shadow import TARGET_FAILED

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["shadow_router"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReplayStart(_Strict):
    trial_ids: list[str] | None = Field(None, min_length=1, max_length=1000)
    last: int | None = Field(None, ge=1, le=1000, description="the N most recent replayable runs")
    tasks: int | None = Field(None, ge=1, le=1000, description="the most recent replayable run of each of the "
                              "N (agent, task) pairs run most recently")
    again: bool = Field(False, description="plan a new experiment (new replay ids) even for trials already "
                        "replayed; without it existing replays are kept and counted in `existing`")

    @model_validator(mode="after")
    def _one(self):
        if sum(v is not None for v in (self.trial_ids, self.last, self.tasks)) != 1:
            raise ValueError("give exactly one of trial_ids (a list of production trial ids), last (a count of "
                             "runs) or tasks (a count of tasks: one run each)")
        return self


class ReplayIds(_Strict):
    replay_ids: list[str] = Field(min_length=1, max_length=100_000)


class GateBody(_Strict):
    baseline: str = Field(min_length=1)
    candidate: str = Field(min_length=1)
    agent: str | None = None
    mode: str = "shadow"
    policy: dict[str, Any] | None = None
    since: str | float | int | None = Field(None, description="scope of the experiment: a duration back from "
                                      "now (2h), an ISO 8601 time or Unix seconds; runs and replays before "
                                      "it do not count")


_PROXY_MAX_BODY = 1 << 20
_PREFIX_SHOWN = 10  # candidates an ambiguous replay id prefix lists


def _finite(v: Any) -> Any:
    """The envelope with NaN / ±inf (a recorded result may hold them) as null: strict JSON."""
    import math

    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def gates_json(results: dict, agent: str | None = None) -> list[dict]:
    """The latest gate result of each (agent, baseline, candidate, mode), as JSON, for the report."""
    out = []
    for (a, base, cand, mode), res in sorted(results.items()):
        if agent is None or a == agent:
            out.append({**res.to_json(), "agent": a or None, "baseline": base, "candidate": cand, "mode": mode})
    return out


def _stage(pipeline: "Pipeline"):
    st = getattr(pipeline, "shadow", None)
    if st is None:
        raise HTTPException(503, "shadow replays are not running in this sidecar")
    return st


def shadow_router(pipeline: "Pipeline", auth) -> APIRouter:
    """The routes above; ``auth`` is the API's bearer-token dependency."""
    r = APIRouter()
    guarded = [Depends(auth)]

    @r.post("/shadow/v1/sessions/{token}/tool-calls")
    async def tool_call(token: str, request: Request) -> JSONResponse:
        st = _stage(pipeline)

        def miss(msg: str, status: int, name: Any = None) -> JSONResponse:
            # the agent sees a sandbox miss: the running replay attempt (if the token is one) counts it
            env = st.proxy_refuse(token, msg, name) if status != 404 else None
            return JSONResponse(env or {"outcome": "sandbox_miss", "message": msg}, status_code=status)

        body, size = [], 0
        async for chunk in request.stream():  # capped whatever Content-Length says (chunked uploads)
            size += len(chunk)
            if size > _PROXY_MAX_BODY:
                return miss(f"body over {_PROXY_MAX_BODY} bytes", 413)
            body.append(chunk)
        try:
            call = json.loads(b"".join(body))
        except (ValueError, RecursionError):
            return miss("body is not JSON (or nested too deeply)", 400)
        if not isinstance(call, dict):
            return miss("body must be a JSON object", 400)
        try:
            ans = st.proxy_answer(token, call)
        except (ValueError, TypeError, RecursionError) as e:
            return miss(f"invalid tool call: {e}", 400, call.get("name"))
        if ans is None:
            return miss("no running replay has this proxy token", 404)
        if ans.delay_s > 0:
            await asyncio.sleep(ans.delay_s)
        return JSONResponse(_finite(ans.envelope), status_code=ans.status, headers=dict(ans.headers))

    @r.get("/api/v1/shadow", dependencies=guarded)
    def state() -> dict:
        st = _stage(pipeline)
        return {"paused": st.paused, "targets": dict(st.settings.shadow_targets),
                "decisions": st.ledger.decision_counts(), "replays": st.ledger.status_counts(),
                "running": len(st.running), "proxy": dict(st.counts["proxy"]),
                "faults_injected": dict(st.counts["faults"]),
                "side_effects_recorded": dict(st.counts["side_effects_recorded"]),
                "rewriter": {**dict(st.counts["rewriter"]), "cost_usd": st.rewriter_cost_usd},
                "last_error": st.last_error}

    @r.get("/api/v1/shadow/replays", dependencies=guarded)
    def replays(status: str | None = None, shadow_of: str | None = None, target_version: str | None = None,
                limit: int = Query(200, ge=1, le=10_000)) -> dict:
        from relyscope.store.shadow import REPLAY_STATUSES

        if status is not None and status not in REPLAY_STATUSES:
            raise HTTPException(422, f"status must be one of {', '.join(REPLAY_STATUSES)}")
        rows = _stage(pipeline).ledger.replays(status=status, shadow_of=shadow_of,
                                               target_version=target_version, limit=limit)
        return {"replays": rows, "count": len(rows)}

    @r.get("/api/v1/shadow/replays/{replay_id}", dependencies=guarded)
    def replay(replay_id: str) -> dict:
        import json

        ledger = _stage(pipeline).ledger
        rows = ledger.replays(replay_ids=[replay_id], with_calls=True, limit=1)
        if not rows:  # a short id as `relyscope shadow list` prints it
            ids = ledger.replay_ids_with_prefix(replay_id, limit=_PREFIX_SHOWN + 1)
            if len(ids) > 1:
                shown = ledger.replays(replay_ids=ids[:_PREFIX_SHOWN], limit=_PREFIX_SHOWN)
                n = str(len(ids)) if len(ids) <= _PREFIX_SHOWN else f"more than {_PREFIX_SHOWN}"
                first = f"the first {_PREFIX_SHOWN}: " if len(ids) > _PREFIX_SHOWN else ""
                raise HTTPException(409, f"replay id prefix {replay_id!r} is ambiguous: it matches {n} replays, "
                                    f"give more characters; {first}" + "; ".join(
                                        f"{x['replay_id']} (version {x['target_version']}, {x['family']}, task "
                                        f"{x['task_id']}, {x['status']})" for x in sorted(shown, key=lambda x: x['replay_id'])))
            rows = ledger.replays(replay_ids=ids, with_calls=True, limit=1) if ids else []
        if not rows:
            raise HTTPException(404, f"no replay id is or starts with {replay_id!r} "
                                "(`relyscope shadow list` prints the replay ids)")
        row = rows[0]
        row["calls"] = json.loads(row["calls"] or "[]")
        return row

    @r.post("/api/v1/shadow/replays", dependencies=guarded)
    def start(body: ReplayStart) -> dict:
        try:
            return _stage(pipeline).plan_now(trial_ids=body.trial_ids, last=body.last, tasks=body.tasks,
                                            again=body.again)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None

    @r.post("/api/v1/shadow/status", dependencies=guarded)
    def progress(body: ReplayIds) -> dict:
        from collections import Counter

        st = _stage(pipeline)
        rows = st.ledger.replays(replay_ids=body.replay_ids, limit=len(body.replay_ids))
        counts = Counter(r["status"] for r in rows)
        # why replays ended without running the agent (the targets' side), most frequent first
        why = Counter((r["status"], r["error"] or "") for r in rows if r["status"] in TARGET_FAILED)
        return {"total": len(body.replay_ids), "by_status": {k: v for k, v in counts.items() if v},
                "errors": [{"status": k[0], "error": k[1], "count": n} for k, n in why.most_common(5)]}

    @r.get("/api/v1/shadow/samples", dependencies=guarded)
    def samples(decision: str | None = None, limit: int = Query(200, ge=1, le=10_000)) -> dict:
        from relyscope.shadow.sampler import DECISIONS

        if decision is not None and decision not in DECISIONS:
            raise HTTPException(422, f"decision must be one of {', '.join(DECISIONS)}")
        rows = _stage(pipeline).ledger.decisions(decision=decision, limit=limit)
        return {"samples": rows, "count": len(rows)}

    def _paused(st, paused: bool, persisted: bool) -> dict:
        out = {"paused": paused, "persisted": persisted}
        if not persisted:  # in memory only: a restart forgets it — say why, now (not in a later last_error)
            out["reason"] = st.save_error or "the shadow state was not saved"
        return out

    @r.post("/api/v1/shadow/pause", dependencies=guarded)
    def pause() -> dict:
        st = _stage(pipeline)
        return _paused(st, True, st.pause())

    @r.post("/api/v1/shadow/resume", dependencies=guarded)
    def resume() -> dict:
        st = _stage(pipeline)
        return _paused(st, False, st.resume())

    def _gate(baseline: str, candidate: str, agent: str | None, mode: str, policy_data: dict | None,
              since: str | float | None = None) -> dict:
        from relyscope.scorers.gate import GatePolicyError, parse_gate_policy
        from relyscope.shadow.gating import MODES, UnknownVersion, parse_since, run_gate
        from relyscope.store import StoreUnavailable

        if mode not in MODES:
            raise HTTPException(422, f"mode must be one of {', '.join(MODES)}")
        try:
            since_s = parse_since(since)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        configured = pipeline.gate_policy
        try:
            # a request policy says what differs from the sidecar's configured policy (`key: null`
            # in `metrics` removes one); the CLI sends the user's file as written, so both agree
            policy = parse_gate_policy(policy_data, origin="request body policy", base=configured) \
                if policy_data is not None else configured
        except GatePolicyError as e:
            raise HTTPException(422, str(e)) from None
        # another policy is a what-if: its verdict is answered, never published (the gauge, the
        # report and the RelyscopeCandidateBlocked alert keep the configured policy's verdict)
        what_if = policy != configured
        try:
            res = run_gate(pipeline.load_trials, pipeline.store, baseline=baseline, candidate=candidate,
                           policy=policy, safety_policy=pipeline.policy, agent=agent, mode=mode,
                           since_s=since_s)
        except UnknownVersion as e:
            raise HTTPException(404, str(e)) from None
        except StoreUnavailable as e:
            raise HTTPException(503, f"store unreachable: {e}") from None
        res, experiment = res
        out = res.to_json()
        out.update(baseline=baseline, candidate=candidate, agent=experiment["agent"], mode=mode,
                   experiment=experiment, what_if=what_if, published=not what_if)
        if not what_if:
            out["stored"] = pipeline.gate_results.publish((experiment["agent"], baseline, candidate, mode), res)
        return out

    @r.get("/api/v1/gate", dependencies=guarded)
    def gate(baseline: str, candidate: str, agent: str | None = None, mode: str = "shadow",
             since: str | None = None) -> dict:
        return _gate(baseline, candidate, agent, mode, None, since)

    @r.post("/api/v1/gate", dependencies=guarded)
    def gate_post(body: GateBody) -> dict:
        """The gate under ``policy``, relative to the configured policy (module docstring); a
        policy that differs from it gives a what-if, not published."""
        return _gate(body.baseline, body.candidate, body.agent, body.mode, body.policy, body.since)

    return r
