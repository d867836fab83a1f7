"""Golden bytes for every message, checked both ways: encoding the sample (with its raw frames, where it
has them) gives the committed frames, and decoding the committed frames gives the sample and its packed
logprobs. Regenerate (after a deliberate, lock-approved change) with FLEET_REGEN_GOLDEN=1."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol import MESSAGE_TYPES, Outputs, decode, encode
from protocol.logprobs import unpack
from tests.contract.samples import RAW_FRAMES, SAMPLES

GOLDEN = Path(__file__).with_name("golden")


def _path(name: str) -> Path:
    return GOLDEN / f"{name}.hex"


def test_every_message_type_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(cls.__name__ for cls in MESSAGE_TYPES.values())


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_encoding_matches_golden_bytes(name: str) -> None:
    frames = [bytes(f).hex() for f in encode(SAMPLES[name], *RAW_FRAMES.get(name, ()))]
    text = "\n".join(frames) + "\n"
    if os.environ.get("FLEET_REGEN_GOLDEN"):
        _path(name).write_text(text)
    assert _path(name).read_text() == text, f"{name} encodes differently from its golden bytes"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_bytes_decode_to_sample(name: str) -> None:
    frames = [bytes.fromhex(line) for line in _path(name).read_text().split()]
    assert decode(frames) == SAMPLES[name]


def test_golden_raw_frames_hold_the_packed_logprobs() -> None:
    frames = [bytes.fromhex(line) for line in _path("Outputs").read_text().split()]
    msg = decode(frames)
    assert isinstance(msg, Outputs)
    out = msg.outputs[3]
    assert out.packed_logprobs is not None and out.packed_prompt_logprobs is not None
    sampled = unpack(frames[2:], out.packed_logprobs)
    assert (list(sampled.token_ids), list(sampled.ranks)) == ([11, 11, 12], [1])
    assert list(sampled.logprobs) == [-0.25, -0.25, -1.5]
    prompt = unpack(frames[2:], out.packed_prompt_logprobs)
    assert (prompt.positions, prompt.width, list(prompt.token_ids), list(prompt.ranks)) == (2, 2, [5, 7, 6, 6], [4, 1])
    assert list(prompt.logprobs) == [-3.0, -0.5, -0.125, -0.125]
