"""One typed settings object for the sidecar (pydantic-settings, ``RELYSCOPE_`` environment prefix).

Every flag of ``relyscope serve`` is also an environment variable: ``--store`` ↔
``RELYSCOPE_STORE``, ``--otlp-grpc`` ↔ ``RELYSCOPE_OTLP_GRPC``, ``--otlp-http`` ↔
``RELYSCOPE_OTLP_HTTP``, ``--api`` ↔ ``RELYSCOPE_API``, and so on. Settings are validated once at
start (a bad value fails fast with the field named) and passed in explicitly; nothing else reads
``os.environ``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "parse_hostport", "unknown_env_vars"]


def parse_hostport(value: str) -> tuple[str, int]:
    """``"host:port"`` → (host, port). ``[::1]:4317`` works. Raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"port out of range in {value!r}")
    return host.strip("[]") or "0.0.0.0", p


class Settings(BaseSettings):
    """Sidecar configuration. Units: seconds, bytes."""

    # env_parse_none_str: RELYSCOPE_SCORES_TTL_DAYS=null (and any optional setting) means None
    # allow_inf_nan=False: no setting means anything at inf/nan ("inf" days of retention overflows
    # ClickHouse's DateTime; a nan timeout never fires) — use null where a setting takes None
    model_config = SettingsConfigDict(env_prefix="RELYSCOPE_", extra="forbid", env_nested_delimiter="__",
                                      env_parse_none_str="null", allow_inf_nan=False)

    store: str = Field("chdb:///./.relyscope/data", description="ClickHouse DSN: chdb:///path or http(s)://host:8123/db")
    otlp_grpc: str = Field("127.0.0.1:4317", description="OTLP/gRPC listen address (port 0: any free port)")
    otlp_http: str = Field("127.0.0.1:4318", description="OTLP/HTTP listen address")
    api: str = Field("127.0.0.1:9464", description="management API (/metrics, /healthz, /api/v1/…)")
    spool_dir: str | None = Field(None, description="durable spool directory (default: <store dir>/../spool or ./.relyscope/spool)")
    spool_max_bytes: int = Field(1 << 30, ge=1 << 16, description="spool capacity; when full, OTLP gets the retryable signal")
    spool_segment_bytes: int | None = Field(
        None, ge=4096, description="spool segment size; space is freed per whole segment (default min(64 MiB, spool_max_bytes/8))")
    max_backlog_s: float | None = Field(
        None, gt=0, description="bound on how far storing may fall behind receiving, seconds "
        "(relyscope_backlog_seconds: the larger of the oldest unstored record's age and the worker's estimated "
        "time for the records waiting): while the store works, a request arriving when storing is further "
        "behind is refused with the retryable signal (HTTP 503 + Retry-After, gRPC RESOURCE_EXHAUSTED), so that "
        "senders slow down to the stored rate and freshness stays bounded. Off while the store fails or a record "
        "is retried; the backlog a restart or a failure of at least this long left is exempt (the spool is there "
        "to absorb it). Unset: absorb any backlog up to spool_max_bytes")
    queue_max_batches: int = Field(1024, ge=1, description="in-memory queue of decoded batches in front of the worker")
    decode_workers: int | Literal["auto"] = Field(
        "auto", description="processes that decode spool records for the worker (1: in the worker thread; "
        "auto: 2 when this process may use at least 2 CPUs by its affinity and cgroup CPU quota, else 1); "
        "results are consumed in spool order, so storing, assembly and commits are unchanged")
    decode_timeout_s: float = Field(
        10.0, gt=0, description="with decode_workers > 1: the longest wait for a worker's result; past it the "
        "worker counts as hung, its processes are killed and restarted, and the record is decoded in the "
        "worker thread (relyscope_decode_worker_restarts_total, last_error on /healthz)")
    max_body_bytes: int = Field(16 << 20, ge=1024, description="largest OTLP request body (compressed and decompressed)")
    max_inflight_bytes: int = Field(
        256 << 20, ge=1 << 20, description="request bytes held at once by both OTLP receivers (bodies being read, "
        "decompressed, validated); beyond it a request gets the retryable signal (HTTP 503 / gRPC RESOURCE_EXHAUSTED)")
    http_read_timeout_s: float = Field(
        30.0, gt=0, description="an HTTP request's header, and separately its body, must arrive within this time "
        "(slow-loris guard: the connection is closed / 408)")
    ingest_decoder: Literal["fast", "legacy"] = Field(
        "fast", description="the worker's decode path: fast (columnar insert, key-table normalizer) or legacy "
        "(decode_http + normalize + row insert: the reference the fast path is tested against)")
    max_attributes: int = Field(128, ge=1, description="attributes kept per span (OTel SDK default)")
    max_attribute_length: int | None = Field(None, ge=1, description="longest string attribute kept; None = unlimited (OTel SDK default)")
    grace_period_s: float = Field(5.0, ge=0, description="wait after the root span ends before finalizing a trial")
    root_timeout_s: float = Field(300.0, gt=0, description="finalize a trace with no root as incomplete after this idle time")
    max_clock_ahead_s: float = Field(
        60.0, ge=0, description="a trial ending more than this after the sidecar's clock when it is assembled "
        "(the agent host's clock runs ahead) is placed at its assembly time: its times shifted back, flag "
        "clock_ahead, relyscope_trials_clock_ahead_total; its spans keep their times")
    score_interval_s: float = Field(10.0, gt=0, description="how often group scores and gauges are recomputed")
    score_max_defer: int = Field(
        5, ge=0, le=1000, description="scoring cycles a backlogged worker may postpone in a row (its last insert "
        "batch was full and more spool records wait): gauges then lag by at most (this + 1) score intervals; "
        "0 = never postpone (fresher gauges, less CPU for draining a burst on a shared core)")
    score_window_s: float | None = Field(
        None, gt=0, description="rolling window of the live scores: trials that ended in the last N seconds "
        "(offline imports always count); None = all stored trials")
    score_windows: str = Field(
        "5m,1h,24h,7d,all", description="sliding windows the live scores are computed over (comma list of "
        "<n>s|m|h|d or 'all'; exported as the gauges' window label); offline imports are always all-time")
    score_ci_every_cycle: str = Field(
        "", description="windows of RELYSCOPE_SCORE_WINDOWS whose bootstrap CIs are recomputed every "
        "scoring cycle (comma list; '' = none); the others' CIs, and drift, every score_ci_interval_s")
    score_ci_interval_s: float = Field(
        300.0, ge=0, description="CI refresh cadence of the other windows (by default all of them) and of drift, "
        "per (group, window), spread over the cycles; their point estimates are recomputed every cycle and "
        "published with the CI of the last refresh (0: every cycle)")
    score_ci_min_change: float = Field(
        0.05, ge=0, le=1, description="a window's CI is refreshed (at most every score_ci_interval_s) once at "
        "least this fraction of its trials changed since the last refresh — added, re-graded or slid out — or "
        "once it is score_ci_max_age_s old; 0: whenever the interval has passed. Drift refreshes every interval")
    score_ci_max_age_s: float = Field(
        3600.0, gt=0, description="the oldest a window's CI gets while its trials change less than "
        "score_ci_min_change")
    score_ci_background: bool = Field(
        True, description="the periodic CI and drift refreshes (bootstrap B = n_boot, long windows read from "
        "ClickHouse) run on a background thread, published by the first cycle after they finish, so a scoring "
        "cycle (point estimates, gauges) never waits for them; false: inside the cycle (start, flush and a posted "
        "outcome always refresh inside it)")
    live_check_interval_s: float = Field(
        3600.0, gt=0, description="each in-memory window's per-task statistics are compared with the ClickHouse "
        "rollups (and reloaded on a difference) at least this often, spread over the cycles (on a thread of its own "
        "with score_ci_background, which also reads ahead the buckets the next cycle's window slides leave)")
    drift_current: str = Field("1h", description="drift (metrics.md §10): the current window …")
    drift_reference: str = Field("24h", description="… against the reference window just before it")
    drift_threshold: float = Field(0.05, ge=0, description="practical threshold: drift is flagged only when "
                                   "|Δ| exceeds this (and the alerting interval excludes 0)")
    drift_alert_level: float = Field(0.9998, gt=0, lt=1, description="two-sided level of the alerting interval "
                                     "Δ ± z·se of the drift flag (bootstrap SE, CR1-corrected; z: Student t, tasks − 1 df); "
                                     "measured false alarms per day in bench/README.md")
    drift_min_trials: int = Field(100, ge=0, description="valid complete trials the current drift window needs "
                                  "before drift can be flagged")
    max_label_sets: int = Field(50, ge=1, description="distinct (agent, version) label sets scored and exported "
                                "per sidecar; beyond it, groups fold into agent=version='other' (counted, warned)")
    spans_ttl_days: float = Field(14.0, gt=0, description="retention of raw spans (otel_traces), days "
                                  "after they were stored; <= trials_ttl_days")
    trials_ttl_days: float = Field(90.0, gt=0, description="retention of trials, their grades, outcomes, "
                                          "judge verdicts and the shadow ledger, days after stored; "
                                          "<= scores_ttl_days and rollup_hour_ttl_days (live scores read the rollups)")
    scores_ttl_days: float | None = Field(400.0, gt=0, description="retention of the score history (scores table); "
                                          "None = for ever")
    rollup_minute_ttl_days: float = Field(2.0, gt=0, description="retention of the minute rollups (>= 25 h: "
                                          "windows up to 6 h and drift read them)")
    rollup_hour_ttl_days: float = Field(400.0, gt=0, description="retention of the hour rollups (the 24h/7d windows)")
    traj_sample_ttl_days: float = Field(30.0, gt=0, description="retention of the trajectory sample rows")
    traj_sample: int = Field(50, ge=2, description="C_traj_d / C_traj_s of a task in a window use its most "
                             "recent N successful runs (bounds the cost of trajectory metrics)")
    incremental_scoring: bool = Field(True, description="score from the per-task rollups in ClickHouse "
                                      "(cost follows the traffic); false: reload every trial each cycle and score one "
                                      "window only, score_window_s or else all (other windows: 422)")
    max_k: int = Field(20, ge=1, description="largest k of pass@k / pass^k reported (bounds gauges and "
                       "cost when a fingerprinted task repeats thousands of times)")
    n_boot: int = Field(2000, ge=0, description="bootstrap resamples for CIs (0 disables)")
    auth_token: SecretStr | None = Field(None, description="bearer token required on OTLP and the API when set")
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    policy_file: str | None = Field(None, description="safety policy YAML (see README)")
    redact_deny: list[str] = Field(default_factory=list, description="attribute keys or globs dropped before storage "
                                   "(span, event and resource attributes; case-insensitive)")
    redact_patterns: list[str] = Field(default_factory=list, description="regexes replaced by [REDACTED] in every "
                                       "string stored or served (names, status messages, attribute values, events, "
                                       "resource); in identity values (task / trial / session ids, agent name and "
                                       "version, run kind, span name, …) by a keyed token [REDACTED:<hex>] instead")
    redact_allow: list[str] = Field(default_factory=list, description="when set, only these attribute keys or globs "
                                    "are kept (span, event and resource attributes; case-insensitive), besides the "
                                    "identity keys scoring reads, which are always kept; [] = no allow list")
    redact_key: SecretStr | None = Field(None, min_length=16, description="HMAC key of the identity tokens of "
                                         "RELYSCOPE_REDACT_PATTERNS (equal secrets, equal tokens); unset: a random "
                                         "key kept in <spool dir>.redact-key (relyscope score: one per run)")

    judge_url: str | None = Field(None, description="OpenAI-compatible base URL (…/v1) of an optional LLM judge; off when unset")
    judge_model: str = Field("gpt-4o-mini", description="model name sent to the judge")
    judge_api_key: SecretStr | None = Field(None, description="bearer key for the judge endpoint")
    judge_timeout_s: float = Field(30.0, gt=0)
    judge_max_per_cycle: int = Field(20, ge=1, description="judge calls per scoring cycle (bounds cost)")
    finalized_retain_s: float = Field(
        900.0, ge=0, description="how long a finalized trace is kept in memory to absorb late spans (later ones "
        "reload the trace from the store)")
    finalized_cache_bytes: int = Field(
        64 << 20, ge=0, description="bound on the memory of the finalized traces kept for late spans, bytes "
        "(kept packed, ~100 B per span, and counted by their real size); the oldest are evicted first "
        "(relyscope_finalized_traces_evicted_total)")
    open_traces_max_bytes: int | None = Field(
        128 << 20, gt=0, description="bound on the estimated memory of the open (not yet finalized) traces, "
        "bytes (~1.6 KB per buffered span); beyond it the traces idle the longest are finalized early, as "
        "their timeout would (relyscope_open_traces_finalized_early_total); a later span re-finalizes its "
        "trace. null: unbounded")
    malloc_arena_max: int = Field(
        2, ge=0, description="glibc malloc arenas (mallopt M_ARENA_MAX), set at start before the threads; "
        "0 = glibc's default (8 per core). An explicit MALLOC_ARENA_MAX environment variable wins")
    malloc_trim_interval_s: float = Field(
        30.0, ge=0, description="seconds between malloc_trim(0) calls returning free heap pages to the "
        "system (glibc); 0 = never")
    gc_freeze_interval_s: float = Field(
        3600.0, ge=0, description="seconds between settlings of Python's cyclic garbage collector by the scoring "
        "stage: a full collection, then every surviving object frozen out of its scans (gc.freeze), the first "
        "after the first scoring cycle; the scorer's long-lived windows were otherwise scanned by a full "
        "collection nearly every cycle. 0 = never (Python's default behaviour)")
    stop_timeout_s: float = Field(
        10.0, ge=0, description="graceful stop (SIGTERM): the receivers keep answering while the queue drains, "
        "at most this long; then they close and the rest stays in the spool for the next start")
    stop_quiet_s: float = Field(
        1.0, ge=0, description="graceful stop: the receivers close once nothing arrived for this long and the "
        "queue is drained (within stop_timeout_s); longer where a load balancer takes a while to stop sending")
    store_retry_max_s: float = Field(
        10.0, gt=0, description="longest pause between retries of a store write that failed for a passing reason "
        "(backoff 0.5 s, 1 s, 2 s, … up to this); the spool keeps the data meanwhile")
    quarantine_after_s: float = Field(
        10.0, ge=0, description="a spool record the store refuses with a data error (permanent) is retried for "
        "this long (at least 3 attempts) before it is quarantined")
    # --- shadow replays and release gates (README "Shadow replays and release gates") ---------------
    shadow_targets: dict[str, str] = Field(
        default_factory=dict, description="replay targets: agent version → URL of its replay endpoint "
        "(JSON, e.g. {\"1.4.2\": \"http://agent:8080/relyscope/replay\"}); no targets = no replays")
    shadow_paused: bool = Field(False, description="start with automatic sampling and dispatch paused")
    shadow_rate: float = Field(0.05, ge=0, le=1, description="fraction of eligible production trials replayed")
    shadow_cap_per_hour: int = Field(20, ge=0, description="sampled trials per agent per clock hour")
    shadow_quiet_s: float = Field(30.0, ge=0, description="wait after a trial ends before it may be sampled")
    shadow_lookback_s: float = Field(3600.0, gt=0, description="how far back the sampler looks for finished trials")
    shadow_k: int = Field(5, ge=1, description="replays per sampled trial for nominal, fault and env (K)")
    shadow_j: int = Field(5, ge=0, description="prompt rewrites per sampled trial (J)")
    shadow_families: list[str] = Field(default_factory=lambda: ["nominal", "prompt", "fault", "env"],
                                       description="perturbation families replayed")
    shadow_p_fault: float = Field(0.2, ge=0, le=1, description="per-call fault probability of fault replays")
    shadow_fault_timeout_s: float = Field(5.0, gt=0, description="how long an injected timeout really waits")
    shadow_fault_retry_after_s: float = Field(1.0, ge=0, description="Retry-After of an injected 429")
    shadow_fault_mix: dict[str, float] | None = Field(None, description="fault type → probability (default: "
                                                      "metrics.md §4 mix; must sum to 1)")
    shadow_fault_tools: list[str] | None = Field(None, description="tools (names or globs) faults are injected "
                                                 "into (default: all)")
    shadow_env_strength: str = Field("medium", description="env perturbation strength: mild | medium | severe")
    shadow_prompt_strength: str = Field("mild", description="prompt rewrite strength: mild | medium | strong | naturalistic")
    shadow_live_tools: list[str] = Field(default_factory=list, description="read-only tools (names or globs) "
                                         "a replay may run live when no recording matches; side-effecting ones never")
    shadow_concurrency: int = Field(2, ge=1, le=64, description="replays run at once")
    shadow_replay_timeout_s: float = Field(60.0, gt=0, description="deadline of one replay (target reply)")
    shadow_interval_s: float = Field(5.0, gt=0, description="how often the sampler and dispatcher run")
    shadow_run_kind: str = Field("shadow", description="run kind of replays: shadow | canary")
    shadow_proxy_url: str | None = Field(None, description="base URL the agent reaches the tool proxy at "
                                         "(default: http://<api address>)")
    rewriter_url: str | None = Field(None, description="OpenAI-compatible base URL (…/v1) of an optional LLM "
                                     "prompt rewriter; off when unset (the built-in rule rewriter is used)")
    rewriter_model: str = Field("gpt-4o-mini")
    rewriter_api_key: SecretStr | None = None
    rewriter_max_per_cycle: int = Field(20, ge=1, description="LLM rewriter calls per sampling cycle (bounds cost)")
    rewriter_price_per_1k_input_tokens: float | None = Field(None, ge=0, description="USD per 1000 prompt tokens "
                                                             "(with the output price: rewriter cost is counted; else unknown)")
    rewriter_price_per_1k_output_tokens: float | None = Field(None, ge=0, description="USD per 1000 completion tokens")
    gate_policy_file: str | None = Field(None, description="release-gate thresholds YAML (default: the shipped conservative policy)")

    fault_store_down_file: str | None = Field(
        None, description="chaos testing: while this file exists, store writes fail — empty: as if ClickHouse "
        "were down; JSON {\"code\": N, \"match\": S, \"tables\": [..]}: inserts fail with ClickHouse error code N "
        "while the server answers (relyscope.store.clickhouse)")

    @field_validator("spans_ttl_days", "trials_ttl_days", "scores_ttl_days", "rollup_minute_ttl_days",
                     "rollup_hour_ttl_days", "traj_sample_ttl_days")
    @classmethod
    def _ttl_bound(cls, v: float | None, info) -> float | None:
        from relyscope.store.schema import check_ttl_days

        # ≤ MAX_TTL_DAYS (20 000): ClickHouse DateTime + interval wraps past 2106 and a longer TTL
        # would expire every row at once; only scores_ttl_days takes null (keep for ever)
        check_ttl_days(f"RELYSCOPE_{info.field_name.upper()}", v, nullable=info.field_name == "scores_ttl_days")
        return v

    @model_validator(mode="after")
    def _retention(self) -> "Settings":
        from relyscope.store.schema import Retention

        Retention.from_settings(self)  # ValueError: spans outlive trials, trials outlive rollups, …
        return self

    @field_validator("drift_current", "drift_reference")
    @classmethod
    def _drift_window(cls, v: str) -> str:
        from relyscope.scoring.windows import parse_window

        try:
            length = parse_window(v)[1]
        except ValueError:
            length = None
        if length is None:
            raise ValueError(f"bad drift window {v!r}: one window like 1h or 24h (not 'all')")
        return v

    @field_validator("score_ci_every_cycle")
    @classmethod
    def _ci_windows(cls, v: str) -> str:
        from relyscope.scoring.windows import parse_windows

        if v.strip():
            parse_windows(v)
        return v

    @field_validator("score_windows")
    @classmethod
    def _windows(cls, v: str) -> str:
        from relyscope.scoring.windows import parse_windows

        parse_windows(v)  # ValueError → a validation error naming the bad window
        return v

    @field_validator("decode_workers", mode="before")
    @classmethod
    def _decode_workers(cls, v):
        n = v
        if isinstance(v, str):
            t = v.strip().lower()
            if t == "auto":
                return "auto"
            # int() also takes '٢' and '９'
            n = int(t) if t.isascii() and t.isdigit() else None
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
            raise ValueError(f"expected 'auto' or a number of decode processes from 1 to 64, got {v!r}")
        return n

    @field_validator("otlp_grpc", "otlp_http", "api")
    @classmethod
    def _hostport(cls, v: str) -> str:
        parse_hostport(v)
        return v

    @field_validator("store")
    @classmethod
    def _dsn(cls, v: str) -> str:
        from relyscope.store.clickhouse import check_dsn

        return check_dsn(v)  # its message never shows the DSN's user or password

    @field_validator("redact_allow")
    @classmethod
    def _globs(cls, v: list[str]) -> list[str]:
        bad = [g for g in v if not g.strip()]
        if bad:
            raise ValueError("an empty key or glob matches no attribute (remove it)")
        return v

    @field_validator("redact_patterns")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        import re

        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"invalid regular expression {p!r}: {e}") from None
        return v

    @field_validator("shadow_run_kind")
    @classmethod
    def _replay_kind(cls, v: str) -> str:
        if v not in ("shadow", "canary"):
            raise ValueError(f"shadow_run_kind must be shadow or canary, got {v!r}")
        return v

    @field_validator("shadow_env_strength")
    @classmethod
    def _env_strength(cls, v: str) -> str:
        if v not in ("mild", "medium", "severe"):
            raise ValueError(f"shadow_env_strength must be mild, medium or severe, got {v!r}")
        return v

    @field_validator("shadow_prompt_strength")
    @classmethod
    def _prompt_strength(cls, v: str) -> str:
        if v not in ("mild", "medium", "strong", "naturalistic"):
            raise ValueError(f"shadow_prompt_strength must be mild, medium, strong or naturalistic, got {v!r}")
        return v

    @field_validator("shadow_families")
    @classmethod
    def _families(cls, v: list[str]) -> list[str]:
        bad = [f for f in v if f not in ("nominal", "prompt", "fault", "env")]
        if bad or "nominal" not in v:
            raise ValueError(f"shadow_families: use nominal plus any of prompt, fault, env (got {v!r}); "
                             "nominal is the baseline every robustness ratio divides by")
        return list(dict.fromkeys(v))  # a family named twice is planned once (its replay ids are the same)

    @field_validator("shadow_targets")
    @classmethod
    def _targets(cls, v: dict[str, str]) -> dict[str, str]:
        for version, url in v.items():
            if not str(url).startswith(("http://", "https://")):
                raise ValueError(f"shadow_targets[{version!r}]: an http(s) URL is required, got {url!r}")
        return v

    @field_validator("policy_file", "tls_cert_file", "tls_key_file", "gate_policy_file")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        import os

        if v is not None and not os.path.isfile(v):
            raise ValueError(f"no such file: {v}")
        return v


def unknown_env_vars(environ: dict[str, str]) -> list[str]:
    """``RELYSCOPE_*`` variables that name no setting (a typo is otherwise silently ignored)."""
    known = {f"RELYSCOPE_{name.upper()}" for name in Settings.model_fields}
    known |= {"RELYSCOPE_PROGRESS"}  # CLI-only switch
    return sorted(k for k in environ if k.startswith("RELYSCOPE_") and k not in known)
