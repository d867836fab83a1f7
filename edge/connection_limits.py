"""The two bounds every HTTP server of the fleet puts on its connections (the frontend's API servers,
the router's listeners), their defaults, and the raw responses that enforce them. Pure: each service's
server adapter applies them to its HTTP server's connections.

- header timeout: a request's headers must be complete this long after its first byte (for a
  connection's first request, after the connection opened). A slowloris client, sending header bytes
  slowly or never finishing them, is answered 408 and closed; an idle keep-alive connection is the
  keep-alive timeout's, and a request's body is not covered (the app reads it, up to its size limit).
- max connections: open connections per server process (per listener in the router). One past it is
  answered 503 and closed as soon as it is accepted, rather than held: clients retry elsewhere or later.
"""
from __future__ import annotations

import json

DEFAULT_HEADER_TIMEOUT_S = 10.0  # headers are a few hundred bytes: only a stalled or hostile client takes longer
DEFAULT_MAX_CONNECTIONS = 4096  # per process; each costs a file descriptor (keep it under `ulimit -n`)

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


def too_many_message(limit: int) -> str:
    return f"this server holds {limit} connections, its limit; retry later or on another replica"
