"""Where the client commands (``report``, ``history``, ``shadow …``, ``gate``) find a running
sidecar's management API: ``--api``, else the environment variable ``RELYSCOPE_API`` — the very
setting ``relyscope serve`` binds, so one exported variable serves both — else :data:`DEFAULT_API`."""

from __future__ import annotations

from typing import Optional
from urllib.parse import urlsplit

import typer

__all__ = ["API_ENV", "DEFAULT_API", "api_option", "api_url", "otlp_endpoint"]

DEFAULT_API = "http://127.0.0.1:9464"
API_ENV = "RELYSCOPE_API"

# the hosts `serve` may bind to that accept connections on every interface: a client connects to
# loopback there (0.0.0.0 and an empty host are what parse_hostport takes as "every IPv4 address")
_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}


def api_url(value: Optional[str]) -> Optional[str]:
    """The URL of a management API from a URL (``http://host:9464``, kept as given) or from the
    ``HOST:PORT`` that ``serve`` binds (``127.0.0.1:9464``, ``0.0.0.0:9464``, ``[::]:9464``,
    ``:9464``): ``http://`` added, a bind-all host replaced by loopback. None stays None (the
    command's default applies). A typer ``callback``; raises ``typer.BadParameter`` for a value
    that is neither."""
    if value is None:
        return None
    v = value.strip()
    if "://" in v:
        return _http_url(v, value, "http(s)://HOST:PORT or HOST:PORT")
    host, sep, port = v.rpartition(":")
    if not sep or not port.isdigit() or "/" in v:
        raise typer.BadParameter(f"expected HOST:PORT (as RELYSCOPE_API of `relyscope serve`) or a URL, "
                                 f"got {value!r}")
    host = host.strip("[]")
    host = _LOOPBACK.get(host, f"[{host}]" if ":" in host else host)
    return f"http://{host}:{port}"


def otlp_endpoint(value: Optional[str]) -> Optional[str]:
    """An OTLP endpoint option's value: an http(s) URL with a host, or ``HOST:PORT`` (``http://``
    added: the gRPC exporter takes a bare ``host:port`` for TLS). None stays None. A typer
    ``callback``; raises ``typer.BadParameter`` saying what is expected."""
    if value is None:
        return None
    v = value.strip()
    return _http_url(v if "://" in v else "http://" + v, value, "an OTLP endpoint such as http://127.0.0.1:4317")


def _http_url(v: str, given: str, expected: str) -> str:
    """``v`` if it is an http(s) URL with a host and a valid port, else ``typer.BadParameter``
    saying what was ``expected`` instead of ``given`` (urlsplit's own ValueError for
    'http://[::1' — Invalid IPv6 URL — or a port past 65535 included)."""
    try:
        u = urlsplit(v)
        u.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as e:
        raise typer.BadParameter(f"expected {expected}, got {given!r} ({e})") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise typer.BadParameter(f"expected {expected}, got {given!r}")
    return v


def api_option(default: Optional[str] = None) -> typer.models.OptionInfo:
    """The ``--api`` option of a client command (environment ``RELYSCOPE_API``)."""
    return typer.Option(default, "--api", envvar=API_ENV, callback=api_url,
                        help=f"the sidecar's management API: a URL or its HOST:PORT (default {DEFAULT_API})")
