"""The README's instrumentation example runs as written against a live sidecar."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_instrumentation_example_produces_a_trial(sidecar):
    text = README.read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "agent_run" in b)
    code = block.replace("http://localhost:4317", sidecar.otlp_grpc)
    code += "\nfrom opentelemetry import trace\ntrace.get_tracer_provider().shutdown()\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 20
    trials = []
    while time.monotonic() < deadline and not trials:
        trials = sidecar.trials(agent="support")
        time.sleep(0.3)
    assert len(trials) == 1
    t = trials[0]
    assert t["task_id"] == "refund-42" and t["agent_version"] == "1.4.2"
    assert t["outcome"] == "success" and t["confidence"] == 0.8
    assert t["actions"] == ["llm", "decision:confirm", "issue_refund"]
    assert t["input_tokens"] == 812 and t["output_tokens"] == 64
