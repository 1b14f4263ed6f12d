"""What an embedded store says when it cannot open: the message names the real cause. Each case
in a fresh process (chDB opens one data directory per process)."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = r"""
import shutil, sys
from relyscope.store import Store, StoreUnavailable
case, a, b = sys.argv[1:4]
if case == "second-path":  # this process already holds another directory
    held = Store(f"chdb://{a}/data")  # kept: a dropped Store closes
elif case == "damaged":  # a copy made by a tool that follows symlinks (metadata/<db> is a link)
    Store(f"chdb://{a}/data").close()
    shutil.copytree(a, b)
try:
    Store(f"chdb://{b}/data")
    print("OPENED")
except StoreUnavailable as e:
    print(e)
"""


def _open(case, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    out = subprocess.run([sys.executable, "-c", _PROBE, case, str(a), str(b)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_a_second_directory_in_one_process_names_the_one_held_not_another_process(tmp_path):
    msg = _open("second-path", tmp_path)
    assert "in use by another process" not in msg, msg
    held = os.path.realpath(tmp_path / "a" / "data")  # as the engine names it (symlinks resolved)
    assert f"this process already opened the chDB data directory {held}" in msg, msg


def test_a_damaged_directory_is_not_reported_as_in_use(tmp_path):
    msg = _open("damaged", tmp_path)
    assert "in use" not in msg and msg.startswith(f"cannot open store chdb://{tmp_path / 'b' / 'data'}: "), msg
