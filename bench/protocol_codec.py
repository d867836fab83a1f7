"""Encode/decode cost of the hot messages: a 1,000-token GenerateRequest and a 256-request Outputs.

Side by side in one run: protocol (msgspec structs, positional msgpack) and a plain-msgpack
baseline that builds the same positional arrays by hand (slotted dataclasses, no validation).
Usage: python bench/protocol_codec.py [--repeat 7]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import per_call_us

from protocol import GenerateRequest, Outputs, RequestOutput, SamplingParams, decode, encode


@dataclass(slots=True)
class _PlainOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    logprobs: None = None
    error: str | None = None


def _plain_encode_outputs(rank: int, step: int, outs: list[_PlainOutput], ts: float) -> list[bytes]:
    rows = [(o.request_id, o.new_token_ids, o.finish_reason, o.stop_reason, o.num_cached_tokens,
             o.logprobs, o.error) for o in outs]
    return [b"\x01\x00\x09", msgpack.packb([rank, step, rows, ts])]


def _plain_decode_outputs(frames: list[bytes]) -> list[_PlainOutput]:
    rank, step, rows, ts = msgpack.unpackb(frames[1], use_list=True)
    return [_PlainOutput(*row) for row in rows]


def _plain_encode_request(rid: str, ids: list[int], sampling: tuple, ts: float) -> list[bytes]:  # type: ignore[type-arg]
    return [b"\x01\x00\x05", msgpack.packb([rid, ids, sampling, ts, 0, None, None, None])]


def _plain_decode_request(frames: list[bytes]) -> list:  # type: ignore[type-arg]
    return msgpack.unpackb(frames[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    ids = list(range(100, 1100))
    req = GenerateRequest("req-0001", ids, SamplingParams(max_tokens=256, temperature=0.7, seed=1), time.time())
    outs = [RequestOutput(f"req-{i:04d}", [1000 + i], None, None, 16) for i in range(256)]
    batch = Outputs(0, 1234, outs, time.time())
    req_frames, out_frames = encode(req), encode(batch)
    plain_outs = [_PlainOutput(f"req-{i:04d}", [1000 + i], None, None, 16) for i in range(256)]
    plain_sampling = (256, 0.7, 1.0, 0, 0.0, 1, 0, [], False, None, 0.0, 0.0, 1.0)
    plain_req = _plain_encode_request("req-0001", ids, plain_sampling, 0.0)
    plain_out = _plain_encode_outputs(0, 1234, plain_outs, 0.0)

    rows = [
        ("GenerateRequest 1000 tok", "encode", per_call_us(lambda: encode(req), 2000, args.repeat),
         per_call_us(lambda: _plain_encode_request("req-0001", ids, plain_sampling, 0.0), 2000, args.repeat)),
        ("GenerateRequest 1000 tok", "decode", per_call_us(lambda: decode(req_frames), 2000, args.repeat),
         per_call_us(lambda: _plain_decode_request(plain_req), 2000, args.repeat)),
        ("Outputs 256 requests", "encode", per_call_us(lambda: encode(batch), 500, args.repeat),
         per_call_us(lambda: _plain_encode_outputs(0, 1234, plain_outs, 0.0), 500, args.repeat)),
        ("Outputs 256 requests", "decode", per_call_us(lambda: decode(out_frames), 500, args.repeat),
         per_call_us(lambda: _plain_decode_outputs(plain_out), 500, args.repeat)),
    ]
    print(f"bytes: GenerateRequest {sum(map(len, req_frames))}, Outputs {sum(map(len, out_frames))}")
    print(f"{'message':<26}{'op':<8}{'protocol us':>13}{'plain msgpack us':>18}{'ratio':>8}")
    for name, op, ours, plain in rows:
        print(f"{name:<26}{op:<8}{ours:>13.2f}{plain:>18.2f}{plain / ours:>7.1f}x")
    print(f"(median of {args.repeat} runs; the plain baseline skips type validation)")


if __name__ == "__main__":
    main()
