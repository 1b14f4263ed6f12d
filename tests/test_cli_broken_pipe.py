"""A client command whose reader goes away mid-output exits 141 (128 + SIGPIPE), not 1: click
answers EPIPE with exit 1, which is `relyscope gate`'s "block" — `gate … | head -3` on a PASS
exited as if the candidate were blocked. ``schema`` prints ~14 KB: more than one write, so the
closed pipe is hit whatever the buffering. Rich's console answers EPIPE on its own (its
``on_broken_pipe`` exits 1, beside click's handler): every table a command prints through it —
``gate``'s verdict, ``report``, ``score`` — exited 1 that way; ``score`` of a recorded file stands
for them (offline, no sidecar)."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import DATA
from relyscope.testing import RELYSCOPE_BIN


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}


@pytest.mark.parametrize("args", [["schema"], ["score", str(DATA / "spans" / "google-adk-tool-call.otlp.json")]],
                         ids=["print", "rich-table"])
def test_a_closed_pipe_is_141_not_1(tmp_path, args):
    p = subprocess.Popen([str(RELYSCOPE_BIN), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env(), cwd=tmp_path)
    p.stdout.close()  # the reader is gone before the first write
    _, err = p.communicate(timeout=120)
    assert p.returncode == 141, (p.returncode, err)
    assert b"Traceback" not in err


def test_a_command_exit_1_stays_1(tmp_path):
    # nothing listens on port 9: the report exits 1 by itself, with its pipe open
    r = subprocess.run([str(RELYSCOPE_BIN), "report", "--api", "127.0.0.1:9"], capture_output=True, env=_env(),
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stderr
