"""ClickHouse schema, writers and queries (clickhouse-connect; chDB embedded by default)."""

from relyscope.store.clickhouse import Store, StoreUnavailable, open_store, resolve_dsn

__all__ = ["Store", "StoreUnavailable", "open_store", "resolve_dsn"]
