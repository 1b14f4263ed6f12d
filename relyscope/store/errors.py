"""Store errors: retryable and permanent are different types (style.md lesson 13).

- :class:`StoreUnavailable` — *retryable*: the store could not be reached, or it refused the write
  for a reason that passes (ClickHouse insert timeout, ``TOO_MANY_PARTS``, ``MEMORY_LIMIT_EXCEEDED``,
  a replica in read-only mode, a network error, …) — or for a reason relyscope does not recognise.
  Retry later, with backoff; never drop the data.
- :class:`StoreRejected` — *permanent*: the data itself can never be stored as it is (ClickHouse
  answered with a data error code such as ``CANNOT_PARSE_TEXT`` / ``TYPE_MISMATCH`` /
  ``VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE``, or the client could not serialize the rows). Retrying the
  same rows cannot succeed; the pipeline quarantines the record after a bounded retry.

:func:`classify` maps an exception raised by ``clickhouse-connect`` (or by serializing rows for
it) to one of the two. The ClickHouse error code is parsed from the ``Code: N.`` prefix that
ClickHouse puts in every exception message (the server's HTTP reply and chDB both carry it;
codes from ClickHouse ``src/Common/ErrorCodes.cpp``). Unknown codes are retryable: data is only
declared unstorable when the code says so.
"""

from __future__ import annotations

import re
import struct

__all__ = ["StoreError", "StoreUnavailable", "StoreRejected", "classify", "error_code",
           "PERMANENT_CODES", "TRANSIENT_CODES"]


class StoreError(Exception):
    """Base of store errors. ``code``: the ClickHouse error code when one was given, else None."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class StoreUnavailable(StoreError):
    """Retryable: the store could not be reached or refused the write for a passing reason."""


class StoreRejected(StoreError):
    """Permanent: the store can never hold these rows as they are (a data error)."""


#: ClickHouse error codes that mean "this data cannot be stored" (ErrorCodes.cpp names).
PERMANENT_CODES: dict[int, str] = {
    6: "CANNOT_PARSE_TEXT", 26: "CANNOT_PARSE_QUOTED_STRING", 27: "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
    38: "CANNOT_PARSE_DATE", 41: "CANNOT_PARSE_DATETIME", 43: "ILLEGAL_TYPE_OF_ARGUMENT",
    53: "TYPE_MISMATCH", 69: "ARGUMENT_OUT_OF_BOUND", 70: "CANNOT_CONVERT_TYPE",
    72: "CANNOT_PARSE_NUMBER", 117: "INCORRECT_DATA", 128: "TOO_LARGE_ARRAY_SIZE",
    131: "TOO_LARGE_STRING_SIZE", 190: "SIZES_OF_ARRAYS_DONT_MATCH",
    321: "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE", 349: "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN",
    407: "DECIMAL_OVERFLOW",
}
#: Codes known to pass (load, limits, replication, network). Any code not in PERMANENT_CODES is
#: treated as retryable too; these are named so logs and tests can say what happened.
TRANSIENT_CODES: dict[int, str] = {
    159: "TIMEOUT_EXCEEDED", 160: "TOO_SLOW", 164: "READONLY", 202: "TOO_MANY_SIMULTANEOUS_QUERIES",
    203: "NO_FREE_CONNECTION", 209: "SOCKET_TIMEOUT", 210: "NETWORK_ERROR", 236: "ABORTED",
    241: "MEMORY_LIMIT_EXCEEDED", 242: "TABLE_IS_READ_ONLY", 243: "NOT_ENOUGH_SPACE",
    252: "TOO_MANY_PARTS", 279: "ALL_CONNECTION_TRIES_FAILED", 319: "UNKNOWN_STATUS_OF_INSERT",
    394: "QUERY_WAS_CANCELLED", 425: "SYSTEM_ERROR", 999: "KEEPER_EXCEPTION",
}
_CODE = re.compile(r"Code: (\d+)\.")


def error_code(e: BaseException) -> int | None:
    """The ClickHouse error code in an exception's message (``Code: 241.``), or None."""
    m = _CODE.search(str(e))
    return int(m.group(1)) if m else None


def classify(e: BaseException, what: str) -> StoreError:
    """The store error for an exception raised while writing ``what`` (e.g. ``"insert into
    otel_traces"``): :class:`StoreRejected` for a ClickHouse data error code or a client-side
    serialization error of the rows (``clickhouse_connect`` ``DataError``, or ``ValueError`` /
    ``TypeError`` / ``AttributeError`` / ``OverflowError`` / ``struct.error`` raised while
    converting them), else :class:`StoreUnavailable`. Never raises."""
    if isinstance(e, StoreError):
        return e
    code = error_code(e)
    if code is not None:
        name = PERMANENT_CODES.get(code) or TRANSIENT_CODES.get(code) or "code"
        cls = StoreRejected if code in PERMANENT_CODES else StoreUnavailable
        return cls(f"{what} failed ({name} {code}): {e}", code)
    try:
        from clickhouse_connect.driver.exceptions import DataError, OperationalError
    except ImportError:  # pragma: no cover - the store always has clickhouse-connect
        DataError = OperationalError = ()  # type: ignore[assignment]
    if isinstance(e, OperationalError):  # connection refused, reset, timed out
        return StoreUnavailable(f"{what} failed: {e}")
    if isinstance(e, (DataError, ValueError, TypeError, AttributeError, OverflowError, struct.error)):
        return StoreRejected(f"{what} failed: rows cannot be serialized: {type(e).__name__}: {e}")
    return StoreUnavailable(f"{what} failed: {e}")
