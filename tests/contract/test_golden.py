"""Golden bytes for every message, checked both ways: encoding the sample gives the committed frames,
and decoding the committed frames gives the sample. Regenerate (after a deliberate, lock-approved
change) with FLEET_REGEN_GOLDEN=1."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol import MESSAGE_TYPES, decode, encode
from tests.contract.samples import SAMPLES

GOLDEN = Path(__file__).with_name("golden")


def _path(name: str) -> Path:
    return GOLDEN / f"{name}.hex"


def test_every_message_type_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(cls.__name__ for cls in MESSAGE_TYPES.values())


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_encoding_matches_golden_bytes(name: str) -> None:
    frames = [bytes(f).hex() for f in encode(SAMPLES[name])]
    text = "\n".join(frames) + "\n"
    if os.environ.get("FLEET_REGEN_GOLDEN"):
        _path(name).write_text(text)
    assert _path(name).read_text() == text, f"{name} encodes differently from its golden bytes"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_bytes_decode_to_sample(name: str) -> None:
    frames = [bytes.fromhex(line) for line in _path(name).read_text().split()]
    assert decode(frames) == SAMPLES[name]
