"""Asking for a list of windows where one is wanted names the mistake: ``report --window 1h,5m``
(and ``GET /api/v1/report?window=1h,5m``) answered "too many values to unpack (expected 1)", the
text of a Python unpacking error, because each caller unpacked ``parse_windows`` itself."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from relyscope.config import Settings
from relyscope.exporter.api import window_refusal
from relyscope.scoring.windows import parse_window
from relyscope.testing import RELYSCOPE_BIN


@pytest.mark.parametrize("spec, expected", [("1h", ("1h", 3600.0)), (" 90s ", ("90s", 90.0)),
                                            ("all", ("all", None)), ("2d", ("2d", 172800.0))])
def test_one_window(spec, expected):
    assert parse_window(spec) == expected


@pytest.mark.parametrize("spec, says", [("1h,5m", "one window is wanted, got 2 (1h, 5m)"),
                                        ("0m", "bad window '0m'"), ("", "empty window")])
def test_not_one_window(spec, says):
    with pytest.raises(ValueError) as e:
        parse_window(spec)
    assert says in str(e.value)


def test_api_refusal_names_the_list():
    scoring = SimpleNamespace(computed_windows=["5m", "1h"], windows=[("5m", 300.0), ("1h", 3600.0)])
    why = window_refusal(Settings(), scoring, "1h,5m")
    assert "one window is wanted" in why and "unpack" not in why


def test_report_cli_refuses_a_list(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), "report", "--window", "1h,5m"], capture_output=True, text=True,
                       timeout=120, env={**env, "COLUMNS": "200"}, cwd=tmp_path)
    assert r.returncode == 2 and "--window: one window is wanted, got 2 (1h, 5m)" in r.stderr, r.stderr


HUGE = "9" * 320 + "s"  # its length in seconds is past a float's range


@pytest.mark.parametrize("spec, ok", [("36500d", True), ("36501d", False), (HUGE, False)])
def test_windows_longer_than_a_century_are_refused(spec, ok):
    """A 320-digit window raised OverflowError (int too large to convert to float): a 500 from
    ``/api/v1/report?window=`` and ``/api/v1/gate?since=``, a traceback from ``report --window``,
    ``gate --since`` and ``serve`` with ``RELYSCOPE_SCORE_WINDOWS``."""
    if ok:
        assert parse_window(spec) == (spec, 100 * 365 * 86400.0)
        return
    with pytest.raises(ValueError) as e:
        parse_window(spec)
    assert "longer than 100 years" in str(e.value) and "use 'all'" in str(e.value)
    assert len(str(e.value)) < 200


def test_api_refuses_a_huge_window_and_since():
    from relyscope.shadow.gating import parse_since

    scoring = SimpleNamespace(computed_windows=["5m", "1h"], windows=[("5m", 300.0), ("1h", 3600.0)])
    assert "longer than 100 years" in window_refusal(Settings(), scoring, HUGE)
    with pytest.raises(ValueError) as e:
        parse_since(HUGE)
    assert "at most 100 years" in str(e.value)


@pytest.mark.parametrize("args", [["report", "--window", HUGE], ["gate", "--baseline", "1", "--candidate", "2",
                                                                 "--since", HUGE]])
def test_cli_says_so_without_a_traceback(tmp_path, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), *args, "--api", "127.0.0.1:9"], capture_output=True, text=True,
                       timeout=120, env={**env, "COLUMNS": "200"}, cwd=tmp_path)
    assert r.returncode == 2 and "100 years" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_refuses_a_huge_configured_window(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), "serve"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**env, "COLUMNS": "200", "RELYSCOPE_SCORE_WINDOWS": f"5m,{HUGE}"})
    assert r.returncode == 2 and "100 years" in r.stderr and "Traceback" not in r.stderr, r.stderr
