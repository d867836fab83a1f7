from __future__ import annotations

import pytest

from services.router.backends.sse import SSEData


def _all(chunks: list[bytes]) -> list[bytes]:
    reader = SSEData()
    events = [e for chunk in chunks for e in reader.feed(chunk)]
    return events + reader.finish()


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_any_line_ending(newline: bytes) -> None:
    body = newline.join([b"data: {\"a\": 1}", b"", b"data: [DONE]", b"", b""])
    assert _all([body]) == [b'{"a": 1}', b"[DONE]"]


def test_split_anywhere_including_between_cr_and_lf() -> None:
    body = b"data: one\r\n\r\ndata: two\r\n\r\n"
    for cut in range(1, len(body)):
        assert _all([body[:cut], body[cut:]]) == [b"one", b"two"], cut
    assert _all([bytes([b]) for b in body]) == [b"one", b"two"]


def test_multi_line_data_comments_and_other_fields() -> None:
    body = b": keep-alive\nevent: message\nid: 7\ndata: first\ndata:second\nretry: 10\n\n"
    assert _all([body]) == [b"first\nsecond"]


def test_a_last_event_without_its_blank_line_still_counts() -> None:
    assert _all([b"data: a\n\ndata: [DONE]"]) == [b"a", b"[DONE]"]
    assert _all([b"data: a\n\ndata: [DONE]\n"]) == [b"a", b"[DONE]"]
    assert _all([b""]) == []
