"""The "listening" line of ``relyscope serve`` (what a supervisor or a log reader sees) names the
store so that it can be found and leaks nothing: a relative ``chdb://`` path was printed as
given (useless once read from another directory) and a server DSN with its password (bug)."""

from __future__ import annotations

import os
import subprocess
import json

import httpx

from relyscope.store.clickhouse import display_dsn
from relyscope.testing import RELYSCOPE_BIN, start_sidecar


def test_display_dsn_cases():
    assert display_dsn("chdb://./rel/data") == "chdb://" + os.path.join(os.getcwd(), "rel", "data")
    assert display_dsn("chdb:///abs/data") == "chdb:///abs/data"
    assert display_dsn("chdb://memory") == "chdb://memory"
    assert display_dsn("http://alice:s3cret@ch:8123/db") == "http://ch:8123/db"
    assert display_dsn("https://alice:p/a@ss@ch/db?secure=1") == "https://ch/db?secure=1"  # unescaped / and @
    assert display_dsn("http://ch:8123") == "http://ch:8123"


def test_a_server_dsn_password_is_not_printed(tmp_path):
    # nothing listens on the server port: the sidecar starts anyway (lazy store) and says where
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_STORE": "http://alice:s3cret@127.0.0.1:9/relyscope"})
    try:
        assert sc.listening["store"] == "http://127.0.0.1:9/relyscope"
        health = httpx.get(sc.api + "/healthz", timeout=30).json()
        assert "s3cret" not in json.dumps(health)
    finally:
        sc.kill()
    assert "s3cret" not in sc.log


def test_a_relative_store_is_printed_absolute(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env.update({"RELYSCOPE_OTLP_GRPC": "127.0.0.1:0", "RELYSCOPE_OTLP_HTTP": "127.0.0.1:0",
                "RELYSCOPE_API": "127.0.0.1:0", "RELYSCOPE_SPOOL_DIR": str(tmp_path / "spool")})
    p = subprocess.Popen([str(RELYSCOPE_BIN), "serve", "--log-level", "warning", "--store", "chdb://./rel"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        for _ in range(200):  # bounded: start-up prints little before the line
            line = p.stdout.readline()
            if '"listening"' in line or not line:
                break
        assert json.loads(line)["store"] == f"chdb://{tmp_path / 'rel'}"
    finally:
        p.kill()
        p.wait(timeout=30)


def test_report_from_a_server_store_does_not_print_its_password(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), "report", "--n-boot", "0", "--store",
                        "http://alice:s3cret@127.0.0.1:9/relyscope"], capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 1  # nothing listens there
    assert "127.0.0.1:9" in r.stderr and "s3cret" not in r.stdout + r.stderr, r.stderr
