"""An official SDK client whose HTTP goes to a function instead of a server (httpx2.MockTransport, the
transport the openai and anthropic SDKs take), for unit tests of the router's codecs."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2


def sse_http(serve: Callable[[dict[str, Any]], Iterator[bytes]], raw: list[bytes] | None = None) -> httpx2.Client:
    """Every request's JSON body goes to `serve`, whose byte pieces are the event-stream answer;
    they are also appended to `raw` when given."""
    def handle(request: httpx2.Request) -> httpx2.Response:
        events = list(serve(json.loads(request.content)))
        if raw is not None:
            raw.extend(events)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=iter(events))
    return httpx2.Client(transport=httpx2.MockTransport(handle))


def sse_events(raw: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each `event:` + `data:` pair in a stream the codecs wrote."""
    out = []
    for block in b"".join(raw).decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out
