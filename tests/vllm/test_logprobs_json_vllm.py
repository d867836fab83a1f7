"""Logprobs in our chunks written byte for byte as vLLM writes them: vLLM's chat and completions models
(pydantic's model_dump_json) against LogprobsFormatter's entries over values across the logprob range
(tiny ones written with an `e-7` exponent, the floor, -inf) and odd tokens (quotes, backslashes, control
characters, `%`, characters past ASCII, a special token, a byte-fallback piece), with 0 to 20 alternatives."""
from __future__ import annotations

import math
import random
import struct

import pytest
import transformers
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionLogProbs
from vllm.entrypoints.openai.completion.protocol import CompletionLogProbs
from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

from protocol import PackedLogprobs
from protocol.logprobs import Segment, pack
from services.frontend.generation import output
from services.frontend.http_api.openai_bodies import ChunkWriter
from services.frontend.model import Model
from services.frontend.text.logprobs_format import LogprobsFormatter
from services.frontend.text.token_strings import TokenStrings, token_strings


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
        assert ours == theirs.encode(), (values[i:i + 3], ours, theirs)


# Odd tokens, found by their text in the tiny model's vocabulary: quotes, backslashes, control
# characters, a `%`, characters past ASCII, a special token, and a byte-fallback piece (its text alone
# ends in U+FFFD: vLLM shows "" for it with nothing before it, as we do).
_ODD = ['"', '\\', '\\"', '\n', '\t\t', '%', '%s', ' 日本', 'é', '<|im_end|>', ' {"']


def _odd_ids(strings: TokenStrings) -> list[int]:
    tokenizer = Model.load("tiny", "tiny").tokenizer
    ids = [tokenizer.token_to_id(t) if t.startswith("<|") else tokenizer.encode(t, add_special_tokens=False).ids[0]
           for t in _ODD]
    ids += [t for t in tokenizer.encode("𓀀", add_special_tokens=False).ids if strings.alone(t).endswith("\ufffd")][:1]
    ids += [tokenizer.encode(" world", add_special_tokens=False).ids[0], 0, 151643]
    ids += [tid for tid in range(1000, 1008) if tid not in ids]  # plain ones: 20 distinct alternatives
    assert len(set(ids)) == len(ids) >= 21 and any(strings.alone(t).endswith("\ufffd") for t in ids)
    return ids


def _vllm_string(tokenizer: object, tid: int) -> str:
    """The token string vLLM's LogprobsProcessor gives an id with no tokens before it: the id decoded
    alone, and "" for one that ends inside a character (its correction finds no context)."""
    text = convert_ids_list_to_tokens(tokenizer, [tid])[0]
    return "" if text.endswith("\ufffd") else text


