"""Issue 2, "what must be shown": the whole data path on real input, over real OTLP."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from conftest import BIN, TAU_FILE

# Published τ-bench leaderboard figures for gpt-4o airline (shared/data/README.md)
PUBLISHED = {"pass^1": 0.420, "pass^2": 0.2733, "pass^3": 0.220, "pass^4": 0.200}


def _group(rep: dict, run_kind: str = "offline") -> dict:
    groups = [g for g in rep["groups"] if g["run_kind"] == run_kind]
    assert len(groups) == 1, rep
    return groups[0]


def _check_published(g: dict) -> None:
    assert g["tasks"] == 50 and g["trials"] == 200
    for k, v in PUBLISHED.items():
        assert g["metrics"][k]["value"] == pytest.approx(v, abs=5e-4), k
    assert "C_out" in g["metrics"]


def test_tau_bench_import_through_sidecar_gives_published_pass_hat_k(sidecar):
    r = subprocess.run([str(BIN), "import", "tau-bench", str(TAU_FILE), "--endpoint", sidecar.otlp_grpc],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sidecar.flush()
    # the CLI asks the running sidecar over its API
    out = subprocess.run([str(BIN), "report", "--format", "json", "--api", sidecar.api],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["formula_set"] == "relyscope-v1"
    _check_published(_group(rep))


def test_score_on_otlp_json_export_gives_same_numbers(tmp_path):
    jsonl = tmp_path / "tau.otlp.jsonl"
    r = subprocess.run([str(BIN), "import", "tau-bench", str(TAU_FILE), "--out", str(jsonl)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(BIN), "score", "--format", "json", "--n-boot", "100", str(jsonl)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    _check_published(_group(json.loads(out.stdout)))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_otlp_exporters_reach_store_and_metrics(sidecar, protocol):
    if protocol == "grpc":
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{sidecar.grpc_port}", insecure=True)
    else:
        exporter = HttpExporter(endpoint=f"{sidecar.otlp_http}/v1/traces")
    tp = TracerProvider(resource=Resource.create({"service.name": "sdk-agent", "service.version": "2.0"}))
    tp.add_span_processor(BatchSpanProcessor(exporter))
    tracer = tp.get_tracer("test")
    # 3 tasks x 2 trials; task t succeeds on trial 0 only when t is even
    for task in range(3):
        for trial in range(2):
            with tracer.start_as_current_span("invoke_agent sdk-agent") as root:
                root.set_attribute("gen_ai.operation.name", "invoke_agent")
                root.set_attribute("relyscope.task.id", f"t{task}")
                ok = task % 2 == 0 and trial == 0
                root.set_attribute("relyscope.outcome", "success" if ok else "failure")
                with tracer.start_as_current_span("chat m") as llm:
                    llm.set_attribute("gen_ai.operation.name", "chat")
                    llm.set_attribute("gen_ai.usage.input_tokens", 10)
                    llm.set_attribute("gen_ai.usage.output_tokens", 5)
                with tracer.start_as_current_span("execute_tool lookup") as tool:
                    tool.set_attribute("gen_ai.operation.name", "execute_tool")
                    tool.set_attribute("gen_ai.tool.name", "lookup")
    tp.force_flush()
    tp.shutdown()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        trials = sidecar.trials(agent="sdk-agent")
        if len(trials) == 6:
            break
        time.sleep(0.3)
    assert len(trials) == 6
    assert all(t["actions"] == ["llm", "lookup"] for t in trials)
    assert all(t["input_tokens"] == 10 and t["output_tokens"] == 5 for t in trials)
    assert {t["agent_version"] for t in trials} == {"2.0"}
    sidecar.flush()
    text = sidecar.get("/metrics").text
    # successes per task: t0 1/2, t1 0/2, t2 1/2 → pass^1 = mean(0.5, 0, 0.5) = 1/3, pass^2 = 0
    per_window = [l for l in text.splitlines() if l.startswith("relyscope_score{") and 'metric="pass^1"' in l]
    # one series per scoring window; every trial just ended, so all windows hold all six
    assert sorted(l.split('window="')[1].split('"')[0] for l in per_window) == ["1h", "24h", "5m", "7d", "all"]
    assert len({l.rsplit(" ", 1)[1] for l in per_window}) == 1
    line1 = [l for l in per_window if 'window="all"' in l]
    line2 = [l for l in text.splitlines() if l.startswith("relyscope_score{") and 'metric="pass^2"' in l
             and 'window="all"' in l]
    assert len(line1) == 1 and 'agent="sdk-agent"' in line1[0] and 'version="2.0"' in line1[0]
    assert 'run_kind="production"' in line1[0] and 'k="1"' in line1[0]
    assert float(line1[0].rsplit(" ", 1)[1]) == pytest.approx(1 / 3)
    assert float(line2[0].rsplit(" ", 1)[1]) == 0.0
    assert "task" not in line1[0].replace("n_tasks", "")  # no task-level labels
    assert "relyscope_spans_accepted_total 18.0" in text
    # every span written to the store once (nothing re-sent): 6 runs x 3 spans
    assert "relyscope_spans_stored_total 18.0" in text


def test_demo_prints_pass_hat_1_to_5_and_c_out(tmp_path):
    r = subprocess.run([str(BIN), "demo", "--format", "json", "--no-shadow", "--tasks", "8",
                        "--data-dir", str(tmp_path / "demo")], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    g = rep["groups"][0]
    for k in range(1, 6):
        assert f"pass^{k}" in g["metrics"]
    assert g["metrics"]["C_out"]["value"] is not None
    assert g["trials"] == 40  # 8 tasks x 5 trials


def test_configure_follows_otel_exporter_otlp_protocol(sidecar, monkeypatch):
    """configure() with no protocol honours OTEL_EXPORTER_OTLP_PROTOCOL like the OTel SDK does
    (a fresh user's gRPC exporter aimed at :4318 silently lost every span)."""
    from relyscope.instrumentation import agent_run, configure

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    tp = configure(sidecar.otlp_http, service_name="env-agent")
    with agent_run("env-agent", task_id="t", tracer_provider=tp):
        pass
    tp.shutdown()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not sidecar.trials(agent="env-agent"):
        time.sleep(0.3)
    assert len(sidecar.trials(agent="env-agent")) == 1
