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


def test_quarantine_list_of_a_spool_that_is_not_there(tmp_path):
    """A mistyped --spool-dir was listed as 'quarantine … is empty', exit 0: it looked healthy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), "quarantine", "list", "--spool-dir", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**env, "COLUMNS": "300"})
    assert r.returncode == 2 and "no spool at" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("cmd", [["shadow", "list"], ["gate", "--baseline", "1", "--candidate", "2"]])
def test_an_unknown_format_is_refused(tmp_path, cmd):
    """--format yaml printed the table, exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), *cmd, "--format", "yaml", "--api", "127.0.0.1:9"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env={**env, "COLUMNS": "300"})
    assert r.returncode == 2 and "table or json, not 'yaml'" in r.stderr, r.stderr
