"""One typed settings object for the sidecar (pydantic-settings, ``RELYSCOPE_`` environment prefix).

Every flag of ``relyscope serve`` is also an environment variable: ``--store`` ↔
``RELYSCOPE_STORE``, ``--otlp-grpc`` ↔ ``RELYSCOPE_OTLP_GRPC``, ``--otlp-http`` ↔
``RELYSCOPE_OTLP_HTTP``, ``--api`` ↔ ``RELYSCOPE_API``, and so on. Settings are validated once at
start (a bad value fails fast with the field named) and passed in explicitly; nothing else reads
``os.environ``.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
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

    model_config = SettingsConfigDict(env_prefix="RELYSCOPE_", extra="forbid", env_nested_delimiter="__")

    store: str = Field("chdb:///./.relyscope/data", description="ClickHouse DSN: chdb:///path or http(s)://host:8123/db")
    otlp_grpc: str = Field("127.0.0.1:4317", description="OTLP/gRPC listen address (port 0: any free port)")
    otlp_http: str = Field("127.0.0.1:4318", description="OTLP/HTTP listen address")
    api: str = Field("127.0.0.1:9464", description="management API (/metrics, /healthz, /api/v1/…)")
    spool_dir: str | None = Field(None, description="durable spool directory (default: <store dir>/../spool or ./.relyscope/spool)")
    spool_max_bytes: int = Field(1 << 30, ge=1 << 16, description="spool capacity; when full, OTLP gets the retryable signal")
    spool_segment_bytes: int | None = Field(
        None, ge=4096, description="spool segment size; space is freed per whole segment (default min(64 MiB, spool_max_bytes/8))")
    queue_max_batches: int = Field(1024, ge=1, description="in-memory queue of decoded batches in front of the worker")
    max_body_bytes: int = Field(16 << 20, ge=1024, description="largest OTLP request body (compressed and decompressed)")
    max_attributes: int = Field(128, ge=1, description="attributes kept per span (OTel SDK default)")
    max_attribute_length: int | None = Field(None, ge=1, description="longest string attribute kept; None = unlimited (OTel SDK default)")
    grace_period_s: float = Field(5.0, ge=0, description="wait after the root span ends before finalizing a trial")
    root_timeout_s: float = Field(300.0, gt=0, description="finalize a trace with no root as incomplete after this idle time")
    score_interval_s: float = Field(10.0, gt=0, description="how often group scores and gauges are recomputed")
    score_window_s: float | None = Field(
        None, gt=0, description="rolling window of the live scores: trials that ended in the last N seconds "
        "(offline imports always count); None = all stored trials")
    score_windows: str = Field(
        "5m,1h,24h,7d,all", description="sliding windows the live scores are computed over (comma list of "
        "<n>s|m|h|d or 'all'; exported as the gauges' window label); offline imports are always all-time")
    drift_current: str = Field("1h", description="drift (metrics.md §10): the current window …")
    drift_reference: str = Field("24h", description="… against the reference window just before it")
    drift_threshold: float = Field(0.05, ge=0, description="practical threshold: drift is flagged when the "
                                   "bootstrap CI of Δ excludes 0 and |Δ| exceeds this")
    traj_sample: int = Field(50, ge=2, description="C_traj_d / C_traj_s of a task in a window use its most "
                             "recent N successful runs (bounds the cost of trajectory metrics)")
    incremental_scoring: bool = Field(True, description="score from the per-task rollups in ClickHouse "
                                      "(cost follows the traffic); false: reload every trial each cycle")
    max_k: int = Field(20, ge=1, description="largest k of pass@k / pass^k reported (bounds gauges and "
                       "cost when a fingerprinted task repeats thousands of times)")
    n_boot: int = Field(2000, ge=0, description="bootstrap resamples for CIs (0 disables)")
    auth_token: SecretStr | None = Field(None, description="bearer token required on OTLP and the API when set")
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    policy_file: str | None = Field(None, description="safety policy YAML (see README)")
    redact_deny: list[str] = Field(default_factory=list, description="attribute keys dropped before storage")
    redact_patterns: list[str] = Field(default_factory=list, description="regexes masked in content attributes before storage")

    judge_url: str | None = Field(None, description="OpenAI-compatible base URL (…/v1) of an optional LLM judge; off when unset")
    judge_model: str = Field("gpt-4o-mini", description="model name sent to the judge")
    judge_api_key: SecretStr | None = Field(None, description="bearer key for the judge endpoint")
    judge_timeout_s: float = Field(30.0, gt=0)
    judge_max_per_cycle: int = Field(20, ge=1, description="judge calls per scoring cycle (bounds cost)")
    fault_store_down_file: str | None = Field(
        None, description="chaos testing: while this file exists, every store write fails as if ClickHouse were down")

    @field_validator("drift_current", "drift_reference")
    @classmethod
    def _drift_window(cls, v: str) -> str:
        from relyscope.scoring.windows import parse_windows

        if len(parse_windows(v)) != 1 or parse_windows(v)[0][1] is None:
            raise ValueError(f"bad drift window {v!r}: one window like 1h or 24h (not 'all')")
        return v

    @field_validator("score_windows")
    @classmethod
    def _windows(cls, v: str) -> str:
        from relyscope.scoring.windows import parse_windows

        parse_windows(v)  # ValueError → a validation error naming the bad window
        return v

    @field_validator("otlp_grpc", "otlp_http", "api")
    @classmethod
    def _hostport(cls, v: str) -> str:
        parse_hostport(v)
        return v

    @field_validator("store")
    @classmethod
    def _dsn(cls, v: str) -> str:
        if not v.startswith(("chdb://", "http://", "https://")):
            raise ValueError(f"unrecognised store DSN {v!r}: use chdb:///path (embedded), chdb://memory, "
                             "or http(s)://user:password@host:8123/database")
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

    @field_validator("policy_file", "tls_cert_file", "tls_key_file")
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
