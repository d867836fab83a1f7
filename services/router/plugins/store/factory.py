"""The store a router config asks for (router process, at start): SQLite in a file, or PostgreSQL by DSN.
It is built here and opened by the caller (`await store.open()`), where a failure can be reported."""
from __future__ import annotations

from services.router.config.plugins import STORE_BACKENDS, StoreConfig
from services.router.plugins.store.base import Store


def open_store(config: StoreConfig) -> Store:
    """The store of `config.backend`, not yet opened. The backends' modules are imported only when chosen:
    a SQLite router never loads asyncpg, a PostgreSQL one never loads apsw."""
    if config.backend == "sqlite":
        from services.router.plugins.store.sqlite import SqliteStore

        return SqliteStore(config.path, config.timeout_s)
    if config.backend == "postgres":
        if not config.dsn:
            raise ValueError("store.dsn: required with backend postgres (a libpq URI)")
        from services.router.plugins.store.postgres import PostgresStore

        return PostgresStore(config.dsn, config.timeout_s)
    raise ValueError(f"store.backend: {config.backend!r} is not one of {', '.join(STORE_BACKENDS)}")
