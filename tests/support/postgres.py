"""A real PostgreSQL with pgvector for tests (the `pgserver` package): a database per test, and the
server stopped as by a crash and started again on the same socket, so that its DSNs stay valid."""
from __future__ import annotations

import asyncio
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg

with warnings.catch_warnings():
    # pgserver asks platformdirs for a runtime folder as it is imported, which warns where XDG_RUNTIME_DIR is
    # unset (here, and in CI); the folder it falls back on does.
    warnings.simplefilter("ignore")
    import pgserver
    from pgserver._commands import pg_ctl


class Server:
    """One PostgreSQL on a Unix socket under `pgdata`'s parent; cleanup() stops it."""

    def __init__(self, pgdata: Path) -> None:
        self.handle = pgserver.get_server(pgdata, cleanup_mode="stop")
        self.socket_dir = self.handle.get_postmaster_info().socket_dir
        self._databases = 0

    def uri(self, database: str = "postgres") -> str:
        return self.handle.get_uri(database=database)

    def new_database(self) -> str:
        self._databases += 1
        name = f"store_{self._databases}"
        self.psql(f"CREATE DATABASE {name}")
        return self.uri(name)

    def psql(self, sql: str) -> None:
        async def go() -> None:
            conn = await asyncpg.connect(self.uri())
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(go())

    def stop(self) -> None:
        """Stopped at once, as by a crash: connections break, none is closed cleanly."""
        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self.handle.pgdata, user=self.handle.system_user)

    def start(self) -> None:
        pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.handle.log), "start"],
               pgdata=self.handle.pgdata, user=self.handle.system_user)

    def cleanup(self) -> None:
        self.handle.cleanup()


@contextmanager
def running(prefix: str) -> Iterator[Server]:
    """A server in a fresh temporary folder, stopped and the folder removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    server = Server(home / "data")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(home, ignore_errors=True)
