"""A listener as the router process serves it, built once at start from its config: its API keys (the
shared rule), the entries (public model names) it publishes, and its OpenAPI document, encoded once."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from edge.api_keys import ApiKeys
from services.router.config import ListenerConfig, RouterConfig
from services.router.listeners import openapi
from services.router.listeners.memory_api import memory_in_use

_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Listener:
    config: ListenerConfig
    keys: ApiKeys
    entries: tuple[str, ...]
    openapi: bytes  # the document /openapi.json answers with

    @property
    def name(self) -> str:
        return self.config.name


def listeners_by_port(config: RouterConfig) -> dict[int, Listener]:
    """Every listener of the config, by the port it serves."""
    by_port = {}
    memory = memory_in_use(config)
    for listener in config.listeners:
        # A native System One recipe is never a chat model: an empty allowlist means every chat entry.
        entries = listener.entries or config.chat_entries
        families = {name: family for name in listener.systemone if (family := config.family_of(name))}
        by_port[listener.port] = Listener(listener, ApiKeys(listener.api_keys), entries,
                                          _json.encode(openapi.document(listener, entries, families, memory)))
    return by_port
