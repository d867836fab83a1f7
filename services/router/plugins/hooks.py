"""The hooks a plugin has (router process): the request hook, after the decision and before dispatch
(it may add to the upstream request, or answer it whole: the execution hook's way to skip the call), and
the response hook, once the answer has gone to the client, streamed or not. `Exchange` is one request
as every plugin sees it; `Plugin` is the port each plugin implements."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from services.router.plugins.answer import Answer


class PluginRefusal(Exception):
    """A plugin that fails closed: the request is answered with `status` (503: its store or its model
    did not answer) and this message, and never dispatched."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Exchange:
    """One generation request at the hooks."""
    api: str  # the public API it came by: chat, completions, responses, messages
    chat_api: bool  # upstream is asked for a chat completion (else a text completion: no messages)
    entry: str  # the entry (public model name) and decision that routed it
    decision: str
    request: dict[str, Any]  # the body as the client sent it (read only)
    chat: dict[str, Any]  # the upstream body (but for the model): request hooks may add messages
    tenant: str  # who is asking: a digest of the API key ("-" on a listener without keys)
    user: str | None  # the end user within the tenant: the body's `user`, else the x-router-user header
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # added to the response's head
    notes: dict[str, Any] = field(default_factory=dict)  # what a request hook leaves for its response hook

    @property
    def owner(self) -> str:
        """The isolation unit: the tenant, and within it the user where one is named."""
        return self.tenant if self.user is None else f"{self.tenant}/{self.user}"


class Plugin(Protocol):
    name: str  # its type, as the config and the metrics name it

    async def request(self, exchange: Exchange) -> dict[str, Any] | None:
        """None to go on (having perhaps added to `exchange.chat`); a whole completion (chat.completion or
        text_completion object) to answer with it instead of calling upstream. PluginRefusal to refuse.
        Bounded by its config's `timeout_s`: past it the plugin is skipped (or refuses, if it fails closed)."""

    async def response(self, exchange: Exchange, answer: Answer | None, *, answered_by: str | None) -> None:
        """After the answer went out: None when there was no complete answer (an error, a break, the
        client left). `answered_by`: the plugin whose request hook answered (a cache hit), else None.
        Runs in the background: the client is not kept waiting for it."""