@pytest.mark.parametrize("top", [0, 1, 5, 20])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_odd_tokens_and_values_are_written_as_vllm_writes_them(top: int, chat: bool) -> None:
    """Each row's token (greedy: it is also the most likely, where vLLM's chat list and OpenAI's rank
    order agree) and its alternatives, drawn from odd tokens, with logprobs across the range: the bytes
    of vLLM's own models for the values vLLM's serving code builds, chunk by chunk and joined."""
    model = Model.load("tiny", "tiny")
    strings = token_strings(model.tokenizer)
    hf = transformers.AutoTokenizer.from_pretrained(str(model.path))
    odd = _odd_ids(strings)
    rng = random.Random(top * 2 + chat)
    values = [-math.inf, -12345.0, -9999.0, -1.1920928955078125e-07, -0.0, -1e-05, -2.5]
    formatter = LogprobsFormatter(strings, chat=chat, top=top)
    ours, rows = [], []
    for _ in range(40):
        alts = rng.sample(odd, top)  # a row's k most likely are distinct ids
        own = alts[0] if alts else rng.choice(odd)
        lps = sorted((_float32(rng.choice(values) if rng.random() < 0.4 else -(10 ** rng.uniform(-30, 3.9)))
                      for _ in range(top)), reverse=True)
        own_lp = lps[0] if lps else _float32(-0.5)
        row = Segment(1, top, (own, *alts), (own_lp, *lps), (1,))
        entries = formatter.sampled(row)
        ours.append(entries)
        rows.append((own, [(own, own_lp), *zip(alts, lps, strict=True)]))
    floor = -9999.0
    if chat:
        def content(own: int, cells: list[tuple[int, float]]) -> dict[str, object]:
            token = _vllm_string(hf, own)
            tops = [{"token": (t := _vllm_string(hf, tid)), "logprob": max(lp, floor),
                     "bytes": list(t.encode("utf-8", errors="replace"))} for tid, lp in dict(cells).items()][:top]
            return {"token": token, "logprob": max(dict(cells)[own], floor),
                    "bytes": list(token.encode("utf-8", errors="replace")), "top_logprobs": tops}

        for entries, (own, cells) in zip(ours, rows, strict=True):
            theirs = ChatCompletionLogProbs.model_validate({"content": [content(own, cells)]}).model_dump_json()
            assert formatter.render(entries) == theirs.encode()  # as UTF-8, as the chunk carries it
        whole = ChatCompletionLogProbs.model_validate({"content": [content(o, c) for o, c in rows]})
        assert formatter.render([e for entries in ours for e in entries]) == whole.model_dump_json().encode()
        return
    offset, text_offset, token_logprobs, tokens, tops = 0, [], [], [], []
    for own, cells in rows:
        by_id = dict(cells)  # vLLM's dict per position: the token first, each id once
        token = _vllm_string(hf, own)
        text_offset.append(offset)
        offset += len(token)
        tokens.append(token)
        token_logprobs.append(max(by_id[own], floor))
        tops.append({_vllm_string(hf, tid): max(lp, floor) for i, (tid, lp) in enumerate(by_id.items()) if top >= i})
    theirs = CompletionLogProbs(text_offset=text_offset, token_logprobs=token_logprobs, tokens=tokens,
                                top_logprobs=tops).model_dump_json()
    assert formatter.render([e for entries in ours for e in entries]) == theirs.encode()


@pytest.mark.skipif(output.PlainStep is None, reason="the C plain step is not built here")
def test_the_c_step_writes_chat_logprobs_as_vllm_writes_them() -> None:
    """The streamed chat path's C step (generation/_plainc.c) makes each token's logprobs itself: its
    chunk's logprobs object against vLLM's ChatCompletionLogProbs for the same row, over logprobs across
    the range (the rows it declines, to floor, are the Python step's, checked above)."""
    model = Model.load("tiny", "tiny")
    strings = token_strings(model.tokenizer)
    formatter = LogprobsFormatter(strings, chat=True, top=2)
    ids = (9707, 1879, 11)  # "Hello", " world", ","
    for tid in ids:
        formatter.sampled(Segment(1, 2, (tid, *ids[:2]), (-1.0, -1.0, -1.0), (1,)))  # each id's cells made
    heads, tails, partial = formatter.native_cells()  # type: ignore[misc]
    around = formatter.render_frame()
    assert around is not None
    prefix, mid, suffix = ChunkWriter("chatcmpl-1", "tiny", chat=True).logprobs_frame(*around)
    pieces = output.IncrementalDetokenizer(model.tokenizer, []).byte_stream.pieces  # type: ignore[union-attr]
    step = output.PlainStep(pieces, [math.inf], [0, 0.0], prefix, suffix, heads=heads, tails=tails, partial=partial,
                            top=2, mid=mid)
    step.load(1, 0.0, b"", [])
    rng = random.Random(5)
    values = [-1.1920928955078125e-07, -1e-05, -0.0001, -2.5, -9998.5, -0.0]
    values += [_float32(-(10 ** rng.uniform(-40, 3.99))) for _ in range(600)]
    made = 0
    for i in range(0, len(values) - 2, 3):
        row = [_float32(v) for v in values[i:i + 3]]  # as the engine packs them
        chunk = step.step(ids[0], 1.0 + i, PackedLogprobs(0, 0, 1, 2), [pack(ids, row, [1])])
        if chunk is None:  # declined: a logprob to floor
            assert min(row) <= -9999.0
            continue
        made += 1
        ours = around[0] + chunk.split(mid, 1)[1][:-len(suffix)] + around[1]
        theirs = ChatCompletionLogProbs.model_validate({"content": [{
            "token": "Hello", "logprob": row[0], "bytes": list(b"Hello"),
            "top_logprobs": [{"token": " world", "logprob": row[1], "bytes": list(b" world")},
                             {"token": ",", "logprob": row[2], "bytes": list(b",")}]}]}).model_dump_json()
        assert ours == theirs.encode(), (row, ours, theirs)
    assert made > 150
