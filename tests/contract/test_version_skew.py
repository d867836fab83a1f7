"""Version skew both ways at one major: an old reader ignores fields a newer writer appended, and a
new reader fills the defaults of fields an older writer did not know."""
from __future__ import annotations

from typing import Any

import msgspec
import pytest

from protocol import MAJOR, MESSAGE_TYPES, decode, encode
from protocol.messages import NESTED_TYPES
from tests.contract.samples import RAW_FRAMES, SAMPLES


def _body(name: str) -> list:
    return msgspec.msgpack.decode(encode(SAMPLES[name])[1])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_old_reader_ignores_fields_appended_by_newer_writer(name: str) -> None:
    header = encode(SAMPLES[name])[0]
    newer_minor = bytes((header[0], header[1] + 1, header[2]))
    body = msgspec.msgpack.encode([*_body(name), "a field from 1.1", [1, 2, 3]])
    assert decode([newer_minor, body]) == SAMPLES[name]


@pytest.mark.parametrize("cls", sorted(MESSAGE_TYPES.values(), key=lambda c: c.TAG),
                         ids=lambda c: c.__name__)
def test_new_reader_fills_defaults_for_older_writer(cls: type) -> None:
    name = cls.__name__
    fields = msgspec.structs.fields(cls)
    required = sum(1 for f in fields if f.required)
    old_body = msgspec.msgpack.encode(_body(name)[:required])
    msg = decode([encode(SAMPLES[name])[0], old_body])
    for f in fields[required:]:
        default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        assert getattr(msg, f.name) == default, f"{name}.{f.name} did not get its default"


def test_nested_structs_fill_defaults_too() -> None:
    # An older writer's RequestOutput with only (request_id, new_token_ids).
    body = msgspec.msgpack.encode([0, 1, [["r", [5]]]])
    header = bytes((MAJOR, 0, MESSAGE_TYPES[9].TAG))
    out = decode([header, body]).outputs[0]  # type: ignore[union-attr]
    assert (out.request_id, out.new_token_ids, out.finish_reason, out.num_cached_tokens) == ("r", [5], None, 0)
    assert all(t.__name__ for t in NESTED_TYPES)


def test_raw_trailing_frames_pass_through() -> None:
    frames = encode(SAMPLES["Heartbeat"], b"\x00\x01")
    assert frames[2] == b"\x00\x01" and decode(frames) == SAMPLES["Heartbeat"]



class OldRequestOutput(msgspec.Struct, array_like=True):
    """RequestOutput as a MINOR 2 frontend declares it."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    logprobs: Any = None
    error: str | None = None
    error_kind: str | None = None


class OldOutputs(msgspec.Struct, array_like=True):
    rank: int
    step: int
    outputs: list[OldRequestOutput]
    timestamp: float = 0.0


def test_a_minor_2_reader_reads_outputs_with_packed_logprobs_and_ignores_them() -> None:
    frames = encode(SAMPLES["Outputs"], *RAW_FRAMES["Outputs"])
    old = msgspec.msgpack.decode(frames[1], type=OldOutputs)
    assert [(o.request_id, o.new_token_ids, o.error) for o in old.outputs] == [
        (o.request_id, o.new_token_ids, o.error) for o in SAMPLES["Outputs"].outputs]  # type: ignore[attr-defined]


def test_minor_3_and_minor_4_peers_read_each_others_outputs_and_stats() -> None:
    """1.4 appended RequestOutput.timings and Stats' preemption and iteration-token counters: a 1.3
    frontend reads a 1.4 engine's messages without them, and a 1.4 frontend reads a 1.3 engine's with
    the defaults (no timings, no counts), which it exports as nothing measured."""
    frames = encode(SAMPLES["Outputs"], *RAW_FRAMES["Outputs"])
    old = msgspec.msgpack.decode(frames[1], type=OldOutputs)
    assert [o.request_id for o in old.outputs] == ["req-1", "req-2", "req-3", "req-4", "req-5"]
    body = _body("Outputs")
    for out in body[2]:
        del out[10:]  # as a 1.3 engine writes them: up to packed_prompt_logprobs
    outs = decode([encode(SAMPLES["Outputs"])[0], msgspec.msgpack.encode(body)]).outputs  # type: ignore[union-attr]
    assert [o.timings for o in outs] == [None] * 5
    assert outs[1].stop_reason == 151645
    stats = _body("Stats")[:11]  # up to session_epoch
    got = decode([encode(SAMPLES["Stats"])[0], msgspec.msgpack.encode(stats)])
    assert (got.num_preemptions, got.iteration_tokens, got.iteration_tokens_sum) == (0, [], 0)  # type: ignore[union-attr]


def test_minor_4_and_minor_5_peers_skew_on_pooling() -> None:
    """1.5 appended pooling: a 1.4 engine's Ready reads as a generating engine with no pooling tasks
    (so a 1.5 frontend sends it no pooling request), and a 1.4 reader of a 1.5 GenerateRequest and
    Outputs decodes them without the pooling fields."""
    ready = _body("Ready")[:11]  # up to minor, as a 1.4 engine writes it
    got = decode([encode(SAMPLES["Ready"])[0], msgspec.msgpack.encode(ready)])
    assert (got.runner, got.tasks) == ("generate", [])  # type: ignore[union-attr]
    request = _body("GenerateRequest")
    assert request[8] == ["classify", 8, False, 3]
    old = decode([encode(SAMPLES["GenerateRequest"])[0], msgspec.msgpack.encode(request[:8])])
    assert old.pooling is None  # type: ignore[union-attr]
    body = _body("Outputs")
    for out in body[2]:
        del out[11:]  # as a 1.4 engine writes them: up to timings
    outs = decode([encode(SAMPLES["Outputs"])[0], msgspec.msgpack.encode(body)]).outputs  # type: ignore[union-attr]
    assert [o.pooled for o in outs] == [None] * 5


def test_minor_5_and_minor_6_peers_skew_on_trace_headers() -> None:
    """1.6 appended GenerateRequest.trace_headers: a 1.5 frontend's request reads as untraced, and the
    field is the last one, which a 1.5 engine drops unread (extra trailing fields are ignored)."""
    request = _body("GenerateRequest")
    assert request[-1] == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    old = decode([encode(SAMPLES["GenerateRequest"])[0], msgspec.msgpack.encode(request[:-1])])
    assert old.trace_headers is None  # type: ignore[union-attr]
    assert old.pooling == SAMPLES["GenerateRequest"].pooling  # type: ignore[union-attr]
