"""Every command's --help renders (exit 0) and shows no reStructuredText markup: the docstrings are
written with ``code`` (as the codebase's docstrings are), which the help printed as literal double
backticks, with the docstring's line breaks kept mid-sentence."""

from __future__ import annotations

import os
import subprocess

import pytest

from relyscope.testing import RELYSCOPE_BIN

COMMANDS = [[], ["serve"], ["report"], ["history"], ["score"], ["demo"], ["demo-agent"], ["schema"], ["gate"],
            ["import", "tau-bench"], ["quarantine", "list"], ["quarantine", "replay"], ["shadow", "list"],
            ["shadow", "start"], ["shadow", "show"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "relyscope")
def test_help_renders_without_rst_markup(cmd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), *cmd, "--help"], capture_output=True, text=True, timeout=60,
                       env={**env, "COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    assert "Usage: relyscope" in r.stdout
    assert "``" not in r.stdout, r.stdout
