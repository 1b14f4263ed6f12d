"""The store's libraries without pandas.

clickhouse-connect resolves pandas on every insert (``isinstance(data, pandas.DataFrame)``), and
pyarrow on its first ``pa.array`` (is the input a pandas object?): each imported pandas on the
first insert, +46 MiB of the process's RSS (29 anon, 18 of library pages; same-run pairs, a fresh
process), for a library the store never uses (rows go as lists, spans as one Arrow block, reads as
rows). Importing this module resolves clickhouse-connect's pandas as "not installed", a
configuration it supports (pandas is its optional extra); :func:`pyarrow` gives pyarrow with its
one pandas check (it asks once per process) already answered "missing". Neither applies when the
process imported pandas itself before.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys

from clickhouse_connect.driver import options as _cc_options

__all__ = ["pyarrow"]

if "pandas" not in sys.modules:
    _cc_options.pd = None
    _cc_options.pd_time_test = None


class _HidePandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 - the finder protocol
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas hidden from pyarrow's first array (relyscope.store)")
        return None


@functools.cache
def pyarrow():
    """pyarrow, imported on first use (span inserts only). Unless pandas is already loaded, its
    first ``pa.array`` runs with pandas hidden from the import system (a meta-path finder removed
    right after): pandas stays importable by everything else, but this process's pyarrow has no
    ``to_pandas``, which relyscope never calls. A thread importing pandas during that one call
    would get ImportError; none of relyscope's threads does."""
    import pyarrow as pa

    if "pandas" not in sys.modules:
        hide = _HidePandas()
        sys.meta_path.insert(0, hide)
        try:
            pa.array([0])  # pyarrow's pandas check runs (and fails) here, once
        finally:
            sys.meta_path.remove(hide)
    return pa
