"""``relyscope demo-agent``: the demo's simulated agent sent to a sidecar that is already running
(found missing by a fresh-user trial: the demo's agent could only talk to the demo's own sidecar).

Expected counts come from the same runs captured by the OTel SDK's in-memory exporter, not from
the command's output."""

from __future__ import annotations

import re
import socket
import subprocess

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relyscope.demo import run_demo
from relyscope.testing import RELYSCOPE_BIN as BIN

TASKS, TRIALS = 3, 2


def _expected_spans(tasks: int = TASKS, trials: int = TRIALS) -> int:
    exp = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exp))
    run_demo(tp, tasks=tasks, trials=trials, seed=7)
    n = len(exp.get_finished_spans())
    tp.shutdown()
    return n


def _run(*args: str, env: dict | None = None, tasks: int = TASKS, trials: int = TRIALS) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([str(BIN), "demo-agent", "--tasks", str(tasks), "--trials", str(trials), *args],
                          capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})})


def test_demo_agent_sends_its_runs_to_a_running_sidecar_over_grpc_and_http(sidecar_factory):
    want = _expected_spans()
    assert want > TASKS * TRIALS  # a root and its children per run
    for proto, endpoint in (("grpc", "otlp_grpc"), ("http/protobuf", "otlp_http")):
        sc = sidecar_factory()
        r = _run("--endpoint", getattr(sc, endpoint), "--protocol", proto)
        assert r.returncode == 0, r.stderr
        out = " ".join(r.stderr.split())
        assert f"{TASKS * TRIALS} runs" in out
        assert re.search(rf"\b{want} spans; {want} acknowledged by .*, 0 not", out), out
        sc.flush()
        assert sc.get("/api/v1/spans").json()["spans"] == want
        groups = [g for g in sc.report()["groups"] if g["agent"] == "support-agent"]
        assert [g["trials"] for g in groups] == [TASKS * TRIALS]
        sc.kill()


def test_nothing_listening_is_a_clear_error():
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        r = _run("--endpoint", f"http://127.0.0.1:{port}")
    assert r.returncode == 1
    assert "nothing listens at" in r.stderr and "relyscope serve" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_refused_token_fails_the_command(sidecar_factory):
    sc = sidecar_factory(extra_env={"RELYSCOPE_AUTH_TOKEN": "s3cret"})
    r = _run("--endpoint", sc.otlp_grpc, env={"RELYSCOPE_AUTH_TOKEN": ""})
    assert r.returncode == 1, r.stderr
    assert "; 0 acknowledged" in " ".join(r.stderr.split())
    ok = _run("--endpoint", sc.otlp_grpc, "--token", "s3cret")
    assert ok.returncode == 0, ok.stderr


def test_bad_arguments_say_what_to_change():
    r = _run("--protocol", "thrift")
    assert r.returncode == 2 and "--protocol must be one of grpc, http/protobuf" in " ".join(r.stderr.split())
    r = _run("--endpoint", "http://[::1")
    assert r.returncode == 2 and "expected an OTLP endpoint such as" in " ".join(r.stderr.split()), r.stderr


def test_a_large_run_loses_no_span_and_a_host_port_endpoint_is_plain_grpc(sidecar_factory):
    # bug (fresh-user trial): 5 000 runs overfilled the SDK's batch queue ("Queue full, dropping
    # Span"): a third of the runs never reached the sidecar and the command still exited 0
    tasks, trials = 600, 5
    want = _expected_spans(tasks, trials)
    assert want > 2048  # more than the SDK's default batch queue
    sc = sidecar_factory()
    host_port = sc.otlp_grpc.split("://", 1)[1]  # no scheme: was taken for TLS
    r = _run("--endpoint", host_port, tasks=tasks, trials=trials)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(rf"\b{want} spans; {want} acknowledged by .*, 0 not", " ".join(r.stderr.split()))
    sc.flush()
    assert sc.get("/api/v1/spans").json()["spans"] == want


def test_the_shells_otel_variables_neither_break_nor_fool_it(sidecar_factory):
    sc = sidecar_factory()
    # --protocol grpc wins over an OTEL_EXPORTER_OTLP_PROTOCOL the SDK would refuse (was a traceback)
    r = _run("--endpoint", sc.otlp_grpc, env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert r.returncode == 0, r.stderr[-2000:]
    # a sampler that records nothing: not "0 acknowledged, 0 not" and exit 0
    r = _run("--endpoint", sc.otlp_grpc, env={"OTEL_TRACES_SAMPLER": "always_off"})
    assert r.returncode == 1 and "no span was recorded" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_stops_sending_and_says_how_much_got_through(sidecar_factory):
    # bugs: Ctrl-C ended the command with exit 130 and not a word, so the operator could not tell
    # how many runs reached the sidecar; and a Ctrl-C inside a flush (which exports in the main
    # thread) lost the batch it had taken off the SDK's queue (~1 run in 2: 140-190 spans)
    import os
    import signal
    import time

    sc = sidecar_factory()
    p = subprocess.Popen([str(BIN), "demo-agent", "--endpoint", sc.otlp_grpc, "--tasks", "5000", "--trials", "10"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(6)  # past the CLI's start, well before 50 000 runs end
        assert p.poll() is None, p.communicate()[1][-2000:]
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    out = " ".join(stderr.split())
    assert p.returncode == 130, out[-2000:]
    m = re.search(r"interrupted after (\d+) of 50000 runs: (\d+) spans; (\d+) acknowledged by \S+, 0 not$", out)
    assert m, out[-2000:]
    runs, ended, acked = map(int, m.groups())
    assert 0 < runs < 50000 and ended == acked > runs
    assert "Traceback" not in out
    sc.flush()
    assert sc.get("/api/v1/spans").json()["spans"] == acked


def test_a_second_version_adds_its_trials_beside_the_first(sidecar_factory):
    # bug (fresh-user trial): trace ids came from --seed alone, so `demo-agent --version 1.1.0` after
    # `demo-agent` replaced every 1.0.0 trial (relyscope_spans_replaced_total) without a word
    want = _expected_spans()
    sc = sidecar_factory()
    for version in ("1.0.0", "1.1.0"):
        r = _run("--endpoint", sc.otlp_grpc, "--version", version)
        assert r.returncode == 0, r.stderr[-2000:]
    sc.flush()
    assert sc.get("/api/v1/spans").json()["spans"] == 2 * want
    groups = {g["version"]: g["trials"] for g in sc.report()["groups"] if g["agent"] == "support-agent"}
    assert groups == {"1.0.0": TASKS * TRIALS, "1.1.0": TASKS * TRIALS}
    # the same version again replaces its own trials (the documented re-run), adds none
    r = _run("--endpoint", sc.otlp_grpc, "--version", "1.1.0")
    assert r.returncode == 0
    sc.flush()
    assert sc.get("/api/v1/spans").json()["spans"] == 2 * want
