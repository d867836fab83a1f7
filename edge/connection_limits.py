"""The two bounds every HTTP server of the fleet puts on its connections (the frontend's API servers,
the router's listeners), their defaults, and the raw responses that enforce them. Pure: each service's
server adapter applies them to its HTTP server's connections.

- header timeout: a request's headers must be complete this long after its first byte (for a
  connection's first request, after the connection opened). A slowloris client, sending header bytes
  slowly or never finishing them, is answered 408 and closed; an idle keep-alive connection is the
  keep-alive timeout's. A request's body, read by the app, has the same wait as a gap (BodyClock).
- max connections: open connections per server process (per listener in the router). One past it is
  answered 503 and closed as soon as it is accepted, rather than held: clients retry elsewhere or later.
"""
from __future__ import annotations

import json

DEFAULT_HEADER_TIMEOUT_S = 10.0  # headers are a few hundred bytes: only a stalled or hostile client takes longer
DEFAULT_MAX_CONNECTIONS = 4096  # per process; each costs a file descriptor (keep it under `ulimit -n`)
MIN_BODY_RATE = 500  # bytes a second a body averages at least, after its first header-timeout (Apache's MinRate)

_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}
_TYPES = {408: "invalid_request_error", 503: "service_unavailable_error"}


def refusal(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response that ends the connection, with the OpenAI-shaped error body both
    services answer with: {"error": {"message", "type", "param", "code"}}."""
    body = json.dumps({"error": {"message": message, "type": _TYPES[status], "param": None, "code": status}}).encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def header_timeout_message(timeout_s: float) -> str:
    return f"the request's headers were not complete within {timeout_s:g} s of its first byte"


class BodyClock:
    """When the app stops waiting for the rest of a request's body (the header timeout `timeout_s` again,
    as a gap): no bytes for `timeout_s`, or, past a first `timeout_s`, under MIN_BODY_RATE bytes a second
    on average. A gap alone would let a client that sends a byte every few seconds (R-U-Dead-Yet) hold a
    connection for as many gaps as its content-length has bytes; the rate floor ends it, and any real
    link (4 kbit/s) clears it. Times are the caller's clock (the event loop's)."""

    __slots__ = ("_last", "_received", "_start", "timeout_s")

    def __init__(self, timeout_s: float, now: float) -> None:
        self.timeout_s = timeout_s
        self._start = self._last = now
        self._received = 0

    def received(self, size: int, now: float) -> None:
        if size:
            self._received += size
            self._last = now

    def credit(self, seconds: float) -> None:
        """Time the reader itself looked away (its event loop stalled): not the client's."""
        self._start += seconds
        self._last += seconds

    def _rate_deadline(self) -> float:
        return self._start + self.timeout_s + self._received / MIN_BODY_RATE

    def deadline(self) -> float:
        return min(self._last + self.timeout_s, self._rate_deadline())

    def message(self) -> str:
        """Which bound ended the read, and its value."""
        if self._last + self.timeout_s <= self._rate_deadline():
            return f"the request's body stopped arriving: no bytes came for {self.timeout_s:g} s"
        return (f"the request's body arrived too slowly: {self._received} bytes, under {MIN_BODY_RATE} bytes a "
                f"second after its first {self.timeout_s:g} s")


def too_many_message(limit: int) -> str:
    return f"this server holds {limit} connections, its limit; retry later or on another replica"
