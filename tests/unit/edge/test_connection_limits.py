"""The raw answers that end a connection (edge/connection_limits.py): whole HTTP/1.1 responses, read
back by h11 as a client reads them, with the OpenAI-shaped error body both services answer with."""
from __future__ import annotations

import json

import h11
import pytest

from edge.connection_limits import header_timeout_message, refusal, too_many_message


@pytest.mark.parametrize(("status", "message", "kind"), [
    (408, header_timeout_message(2.5), "invalid_request_error"),
    (503, too_many_message(64), "service_unavailable_error"),
])
def test_a_refusal_is_a_whole_response_that_closes_the_connection(status: int, message: str, kind: str) -> None:
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    client.receive_data(refusal(status, message))
    response = client.next_event()
    assert isinstance(response, h11.Response) and response.status_code == status
    assert (b"connection", b"close") in response.headers
    data = client.next_event()
    assert isinstance(data, h11.Data) and isinstance(client.next_event(), h11.EndOfMessage)
    assert json.loads(data.data) == {"error": {"message": message, "type": kind, "param": None, "code": status}}
