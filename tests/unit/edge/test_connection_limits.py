"""The raw answers that end a connection (edge/connection_limits.py): whole HTTP/1.1 responses, read
back by h11 as a client reads them, with the OpenAI-shaped error body both services answer with; and the
body clock (when the app stops waiting for a request's body), on a fake clock."""
from __future__ import annotations

import json

import h11
import pytest

from edge.connection_limits import MIN_BODY_RATE, BodyClock, header_timeout_message, refusal, too_many_message


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


def test_a_body_that_stops_arriving_has_a_gap_deadline() -> None:
    clock = BodyClock(10.0, now=100.0)
    assert clock.deadline() == 110.0  # the first bytes within the timeout
    clock.received(5000, now=104.0)
    assert clock.deadline() == 114.0  # then no gap longer than it
    assert clock.message() == "the request's body stopped arriving: no bytes came for 10 s"
    clock.received(0, now=109.0)  # an empty message is no progress
    assert clock.deadline() == 114.0


def test_a_body_trickled_a_byte_at_a_time_is_cut_off_by_the_rate_floor() -> None:
    clock = BodyClock(10.0, now=0.0)
    now = 0.0
    while now + 5.0 < clock.deadline():  # a byte every 5 s: never a gap as long as the timeout
        now += 5.0
        clock.received(1, now)
    assert now < 20.0 and clock.deadline() < now + 10.0
    assert clock.message() == ("the request's body arrived too slowly: 2 bytes, under "
                               f"{MIN_BODY_RATE} bytes a second after its first 10 s")


def test_a_large_body_on_a_slow_link_is_not_cut() -> None:
    """32 MB at a steady 2 KB/s: hours, and every step well inside its deadline."""
    clock = BodyClock(10.0, now=0.0)
    for second in range(1, (32 << 20) // 2048 + 1):
        assert clock.deadline() > second
        clock.received(2048, float(second))


def test_time_the_reader_looked_away_is_credited() -> None:
    clock = BodyClock(1.0, now=0.0)
    clock.credit(3.0)
    assert clock.deadline() == 4.0
