"""ClickHouse schema, writers and queries (clickhouse-connect; chDB embedded by default)."""

from relyscope.store.clickhouse import Store, StoreUnavailable, chdb_path, open_store, resolve_dsn

__all__ = ["Store", "StoreUnavailable", "open_store", "resolve_dsn", "chdb_path"]
