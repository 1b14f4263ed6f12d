"""``relyscope score`` decodes its input as the sidecar does: ``RELYSCOPE_INGEST_DECODER`` selects
the hot path (``fast``, the default: :mod:`relyscope.collector.fastpath`) or its oracle
(``legacy``), and both give the same report on recorded input from shared/data: the 200 τ-bench
runs (exported to OTLP/JSON by ``relyscope import tau-bench --out``), whose pass^k must also match
the published figures, plus the spans recorded from real emitters (shared/data/spans)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, DATA, TAU_FILE

# Published τ-bench leaderboard figures for gpt-4o airline (shared/data/README.md)
PUBLISHED = {"pass^1": 0.420, "pass^2": 0.2733, "pass^3": 0.220, "pass^4": 0.200}
SPAN_FILES = sorted(str(p) for p in (DATA / "spans").glob("*.otlp.json"))


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env.update(kw)
    return env


@pytest.fixture(scope="module")
def tau_jsonl(tmp_path_factory):
    out = tmp_path_factory.mktemp("tau") / "tau.otlp.jsonl"
    r = subprocess.run([str(BIN), "import", "tau-bench", str(TAU_FILE), "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr
    return out


def _score(files, decoder: str | None) -> dict:
    env = _env(**({"RELYSCOPE_INGEST_DECODER": decoder} if decoder else {}))
    r = subprocess.run([str(BIN), "score", "--format", "json", "--n-boot", "50", *map(str, files)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_fast_and_legacy_decoders_give_the_same_report(tau_jsonl):
    files = [tau_jsonl, *SPAN_FILES]
    fast, legacy = _score(files, "fast"), _score(files, "legacy")
    assert fast == legacy
    (tau,) = [g for g in fast["groups"] if g["run_kind"] == "offline"]
    assert tau["tasks"] == 50 and tau["trials"] == 200
    for k, v in PUBLISHED.items():
        assert tau["metrics"][k]["value"] == pytest.approx(v, abs=5e-4), k
    assert len(fast["groups"]) > 1  # the emitters' spans are scored too (incomplete trials)


_SPY = """
import sys
from relyscope.collector import fastpath
real, calls = fastpath.prepare, []
def spy(res, *a, **k):
    calls.append(len(res.spans))
    return real(res, *a, **k)
fastpath.prepare = spy
from relyscope.cli.main import app
try:
    app(sys.argv[1:], prog_name="relyscope")
except SystemExit as e:
    sys.stderr.write(f"\\nPREPARED {sum(calls)}\\n")
    raise
"""


@pytest.mark.parametrize("decoder,spans", [(None, 3), ("fast", 3), ("legacy", 0)])
def test_score_takes_the_sidecars_decoder_setting(decoder, spans):
    # vercel-ai-sdk: 2 spans, openlit: 1 span → 3 spans through the hot path unless legacy is set
    files = [str(DATA / "spans" / "vercel-ai-sdk-v7-genai-semconv.otlp.json"),
             str(DATA / "spans" / "openlit-openai-chat.otlp.json")]
    env = _env(**({"RELYSCOPE_INGEST_DECODER": decoder} if decoder else {}))
    r = subprocess.run([sys.executable, "-c", _SPY, "score", "--format", "json", "--n-boot", "0", *files],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert f"PREPARED {spans}\n" in r.stderr, r.stderr[-2000:]


def test_a_bad_decoder_setting_is_refused_naming_it():
    r = subprocess.run([str(BIN), "score", "--n-boot", "0", SPAN_FILES[0]], capture_output=True, text=True,
                       timeout=120, env=_env(RELYSCOPE_INGEST_DECODER="quick"))
    assert r.returncode == 2, r.stdout
    assert "RELYSCOPE_INGEST_DECODER='quick'" in " ".join(r.stderr.split())
