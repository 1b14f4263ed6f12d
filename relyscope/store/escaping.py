"""clickhouse-connect's string escaping for client-side query binding, by ``str.translate``.

Every ``%(name)s`` parameter the store binds (trace ids, trial ids: the scorer's lookups name a
cycle's every new trial and trace, the worker's the traces of each batch) is escaped by
``clickhouse_connect.driver.binding.escape_str``, which builds its result one character at a time
in a generator (~2 µs for a 40-character id: 5-9 % of a scoring cycle's CPU in
``bench/bench_scoring_cycle.py --profile``, 1 024 new trials). Importing this module replaces
it with the same mapping done by ``str.translate`` (one C call), built from the library's own
``must_escape`` characters and backslash, so the output is identical for every string;
:data:`library_escape_str` keeps the library's function, the oracle ``tests/test_store_escaping.py``
compares against.
"""

from __future__ import annotations

from typing import Final

from clickhouse_connect.driver import binding as _binding

__all__ = ["escape_str", "library_escape_str"]

#: clickhouse-connect's own function (kept as the test oracle)
library_escape_str: Final = getattr(_binding, "_relyscope_library_escape_str", _binding.escape_str)
_TABLE: Final = str.maketrans({c: _binding.BS + c for c in _binding.must_escape})


def escape_str(value: str) -> str:
    """``value`` with each of clickhouse-connect's ``must_escape`` characters (backslash, quote,
    backquote, tab, newline) preceded by a backslash, as :data:`library_escape_str` gives it."""
    return value.translate(_TABLE)


_binding._relyscope_library_escape_str = library_escape_str
_binding.escape_str = escape_str  # format_str / format_bind_value look it up at each call
