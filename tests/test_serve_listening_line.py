"""The "listening" line of ``relyscope serve`` (what a supervisor or a log reader sees) names the
store so that it can be found and leaks nothing: a relative ``chdb://`` path was printed as
given (useless once read from another directory) and a server DSN with its password (bug)."""

from __future__ import annotations

import os
import subprocess
import json

import httpx

import pytest

from relyscope.store.clickhouse import check_dsn, display_dsn
from relyscope.testing import RELYSCOPE_BIN, start_sidecar


def test_display_dsn_cases():
    assert display_dsn("chdb://./rel/data") == "chdb://" + os.path.join(os.getcwd(), "rel", "data")
    assert display_dsn("chdb:///abs/data") == "chdb:///abs/data"
    assert display_dsn("chdb://memory") == "chdb://memory"
    assert display_dsn("http://alice:s3cret@ch:8123/db") == "http://ch:8123/db"
    assert display_dsn("https://alice:p/a@ss@ch/db?secure=1") == "https://ch/db?secure=1"  # unescaped / and @
    assert display_dsn("http://ch:8123") == "http://ch:8123"
    # a secret in the query is masked, other parameters kept; a fragment is dropped; no scheme at all
    # (nothing tells a secret from the rest) is not shown
    assert display_dsn("http://ch:8123/db?user=u&password=s3cret&secure=1") == \
        "http://ch:8123/db?user=u&password=***&secure=1"
    assert display_dsn("http://ch/db?access_token=s3cret") == "http://ch/db?access_token=***"
    assert display_dsn("http://u:p@ch/db#s3cret") == "http://ch/db"
    assert display_dsn("HTTP://u:s3cret@ch/db") == "http://ch/db"
    assert "s3cret" not in display_dsn("s3cret")


@pytest.mark.parametrize("dsn, why", [
    ("clickhouse://alice:s3cret@ch/db", "unrecognised store DSN clickhouse://ch/db"),
    ("s3cret", "unrecognised store DSN"),
    # an unescaped / ? # ends the URL's host inside the password: the driver then quoted a piece of
    # it ("Port could not be cast to integer value as 's3'")
    ("http://alice:s3/cret@ch:8123/db", "percent-encode"),
    ("http://alice:s3#cret@ch:8123/db", "percent-encode"),
    ("https://alice:s3?cret@ch/db", "percent-encode"),
    ("http://alice:s3cret@ch:99999/db", "port"),
    ("http://alice:s3cret@:8123/db", "no host"),
    # clickhouse-connect passes a query password twice ("multiple values for argument 'password'")
    ("http://ch:8123/db?user=alice&password=s3cret", "not as ?password="),
])
def test_check_dsn_refuses_without_quoting_the_secret(dsn, why):
    with pytest.raises(ValueError) as e:
        check_dsn(dsn)
    assert why in str(e.value)
    assert "s3" not in str(e.value) and "cret" not in str(e.value)


def test_check_dsn_accepts_what_opens():
    assert check_dsn("HTTP://alice:s3%2Fcret@ch:8123/db") == "http://alice:s3%2Fcret@ch:8123/db"
    assert check_dsn("chdb://./x") == "chdb://./x"
    assert check_dsn("https://ch/db?secure=true") == "https://ch/db?secure=true"


@pytest.mark.parametrize("cmd", [["report", "--n-boot", "0"], ["quarantine", "list"]])
@pytest.mark.parametrize("dsn", ["clickhouse://alice:s3cret@ch/db", "http://alice:s3/cret@127.0.0.1:9/db",
                                 "http://alice:s3cret@127.0.0.1:99999/db"])
def test_cli_refuses_a_bad_store_dsn_without_its_password(tmp_path, cmd, dsn):
    # quarantine list printed a pydantic traceback with the whole DSN as input_value; report the
    # whole DSN in its "invalid configuration" line, or the driver's error with a piece of it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    r = subprocess.run([str(RELYSCOPE_BIN), *cmd, "--store", dsn], capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "invalid configuration" in out and "Traceback" not in out, out
    assert "s3" not in out and "cret" not in out, out


def test_a_secret_setting_is_not_echoed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env["RELYSCOPE_REDACT_KEY"] = "s3cretshort"  # under the 16 characters it must have
    r = subprocess.run([str(RELYSCOPE_BIN), "report", "--n-boot", "0"], capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "RELYSCOPE_REDACT_KEY (value not shown)" in r.stderr, r.stderr
    assert "s3cret" not in r.stdout + r.stderr


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
