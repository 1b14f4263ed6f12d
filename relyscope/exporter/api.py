"""The management API (FastAPI, default :9464): Prometheus ``/metrics``, health, report, outcomes.

| route | what |
|---|---|
| ``GET /metrics`` | Prometheus text format (private registry, see :mod:`relyscope.exporter.prom`) |
| ``GET /healthz`` | summary: ok / degraded / the readiness reason; store, spool, queue, quarantine figures |
| ``GET /livez`` | liveness: 503 only when a restart is needed |
| ``GET /readyz`` | readiness: 503 while new data would be refused (spool or disk full, starting, stopping) |
| ``GET /api/v1/report`` | the reliability report JSON (metrics.md §11); ``?agent=&version=&run_kind=&window=`` (a window the sidecar scores, else 422: :func:`window_refusal`) |
| ``GET /api/v1/trials`` | finalized trials with their steps (``?agent=&version=&run_kind=&trace_id=&task_id=``), cursor-paged (``limit``, ``cursor``) |
| ``GET /api/v1/sessions`` | trials grouped by conversation id (sessions spanning several traces), cursor-paged |
| ``GET /api/v1/history`` | one metric over time per group (``?metric=pass^1&agent=…``) |
| ``GET /api/v1/spans`` | stored span counts (``?keys=true`` or ``?trace_id=`` adds the (trace, span) ids) |
| ``POST /api/v1/outcomes`` | a (possibly late) outcome for a trial or trace: re-scores its group |
| ``POST /api/v1/flush`` | finalize every open trace now and rescore (operators, tests, the demo) |

Every route is described by the OpenAPI page ``/docs`` (schema at ``/openapi.json``). Mistakes are
refused with 422 and a reason, and change nothing stored: a mistyped outcome body, a trace id that
is not 32 hex digits, an unknown metric, a malformed cursor.

All routes require ``Authorization: Bearer <token>`` when ``RELYSCOPE_AUTH_TOKEN`` is set, the
API description (``/docs``, ``/redoc``, ``/openapi.json``) included; the probes (``/livez``,
``/readyz``, ``/healthz``) never do.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from typing import TYPE_CHECKING, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, model_validator
from starlette.concurrency import run_in_threadpool

from relyscope.collector.receivers import check_bearer
from relyscope.exporter.prom import build_registry
from relyscope.exporter.report import build_report
from relyscope.scorers.profile import metric_keys
from relyscope.store import StoreUnavailable
from relyscope.store.clickhouse import display_dsn

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["create_api_app", "OutcomeIn", "MAX_API_BODY_BYTES", "TRACE_ID_PATTERN", "outcome_effect", "window_refusal"]

MAX_API_BODY_BYTES = 1 << 20  # the API takes small JSON bodies only


TRACE_ID_PATTERN = r"^[0-9a-fA-F]{32}$"  # OTLP/JSON trace id: 16 bytes as hex


#: a trial id as the trajectory builder derives it: the trace id and the root span id, in hex
_DERIVED_TRIAL_ID = re.compile(r"[0-9A-Fa-f]{32}:[0-9A-Fa-f]{16}")


class OutcomeIn(BaseModel):
    """A posted outcome (metrics.md §6): exactly one of ``trial_id`` / ``trace_id``.

    Strict types: ``"success": "yes"`` or ``"score": "0.5"`` are refused (422), not coerced — a
    mistyped field must not silently change a score. ``trace_id`` is 32 hex digits (not all
    zero, the OTel invalid id), stored lowercase as the receivers store ids."""

    model_config = {"extra": "forbid", "strict": True}
    trial_id: str | None = Field(None, min_length=1, max_length=512)
    trace_id: str | None = Field(None, pattern=TRACE_ID_PATTERN,
                                 description="32 hex digits (OTLP/JSON form), case-insensitive")
    outcome: Literal["success", "failure", "unknown"] | None = None
    success: bool | None = None
    score: float | None = Field(None, ge=0, le=1)
    source: str = Field("api", min_length=1, max_length=200)
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
        if self.trial_id is not None and _DERIVED_TRIAL_ID.fullmatch(self.trial_id):
            # the id relyscope derives ("<trace id>:<root span id>") is lowercase hex, as stored:
            # an upper-case copy was recorded for an id no trial has (known false, never counted)
            self.trial_id = self.trial_id.lower()
        if self.trace_id is not None:  # stored as lowercase hex, as the receivers store ids
            self.trace_id = self.trace_id.lower()
            if self.trace_id == "0" * 32:
                raise ValueError("trace_id of all zeros is the OpenTelemetry invalid trace id")
        return self


def outcome_effect(posted_verifier: bool, outcome: str, trials: list) -> tuple[str, list[dict]]:
    """What a just-stored post did, from the trials of its key with outcomes resolved (§6).

    Returns ``(status, per-trial effect)``: ``recorded`` (it decides the outcome, or no trial is
    finalized for the key yet), ``overridden_by_verifier`` (a non-verifier post that the span's
    own verified outcome or a verifier post outranks: kept, no effect), or ``no_effect`` (an
    ``unknown`` post: it never changes a known outcome)."""
    effects = [{"trial_id": t.trial_id, "outcome": t.outcome, "outcome_source": t.outcome_source}
               for t in trials]
    if not trials:
        return "recorded", effects
    if outcome == "unknown":
        return "no_effect", effects
    # the post is the latest of its kind: a non-verifier post decides exactly when the resolved
    # source is a posted one; anything else is the span's verified outcome or a verifier post
    if not posted_verifier and not any((t.outcome_source or "").startswith("posted:") for t in trials):
        return "overridden_by_verifier", effects
    return "recorded", effects


class _Cursor:
    """Opaque keyset-paging cursors: the last key of a page, URL-safe base64 of JSON."""

    @staticmethod
    def encode(kind: str, last: str) -> str:
        raw = json.dumps([kind, last], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(kind: str, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        try:
            k, last = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            if k != kind or not isinstance(last, str):
                raise ValueError
            last.encode("utf-8")  # a lone surrogate (JSON "\\ud800") is no key the store can compare
        except (ValueError, TypeError, binascii.Error):  # UnicodeError is a ValueError
            raise HTTPException(422, f"invalid cursor {cursor[:80]!r}: pass next_cursor of a previous "
                                f"{kind} page unchanged") from None
        return last


def json_safe(value):
    """``value`` (JSON-like: dicts, lists, str, numbers) with what JSON cannot carry made text: a
    non-finite float becomes ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` and a lone surrogate its
    ``\\udXXX`` escape — so a 422 that echoes the input of a body holding ``NaN``, ``1e400`` or
    ``"\\ud800"`` is still a 422, not a 500 with the body in a traceback. Pure."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else json.dumps(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def create_api_app(pipeline: "Pipeline", *, token: str | None = None) -> FastAPI:
    """Build the management app around a running pipeline."""
    # with auth on, the API description is behind the token too (routes added below)
    app = FastAPI(title="relyscope", version="0.1.0", **({"docs_url": None, "redoc_url": None, "openapi_url": None}
                                                         if token else {}))
    registry = build_registry(pipeline)
    redactor = getattr(pipeline, "redactor", None)

    def ident(value: str | None) -> str | None:
        """A filter or posted id in its stored form: secrets (RELYSCOPE_REDACT_PATTERNS) replaced
        by their tokens as in the stored identity values, so the raw id finds its trials (the
        token itself too: tokenizing is idempotent); None stays None."""
        if value is None or redactor is None or not redactor.patterns:
            return value
        return redactor.tokenize(value)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        declared = request.headers.get("content-length")
        # the tool proxy caps its own bodies and must see a refused call: the replay it belongs
        # to is a sandbox miss (relyscope.exporter.shadow_api)
        if declared and declared.isdigit() and int(declared) > MAX_API_BODY_BYTES \
                and not request.url.path.startswith("/shadow/v1/sessions/"):
            return JSONResponse({"detail": f"request body over {MAX_API_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        # FastAPI's own 422; plus the header to add when a JSON body came without a JSON content type
        # (curl -d sends application/x-www-form-urlencoded): pydantic then only says the body is no object
        detail = jsonable_encoder(exc.errors())
        if redactor is not None and redactor.patterns:  # the echoed input: no secret in a reply a proxy may log
            detail = redactor.mask(detail)
        out: dict = {"detail": detail}
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if (not ctype.endswith("json") and any(e.get("loc") == ["body"] and e.get("type") == "model_attributes_type"
                                               for e in detail)):
            out["hint"] = (f"the body was sent as {ctype or 'no content type'}: send it as JSON with the header "
                           "content-type: application/json (curl -H 'content-type: application/json')")
        return JSONResponse(json_safe(out), status_code=422)

    def auth(request: Request) -> None:
        if not check_bearer(request.headers.get("authorization"), token):
            raise HTTPException(401, "missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    if token:
        from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(auth)])
        def openapi_json() -> dict:
            return app.openapi()

        @app.get("/docs", include_in_schema=False, dependencies=[Depends(auth)])
        def docs():
            return get_swagger_ui_html(openapi_url="/openapi.json", title="relyscope API")

        @app.get("/redoc", include_in_schema=False, dependencies=[Depends(auth)])
        def redoc():
            return get_redoc_html(openapi_url="/openapi.json", title="relyscope API")
    from relyscope.exporter.shadow_api import shadow_router

    app.include_router(shadow_router(pipeline, auth))

    @app.get("/metrics", dependencies=[Depends(auth)])
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/livez")
    def livez(response: Response) -> dict:
        """Liveness: 200 while the process works; 503 only when a restart is needed (a dead worker
        thread, an unusable spool). A store outage or a full spool never fails it."""
        dead = pipeline.liveness()
        if dead:
            response.status_code = 503
        return {"status": "dead" if dead else "alive", "reason": dead}

    @app.get("/readyz")
    def readyz(response: Response) -> dict:
        """Readiness: 200 while new data is accepted; 503 with the reason (``starting``,
        ``stopping``, ``spool_full``, ``disk_full``, ``spool_write_failed``) otherwise."""
        why = pipeline.readiness()
        if why:
            response.status_code = 503
        return {"status": "not_ready" if why else "ready", "reason": why}

    @app.get("/healthz")
    def healthz(response: Response) -> dict:
        """Summary for people and monitors: ``ok``; ``degraded`` (200: the store is failing and
        data is spooled, or records sit in quarantine); 503 with the readiness reason as status
        (``starting``, ``stopping``, ``spool_full``, ``disk_full``, ``spool_write_failed``, or a
        liveness failure) when new data would be refused."""
        spool = pipeline.spool
        why = pipeline.readiness()
        q_records, q_bytes = pipeline.quarantine_summary()
        status = why or ("degraded" if pipeline.last_error or q_records else "ok")
        if why:
            response.status_code = 503
        return {"status": status, "store": display_dsn(pipeline.store.dsn),
                "spool_pending_records": spool.pending_records, "spool_bytes": spool.bytes_used,
                "queue_depth": pipeline.queue_depth, "last_error": pipeline.last_error,
                "quarantine_records": q_records, "quarantine_bytes": q_bytes}

    @app.get("/api/v1/report", dependencies=[Depends(auth)])
    def report(agent: str | None = None, version: str | None = None, run_kind: str | None = None,
               window: str | None = None) -> dict:
        # window: one of the sidecar's scoring windows (RELYSCOPE_SCORE_WINDOWS); default the primary
        agent, version, run_kind = ident(agent), ident(version), ident(run_kind)
        scoring = pipeline.scoring
        name = window or scoring.primary_window
        refused = window_refusal(pipeline.settings, scoring, name)
        if refused:
            raise HTTPException(422, refused)
        source = scoring.window_scores.get(name, {}) if scoring.window_scores else pipeline.scores
        scores = {g: s for g, s in source.items()
                  if (agent is None or g[0] == agent) and (version is None or g[1] == version)
                  and (run_kind is None or g[2] == run_kind)}
        rep = build_report(scores, pipeline.report_extras(scores, name), window=name)
        from relyscope.exporter.shadow_api import gates_json

        pipeline.gate_results.load()  # no-op once loaded
        if pipeline.gate_results:  # the latest verdict of each comparison gated so far
            rep["gates"] = gates_json(pipeline.gate_results, agent)
        st = pipeline.settings  # how trials finalize: the empty report's hint quotes these
        return {**rep, "window": name, "finalize": {"grace_period_s": st.grace_period_s,
                                                    "score_interval_s": st.score_interval_s,
                                                    "scoring_cycles": pipeline.scoring.cycles_done}}

    @app.get("/api/v1/trials", dependencies=[Depends(auth)])
    async def trials(agent: str | None = None, version: str | None = None, run_kind: str | None = None,
                     trace_id: str | None = Query(None, pattern=TRACE_ID_PATTERN,
                                                  description="only the trials of this trace (32 hex)"),
                     task_id: str | None = Query(None, description="only the trials of this task"),
                     limit: int = Query(100, ge=1, le=1000, description="page size"),
                     cursor: str | None = Query(None, description="next_cursor of the previous page")) -> dict:
        """Finalized trials with their steps, ordered by trial id, one page at a time:
        ``{"trials": [...], "total": n matching, "next_cursor": str | null}`` (null: last page)."""
        after = _Cursor.decode("trials", cursor)
        filters = {"agent": ident(agent), "version": ident(version), "run_kind": ident(run_kind),
                   "task_id": ident(task_id), "trace_ids": [trace_id.lower()] if trace_id else None}
        try:
            rows = await run_in_threadpool(pipeline.load_trials, **filters, after_trial_id=after, limit=limit + 1)
            total = await run_in_threadpool(pipeline.store.count_trials, **filters)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        page = rows[:limit]
        nxt = _Cursor.encode("trials", page[-1].trial_id) if len(rows) > limit else None
        return {"trials": [trial_to_dict(t) for t in page], "total": total, "next_cursor": nxt}

    @app.get("/api/v1/sessions", dependencies=[Depends(auth)])
    async def sessions_(agent: str | None = None, version: str | None = None,
                        run_kind: str | None = None,
                        limit: int = Query(100, ge=1, le=1000, description="sessions per page"),
                        cursor: str | None = Query(None, description="next_cursor of the previous page")) -> dict:
        """Trials grouped by conversation id, ordered by conversation id, one page at a time:
        ``{"sessions": [...], "total": n sessions, "next_cursor": str | null}``."""
        from relyscope.trajectory import sessions

        after = _Cursor.decode("sessions", cursor)
        filters = {"agent": ident(agent), "version": ident(version), "run_kind": ident(run_kind)}
        try:
            cids, total = await run_in_threadpool(pipeline.store.conversation_ids, **filters,
                                                  after=after, limit=limit + 1)
            page_ids = cids[:limit]
            rows = await run_in_threadpool(pipeline.load_trials, **filters, conversation_ids=page_ids) \
                if page_ids else []
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        grouped = sessions(rows)
        out = []
        for cid in page_ids:
            ts = grouped.get(cid)
            if not ts:
                continue
            out.append({"conversation_id": cid, "n_trials": len(ts), "start_ns": ts[0].start_ns,
                        "end_ns": max(t.end_ns for t in ts),
                        "trials": [{"trial_id": t.trial_id, "trace_id": t.trace_id, "agent": t.agent_name,
                                    "status": t.status, "outcome": t.outcome, "start_ns": t.start_ns,
                                    "end_ns": t.end_ns, "actions": list(t.actions)} for t in ts]})
        nxt = _Cursor.encode("sessions", page_ids[-1]) if len(cids) > limit else None
        return {"sessions": out, "total": total, "next_cursor": nxt}

    @app.get("/api/v1/history", dependencies=[Depends(auth)])
    async def history(metric: str, agent: str | None = None, version: str | None = None,
                      run_kind: str | None = None, limit: int = Query(200, ge=1, le=10000)) -> dict:
        """``{"metric", "points": [{agent, version, run_kind, time, value, ci, n_tasks}]}``, oldest
        first. An unknown metric is 422 naming the valid keys (metrics.md §11)."""
        valid = metric_keys(pipeline.settings.max_k)
        if metric not in valid:
            raise HTTPException(422, {"msg": f"unknown metric {metric[:80]!r}", "valid_metrics": valid})
        try:
            points = await run_in_threadpool(pipeline.store.score_history, metric, agent=ident(agent),
                                             version=ident(version), run_kind=ident(run_kind), limit=limit)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        return {"metric": metric, "points": points}

    @app.get("/api/v1/spans", dependencies=[Depends(auth)])
    async def spans(trace_id: str | None = Query(None, pattern=TRACE_ID_PATTERN,
                                                 description="only the keys of this trace (32 hex)"),
                    keys: bool = False) -> dict:
        try:
            out = await run_in_threadpool(pipeline.store.span_counts)
            if keys or trace_id:
                out["keys"] = [list(k) for k in await run_in_threadpool(
                    pipeline.store.span_keys, trace_id.lower() if trace_id else None)]
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        return out

    def _heirs(trial_id: str) -> list:
        """The trial that replaced ``trial_id`` when its trace's real root arrived (its tombstone's
        heir, :func:`relyscope.scorers.outcomes.rekeyed_posts`), outcome resolved; [] if none."""
        from relyscope.scorers.outcomes import rekeyed_posts

        tombs = pipeline.store.tombstones([trial_id])
        if not tombs:
            return []
        trials = pipeline.load_trials(trace_ids=[tombs[0].trace_id])
        heirs = rekeyed_posts(trials, tombs)
        return [t for t in trials if trial_id in heirs.get(t.trial_id, ())]

    @app.post("/api/v1/outcomes", dependencies=[Depends(auth)])
    async def outcomes(body: OutcomeIn) -> dict:
        """Store a (possibly late) outcome and rescore. Reply ``status``: ``recorded`` (it decides
        the outcome, or its trial is not finalized yet: ``known`` false — a typo in an id shows up
        so), ``overridden_by_verifier`` (kept, but the span's verified outcome or a verifier post
        outranks it, metrics.md §6), ``no_effect`` (an ``unknown`` post). ``trials``: the
        resolved outcome of each trial of the key after the post. 422: a mistyped body."""
        outcome = body.outcome or ("success" if body.success else "failure")
        # a trial id as the spans' was stored: a secret in it replaced by its token (idempotent, so
        # the token itself works too); the free-text source masked as any stored string
        kind, key = ("trial", ident(body.trial_id)) if body.trial_id else ("trace", body.trace_id)
        source = redactor.mask(body.source) if redactor is not None else body.source
        try:
            await run_in_threadpool(pipeline.store.insert_outcome, key, kind, outcome, body.score,
                                    source, verifier=body.verifier)
            pipeline.scoring.outcome_posted(kind, key)  # found by name, not by its clock stamp
            await run_in_threadpool(pipeline.rescore, all_groups=True)
            lookup = {"trial_ids": [key]} if kind == "trial" else {"trace_ids": [key]}
            mine = await run_in_threadpool(pipeline.load_trials, **lookup)
            if not mine and kind == "trial" and key[32:33] == ":":  # a re-keyed trial's old id?
                mine = await run_in_threadpool(_heirs, key)
        except StoreUnavailable as e:
            raise HTTPException(503, str(e)) from e
        status, effects = outcome_effect(body.verifier, outcome, mine)
        return {"status": status, "key_kind": kind, "key": key, "outcome": outcome, "known": bool(mine),
                "trials": effects}

    @app.post("/api/v1/flush", dependencies=[Depends(auth)])
    async def flush(timeout_s: float = Query(30.0, gt=0, le=600)) -> dict:
        ok = await run_in_threadpool(pipeline.flush, timeout_s)
        if not ok:
            raise HTTPException(504, "flush did not finish in time")
        return {"status": "flushed", "groups": len(pipeline.scores)}

    return app


def window_refusal(settings, scoring, name: str) -> str | None:
    """Why ``GET /api/v1/report?window=name`` cannot be answered (the 422 detail), or None.

    ``scoring``: the :class:`relyscope.scoring.stage.ScoreStage` (``windows``, ``computed_windows``,
    ``primary_window``). With ``incremental_scoring`` off the batch scorer reloads the trials each
    cycle and scores one window only (every stored trial, or the last ``score_window_s`` seconds):
    any other window is refused, naming the settings to change, rather than answered with that
    window's numbers."""
    computed = list(scoring.computed_windows)
    if name in computed:
        return None
    configured = [n for n, _ in scoring.windows]
    if settings.incremental_scoring or name not in configured + ["all"]:
        from relyscope.scoring.windows import parse_window

        try:
            _, length = parse_window(name)
        except ValueError as e:  # not a window at all (or a list of them)
            return f"unknown window {name!r}: {e}; this sidecar scores {', '.join(computed)}"
        same = [n for n, ln in scoring.windows if ln == length and n in computed]
        alias = f" ({same[0]!r} is the same length: ask for window={same[0]})" if same else ""
        return (f"unknown window {name!r}: not one of RELYSCOPE_SCORE_WINDOWS, the windows this sidecar scores "
                f"({', '.join(computed)}){alias}; to score it, add it to RELYSCOPE_SCORE_WINDOWS "
                f"(e.g. RELYSCOPE_SCORE_WINDOWS={','.join(configured + [name])})"
                + ("" if settings.incremental_scoring else ", set RELYSCOPE_INCREMENTAL_SCORING=true (the default)")
                + " and restart the sidecar")
    only = scoring.primary_window
    what = ("every stored trial" if settings.score_window_s is None else
            f"the trials that ended in the last {settings.score_window_s:g} s, RELYSCOPE_SCORE_WINDOW_S")
    return (f"window {name!r} is not scored by this sidecar: with RELYSCOPE_INCREMENTAL_SCORING=false it "
            f"reloads the trials each cycle and scores only {only!r} ({what}). Ask for window={only}, or "
            "set RELYSCOPE_INCREMENTAL_SCORING=true (the default) to score every window of "
            f"RELYSCOPE_SCORE_WINDOWS ({', '.join(configured)})")


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
