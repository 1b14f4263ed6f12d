"""The management API (FastAPI, default :9464): Prometheus ``/metrics``, health, report, outcomes.

| route | what |
|---|---|
| ``GET /metrics`` | Prometheus text format (private registry, see :mod:`relyscope.exporter.prom`) |
| ``GET /healthz`` | liveness + store reachability, spool and queue figures |
| ``GET /api/v1/report`` | the reliability report JSON (metrics.md §11); ``?agent=&version=&run_kind=`` |
| ``GET /api/v1/trials`` | finalized trials with their steps (``?agent=&version=&run_kind=&limit=``) |
| ``GET /api/v1/sessions`` | trials grouped by conversation id (sessions spanning several traces) |
| ``GET /api/v1/history`` | one metric over time per group (``?metric=pass^1&agent=…``) |
| ``GET /api/v1/spans`` | stored span counts (``?keys=true`` or ``?trace_id=`` adds the (trace, span) ids) |
| ``POST /api/v1/outcomes`` | a (possibly late) outcome for a trial or trace: re-scores its group |
| ``POST /api/v1/flush`` | finalize every open trace now and rescore (operators, tests, the demo) |

All routes require ``Authorization: Bearer <token>`` when ``RELYSCOPE_AUTH_TOKEN`` is set.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, model_validator
from starlette.concurrency import run_in_threadpool

from relyscope.collector.receivers import check_bearer
from relyscope.exporter.prom import build_registry
from relyscope.exporter.report import build_report
from relyscope.store import StoreUnavailable

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["create_api_app", "OutcomeIn", "MAX_API_BODY_BYTES"]

MAX_API_BODY_BYTES = 1 << 20  # the API takes small JSON bodies only


class OutcomeIn(BaseModel):
    """A posted outcome (metrics.md §6): exactly one of ``trial_id`` / ``trace_id``."""

    model_config = {"extra": "forbid"}
    trial_id: str | None = None
    trace_id: str | None = None
    outcome: Literal["success", "failure", "unknown"] | None = None
    success: bool | None = None
    score: float | None = Field(None, ge=0, le=1)
    source: str = "api"
    verifier: bool = Field(False, description="true: the application's own environment check (wins over the span)")

    @model_validator(mode="after")
    def _check(self):
        if (self.trial_id is None) == (self.trace_id is None):
            raise ValueError("give exactly one of trial_id or trace_id")
        if self.outcome is None and self.success is None:
            raise ValueError("give outcome or success")
        if self.outcome is not None and self.success is not None and \
                self.outcome != ("success" if self.success else "failure"):
            raise ValueError(f"outcome {self.outcome!r} contradicts success={self.success}")
        if self.trace_id is not None:  # stored as lowercase hex, as the receivers store ids
            self.trace_id = self.trace_id.strip().lower()
        return self


def create_api_app(pipeline: "Pipeline", *, token: str | None = None) -> FastAPI:
    """Build the management app around a running pipeline."""
    app = FastAPI(title="relyscope", version="0.1.0")
    registry = build_registry(pipeline)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_API_BODY_BYTES:
            return JSONResponse({"detail": f"request body over {MAX_API_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    def auth(request: Request) -> None:
        if not check_bearer(request.headers.get("authorization"), token):
            raise HTTPException(401, "missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    from relyscope.exporter.shadow_api import shadow_router

    app.include_router(shadow_router(pipeline, auth))

    @app.get("/metrics", dependencies=[Depends(auth)])
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz(response: Response) -> dict:
        """``ok``; ``degraded`` (200: the store is failing, data is spooled); ``spool_full`` and
        ``starting`` (503: new data would be refused / not ready yet)."""
        spool = pipeline.spool
        full = spool.bytes_used >= pipeline.settings.spool_max_bytes * 0.95
        status = ("starting" if not pipeline.ready else "spool_full" if full
                  else "degraded" if pipeline.last_error else "ok")
        if status in ("starting", "spool_full"):
            response.status_code = 503
        return {"status": status, "store": pipeline.store.dsn.split("@")[-1],
                "spool_pending_records": spool.pending_records, "spool_bytes": spool.bytes_used,
                "queue_depth": pipeline.queue_depth, "last_error": pipeline.last_error}

    @app.get("/api/v1/report", dependencies=[Depends(auth)])
    def report(agent: str | None = None, version: str | None = None, run_kind: str | None = None,
               window: str | None = None) -> dict:
        # window: one of the sidecar's scoring windows (RELYSCOPE_SCORE_WINDOWS); default the primary
        scoring = pipeline.scoring
        name = window or scoring.primary_window
        names = [n for n, _ in scoring.windows]
        if name not in names:
            raise HTTPException(422, f"unknown window {name!r}; this sidecar scores {', '.join(names)}")
        source = scoring.window_scores.get(name, {}) if scoring.window_scores else pipeline.scores
        scores = {g: s for g, s in source.items()
                  if (agent is None or g[0] == agent) and (version is None or g[1] == version)
                  and (run_kind is None or g[2] == run_kind)}
        rep = build_report(scores, pipeline.report_extras(scores))
        from relyscope.exporter.shadow_api import gates_json

        if pipeline.gate_results:  # the latest verdict of each comparison gated so far
            rep["gates"] = gates_json(pipeline.gate_results, agent)
        return {**rep, "window": name}

    @app.get("/api/v1/trials", dependencies=[Depends(auth)])
    async def trials(agent: str | None = None, version: str | None = None, run_kind: str | None = None,
                     limit: int = Query(1000, ge=1, le=100000)) -> dict:
        try:
            rows = await run_in_threadpool(pipeline.load_trials, agent=agent, version=version, run_kind=run_kind)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        return {"trials": [trial_to_dict(t) for t in rows[:limit]], "total": len(rows)}

    @app.get("/api/v1/sessions", dependencies=[Depends(auth)])
    async def sessions_(agent: str | None = None, version: str | None = None,
                        run_kind: str | None = None) -> dict:
        from relyscope.trajectory import sessions

        try:
            rows = await run_in_threadpool(pipeline.load_trials, agent=agent, version=version, run_kind=run_kind)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        out = []
        for cid, ts in sessions(rows).items():
            out.append({"conversation_id": cid, "n_trials": len(ts), "start_ns": ts[0].start_ns,
                        "end_ns": max(t.end_ns for t in ts),
                        "trials": [{"trial_id": t.trial_id, "trace_id": t.trace_id, "agent": t.agent_name,
                                    "status": t.status, "outcome": t.outcome, "start_ns": t.start_ns,
                                    "end_ns": t.end_ns, "actions": list(t.actions)} for t in ts]})
        return {"sessions": out, "total": len(out)}

    @app.get("/api/v1/history", dependencies=[Depends(auth)])
    async def history(metric: str, agent: str | None = None, version: str | None = None,
                      run_kind: str | None = None, limit: int = Query(200, ge=1, le=10000)) -> dict:
        try:
            points = await run_in_threadpool(pipeline.store.score_history, metric, agent=agent,
                                             version=version, run_kind=run_kind, limit=limit)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        return {"metric": metric, "points": points}

    @app.get("/api/v1/spans", dependencies=[Depends(auth)])
    async def spans(trace_id: str | None = None, keys: bool = False) -> dict:
        try:
            out = await run_in_threadpool(pipeline.store.span_counts)
            if keys or trace_id:
                out["keys"] = [list(k) for k in await run_in_threadpool(pipeline.store.span_keys, trace_id)]
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        return out

    @app.post("/api/v1/outcomes", dependencies=[Depends(auth)])
    async def outcomes(body: OutcomeIn) -> dict:
        outcome = body.outcome or ("success" if body.success else "failure")
        kind, key = ("trial", body.trial_id) if body.trial_id else ("trace", body.trace_id)
        try:
            await run_in_threadpool(pipeline.store.insert_outcome, key, kind, outcome, body.score,
                                    body.source, verifier=body.verifier)
            known = await run_in_threadpool(pipeline.store.trial_known, kind, key)
            await run_in_threadpool(pipeline.rescore, all_groups=True)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        # an outcome may legitimately arrive before its trial is finalized; "known" tells a caller
        # whether it already applies (a typo in an id shows up as false)
        return {"status": "recorded", "key_kind": kind, "key": key, "outcome": outcome, "known": known}

    @app.post("/api/v1/flush", dependencies=[Depends(auth)])
    async def flush(timeout_s: float = Query(30.0, gt=0, le=600)) -> dict:
        ok = await run_in_threadpool(pipeline.flush, timeout_s)
        if not ok:
            raise HTTPException(504, "flush did not finish in time")
        return {"status": "flushed", "groups": len(pipeline.scores)}

    return app


def trial_to_dict(t) -> dict:
    """JSON-ready trial with steps (ops as strings, flags as sorted lists)."""
    d = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "steps"}
    d["flags"] = sorted(t.flags)
    d["wall_time_s"] = t.wall_time_s
    d["actions"] = list(t.actions)
    d["steps"] = []
    for s in t.steps:
        sd = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
        sd["op"] = s.op.value
        sd["flags"] = sorted(s.flags)
        if isinstance(sd.get("arguments"), bytes):
            sd["arguments"] = sd["arguments"].hex()
        if isinstance(sd.get("result"), bytes):
            sd["result"] = sd["result"].hex()
        d["steps"].append(sd)
    return d
