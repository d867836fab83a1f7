"""One public request on its way through the router process: the listener and codec it came by, its
body as the client sent it and as upstream's chat, the decision engine's choice, and its response head."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.types import Send

from services.router.backends.fair_queue import Ticket
from services.router.config import ListenerConfig
from services.router.decision.engine import Choice
from services.router.listeners.codecs.codec import Codec
from services.router.listeners.usage import Usage
from services.router.plugins.answer import Recorder


@dataclass(slots=True)
class Call:
    """One public request on its way through the router."""
    listener: ListenerConfig
    codec: Codec  # of the API the client called
    request: dict[str, Any]  # the body as the client sent it
    chat: dict[str, Any]  # as a chat or completions body (what goes upstream, but for the model and `bulk`)
    choice: Choice
    status: int = 0  # of the response started to the client
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # x-router-* for the client
    escalation: dict[str, Any] | None = None  # which escalate stage answered, told in non-streamed bodies
    bulk: bytes = b""  # the upstream body's bulk (messages, prompt), left out of `chat` and encoded, if split
    recorder: Recorder | None = None  # the answer recorded as it goes out, for response hooks (None: none asked)
    ticket: Ticket | None = None  # its tenant and priority class: how it waits in a full pool's queue
    usage: Usage | None = None  # the answer's usage read as it goes out, for a token limit (None: none applies)

    async def start(self, send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        await send({"type": "http.response.start", "status": status, "headers": headers + self.headers})

    # ---- the answer as it goes out, to what reads it: the plugins' recorder, the rate limits' usage ----

    def seen_body(self, raw: bytes) -> None:
        """A passed-through JSON body."""
        if self.recorder is not None:
            self.recorder.body(raw)
        if self.usage is not None:
            self.usage.body(raw)

    def seen_raw(self, data: bytes) -> None:
        """Passed-through SSE bytes."""
        if self.recorder is not None:
            self.recorder.raw(data)
        if self.usage is not None:
            self.usage.raw(data)

    def seen_chunk(self, chunk: dict[str, Any]) -> None:
        """One decoded upstream chunk of a translated stream."""
        if self.recorder is not None:
            self.recorder.chunk(chunk)
        if self.usage is not None:
            self.usage.chunk(chunk)

    def seen_whole(self, completion: dict[str, Any]) -> None:
        """A whole chat or text completion."""
        if self.recorder is not None:
            self.recorder.whole(completion)
        if self.usage is not None:
            self.usage.whole(completion)

    def seen_end(self, done: bool = True) -> None:
        """The answer ended: `done` false when upstream broke off."""
        if self.recorder is not None:
            self.recorder.end(done)
