"""HTTPError, the error response the router process answers with: raised by the listeners and by the
backends (a pool's 429, 503 or 502), framed in the client's API shape by the app (app.py)."""
from __future__ import annotations


class HTTPError(Exception):
    """An error response: its status, and what the API's error body says (`param`). OpenAI-shaped bodies
    carry the status as their integer `code`, as vLLM's and the fleet's frontend do."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers or []
        self.counted = False  # in router_requests_total already
