"""Logprob numbers in our chunks written byte for byte as vLLM writes them: vLLM's chat chunk models
(pydantic's model_dump_json) against LogprobsFormatter's entries over values across the logprob range
(tiny ones written with an `e-7` exponent, the floor, -inf)."""
from __future__ import annotations

import math
import random
import struct

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionLogProbs

from protocol.logprobs import Segment
from services.frontend.model import Model
from services.frontend.text.logprobs_format import LogprobsFormatter
from services.frontend.text.token_strings import token_strings


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def test_logprob_numbers_are_written_as_vllm_writes_them() -> None:
    model = Model.load("tiny", "tiny")
    strings = token_strings(model.tokenizer)
    formatter = LogprobsFormatter(strings, chat=True, top=2)
    rng = random.Random(3)
    values = [-1.1920928955078125e-07, -1e-05, -0.0001, -2.5, -9999.0, -12345.0, -math.inf, -0.0]
    values += [_float32(-(10 ** rng.uniform(-40, 3.9))) for _ in range(600)]
    for i in range(0, len(values) - 2, 3):
        ids = (9707, 1879, 11)  # "Hello", " world", ","
        entry = formatter.sampled(Segment(1, 2, ids, tuple(values[i:i + 3]), (1,)))[0]
        ours = formatter.render([entry])
        floored = [max(v, -9999.0) for v in values[i:i + 3]]  # vLLM floors at -9999.0 before the model
        theirs = ChatCompletionLogProbs.model_validate({"content": [{
            "token": "Hello", "logprob": floored[0], "bytes": list(b"Hello"),
            "top_logprobs": [{"token": " world", "logprob": floored[1], "bytes": list(b" world")},
                             {"token": ",", "logprob": floored[2], "bytes": list(b",")}]}]}).model_dump_json()
        assert ours == theirs, (values[i:i + 3], ours, theirs)
