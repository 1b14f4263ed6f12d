"""ClickHouse schema, writers and queries (clickhouse-connect; chDB embedded by default)."""

from relyscope.store.clickhouse import Store, chdb_path, open_store, resolve_dsn
from relyscope.store.errors import StoreError, StoreRejected, StoreUnavailable

__all__ = ["Store", "StoreError", "StoreUnavailable", "StoreRejected", "open_store", "resolve_dsn", "chdb_path"]
