"""A data directory the embedded store cannot make is an error that says so, not a traceback:
``report --store chdb:///etc/passwd`` raised FileExistsError, ``score F --keep-store /proc/x``
FileNotFoundError (breaker trial)."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import DATA
from relyscope.testing import RELYSCOPE_BIN

SPANS = str(DATA / "spans" / "google-adk-tool-call.otlp.json")


@pytest.mark.parametrize("args, path", [(["report", "--store", "chdb:///etc/passwd"], "/etc/passwd"),
                                        (["score", SPANS, "--keep-store", "/proc/x"], "/proc/x")])
def test_an_unusable_data_directory_is_named(tmp_path, args, path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**env, "COLUMNS": "300"})
    assert r.returncode == 2, r.stderr
    assert f"cannot use {path} as the embedded store's data directory" in r.stderr and "Traceback" not in r.stderr
