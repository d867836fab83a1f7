"""Garbage never escapes as IndexError or KeyError: every bad input raises ProtocolError with a message."""
from __future__ import annotations

import random

import msgspec
import pytest

from protocol import MAJOR, MINOR, Hello, ProtocolError, Reject, decode, encode
from tests.contract.samples import SAMPLES


def _raises(frames: list, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(frames)


def test_too_few_frames() -> None:
    _raises([], "header and a body")
    _raises([bytes((MAJOR, MINOR, 1))], "header and a body")


def test_bad_header_length() -> None:
    _raises([b"\x01\x00", b"\x90"], "3 bytes")


def test_unknown_tag() -> None:
    _raises([bytes((MAJOR, MINOR, 200)), b"\x90"], "unknown message tag 200")


def test_unknown_major_names_both_versions() -> None:
    frames = encode(SAMPLES["Stats"])
    _raises([bytes((MAJOR + 1, 3, frames[0][2])), frames[1]], rf"peer speaks {MAJOR + 1}\.3.*{MAJOR}\.{MINOR}")


def test_frozen_messages_decode_across_majors() -> None:
    hello, reject = encode(SAMPLES["Hello"]), encode(Reject("x", "y"))
    assert isinstance(decode([bytes((MAJOR + 1, 0, Hello.TAG)), hello[1]], any_major=True), Hello)
    assert decode([bytes((MAJOR + 5, 0, Reject.TAG)), reject[1]], any_major=True) == Reject("x", "y")


def test_truncated_body() -> None:
    frames = encode(SAMPLES["GenerateRequest"])
    _raises([frames[0], frames[1][:-3]], "GenerateRequest: malformed msgpack body")


def test_too_few_fields_names_the_struct() -> None:
    _raises([encode(SAMPLES["Stats"])[0], msgspec.msgpack.encode([1, 2])], "Stats: Expected `array` of at least length")


def test_wrong_field_type_names_the_position() -> None:
    body = msgspec.msgpack.encode(["not-an-int", 1, "fp", "id"])
    _raises([encode(SAMPLES["Hello"])[0], body], r"Hello: Expected `int`, got `str` - at `\$\[0\]`")


def test_body_not_an_array() -> None:
    _raises([encode(SAMPLES["Abort"])[0], msgspec.msgpack.encode({"request_ids": []})], "Abort: Expected `array`")


def test_random_bytes_only_raise_protocol_error() -> None:
    rng = random.Random(7)
    headers = [encode(s)[0] for s in SAMPLES.values()]
    bodies = [encode(s)[1] for s in SAMPLES.values()]
    for _ in range(3000):
        header = rng.choice(headers)
        body = bytearray(rng.choice(bodies))
        for _ in range(rng.randint(1, 4)):  # flip, cut or splice random bytes
            if body and rng.random() < 0.5:
                body[rng.randrange(len(body))] = rng.randrange(256)
            else:
                body = body[: rng.randrange(len(body) + 1)] + bytes(rng.randrange(256) for _ in range(3))
        try:
            decode([header, bytes(body)])
        except ProtocolError:
            pass
