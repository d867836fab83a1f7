"""A router process with a semantic cache over a SQLite file, in front of the counting test backend, for
the cache's integration tests (tests/integration/test_router_cache.py, tests/vllm): its clients (the
openai and anthropic SDKs), the backend's call count, the entries stored and the outcome metric."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import anthropic
import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from services.router.plugins.semantic_cache import KIND
from services.router.plugins.store.sqlite import SqliteStore
from tests.support.procs import HttpProc, free_port_block, start_backend, start_router

KEY_A, KEY_B = "key-a", "key-b"  # a config's listener must accept both
REPLY = "Open Settings, then Security, then Reset password."


class Fleet:
    """The backend and one router over a SQLite file; restart() starts the router again on that file."""

    def __init__(self, tmp: Path, config: str, ready_s: float = 300.0) -> None:
        """`config`: router YAML in which BACKEND is the backend's URL and DB the SQLite file."""
        self.tmp = tmp
        self.db = tmp / "cache.db"
        self.ready_s = ready_s
        self.backend = start_backend(tmp, "up")
        self.backend.configure(reply=REPLY)
        self.config = config.replace("BACKEND", self.backend.url).replace("DB", str(self.db))
        self.port = free_port_block(1, spread=0)
        self._clients: dict[tuple[str, str], openai.OpenAI | anthropic.Anthropic] = {}
        self.router = self._start()

    def _start(self) -> HttpProc:
        router = start_router(self.tmp, self.config, port=self.port)
        try:
            router.wait_ready(headers={"authorization": f"Bearer {KEY_A}"}, timeout_s=self.ready_s)
        except BaseException:
            router.stop()
            raise
        return router

    def restart(self) -> None:
        self._close_clients()  # their pooled connections were to the router that stops
        assert self.router.stop() == 0, self.router.log()
        self.router = self._start()

    def stop(self) -> None:
        self._close_clients()
        self.router.stop()
        self.backend.stop()

    def _close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def calls(self) -> int:
        return int(self.backend.stats()["requests"])

    def stored(self) -> int:
        """Entries in the cache, read from the router's SQLite file through the store itself."""
        async def count() -> int:
            store = SqliteStore(str(self.db), 5.0)
            await store.open()
            try:
                return await store.count(KIND)
            finally:
                await store.close()
        return asyncio.run(count())

    def wait_stored(self, n: int, timeout_s: float = 10.0) -> None:
        """Until the cache holds `n` entries: the response hook stores after the answer went out."""
        deadline = time.monotonic() + timeout_s
        while (count := self.stored()) < n:
            assert time.monotonic() < deadline, f"{count} entries stored, not {n}, within {timeout_s}s"
            time.sleep(0.02)
        assert count == n, f"{count} entries stored, expected {n}"

    def outcome(self, outcome: str, entry: str = "assistant") -> float:
        text = httpx.get(self.router.url + "/metrics", headers={"authorization": f"Bearer {KEY_A}"}).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "router_plugin_outcomes_total" and sample.labels == {
                        "entry": entry, "plugin": "semantic_cache", "outcome": outcome}:
                    return float(sample.value)
        return 0.0

    def openai(self, key: str = KEY_A) -> openai.OpenAI:
        """The openai SDK with `key`, one per key (closed when the router stops)."""
        client = self._clients.get(("openai", key))
        if client is None:
            client = self._clients["openai", key] = openai.OpenAI(base_url=self.router.url + "/v1", api_key=key,
                                                                  max_retries=0, timeout=60)
        assert isinstance(client, openai.OpenAI)
        return client

    def anthropic(self, key: str = KEY_A) -> anthropic.Anthropic:
        client = self._clients.get(("anthropic", key))
        if client is None:
            client = self._clients["anthropic", key] = anthropic.Anthropic(base_url=self.router.url, api_key=key,
                                                                           max_retries=0, timeout=60)
        assert isinstance(client, anthropic.Anthropic)
        return client
