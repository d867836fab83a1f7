"""A listener as the router process serves it, built once at start from its config: its API keys as
bytes, the entries (public model names) it publishes, and its OpenAPI document, encoded once."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from services.router.config import ListenerConfig, RouterConfig
from services.router.listeners import openapi

_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Listener:
    config: ListenerConfig
    keys: tuple[bytes, ...]
    entries: tuple[str, ...]
    openapi: bytes  # the document /openapi.json answers with

    @property
    def name(self) -> str:
        return self.config.name


def listeners_by_port(config: RouterConfig) -> dict[int, Listener]:
    """Every listener of the config, by the port it serves."""
    by_port = {}
    for listener in config.listeners:
        entries = listener.entries or tuple(config.entries)
        by_port[listener.port] = Listener(listener, tuple(k.encode() for k in listener.api_keys), entries,
                                          _json.encode(openapi.document(listener, entries)))
    return by_port
