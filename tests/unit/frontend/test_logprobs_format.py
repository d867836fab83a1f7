"""Logprobs rendering (services/frontend/text/logprobs_format.py, token_strings.py) with the tiny model's tokenizer:
OpenAI's chat and completions shapes from packed segments, token strings decoded alone as vLLM does
(and corrected where a token ends inside a character), return_tokens_as_token_ids, vLLM's
prompt_logprobs."""
from __future__ import annotations

import json
import math
import random

import msgspec
import pytest

from protocol import PackedLogprobs
from protocol.logprobs import Segment, pack, unpack
from services.frontend.model import Model
from services.frontend.text.logprobs_format import LogprobsFormatter
from services.frontend.text.token_strings import TokenStrings, token_strings

HELLO, WORLD, COMMA, BANG = 9707, 1879, 11, 0  # "Hello", " world", ",", "!"
IM_END = 151645


@pytest.fixture(scope="module")
def strings() -> TokenStrings:
    return token_strings(Model.load("tiny", "tiny").tokenizer)


def seg(rows: list[tuple[list[int], list[float], int]]) -> Segment:
    """Rows of (own token + alternatives, their logprobs, own rank)."""
    k = len(rows[0][0]) - 1
    data = pack([t for r in rows for t in r[0]], [x for r in rows for x in r[1]], [r[2] for r in rows])
    return unpack([data], PackedLogprobs(0, 0, len(rows), k))


def f32(x: float) -> float:
    return unpack([pack([0], [x], [1])], PackedLogprobs(0, 0, 1, 0)).logprobs[0]


def test_chat_entries_have_openais_shape_and_the_k_most_likely_in_rank_order(strings: TokenStrings) -> None:
    fmt = LogprobsFormatter(strings, chat=True, top=2)
    entries = fmt.sampled(seg([([WORLD, HELLO, WORLD, COMMA], [-0.7, -0.5, -0.7, -2.0], 2),
                               ([COMMA, COMMA, BANG, HELLO], [-0.1, -0.1, -3.0, -4.0], 1)]))
    content = json.loads(fmt.render(entries))["content"]
    assert content == [
        {"token": " world", "logprob": f32(-0.7), "bytes": list(b" world"), "top_logprobs": [
            {"token": "Hello", "logprob": f32(-0.5), "bytes": list(b"Hello")},
            {"token": " world", "logprob": f32(-0.7), "bytes": list(b" world")}]},
        {"token": ",", "logprob": f32(-0.1), "bytes": [44], "top_logprobs": [
            {"token": ",", "logprob": f32(-0.1), "bytes": [44]},
            {"token": "!", "logprob": f32(-3.0), "bytes": [33]}]}]


def test_top_logprobs_zero_gives_empty_lists_and_minus_inf_is_minus_9999(strings: TokenStrings) -> None:
    fmt = LogprobsFormatter(strings, chat=True, top=0)
    content = json.loads(fmt.render(fmt.sampled(seg([([HELLO, WORLD], [-math.inf, -1.0], 9)]))))["content"]
    assert content == [{"token": "Hello", "logprob": -9999.0, "bytes": list(b"Hello"), "top_logprobs": []}]


def test_completion_rows_are_openais_columns_with_the_token_first_in_its_dict(strings: TokenStrings) -> None:
    fmt = LogprobsFormatter(strings, chat=False, top=2)
    first = fmt.sampled(seg([([HELLO, WORLD, HELLO], [-0.5, -0.25, -0.5], 2)]))
    second = fmt.sampled(seg([([WORLD, COMMA, BANG], [-3.0, -1.0, -2.0], 7)]))  # not in the top 2
    assert json.loads(fmt.render(first)) == {
        "text_offset": [0], "token_logprobs": [-0.5], "tokens": ["Hello"],
        "top_logprobs": [{"Hello": -0.5, " world": -0.25}]}
    body = json.loads(fmt.render(second))  # offsets run on across chunks
    assert body["text_offset"] == [5] and body["tokens"] == [" world"]
    assert list(body["top_logprobs"][0].items()) == [(" world", -3.0), (",", -1.0), ("!", -2.0)]


def test_return_tokens_as_token_ids(strings: TokenStrings) -> None:
    chat = LogprobsFormatter(strings, chat=True, top=1, as_token_ids=True)
    entry = json.loads(chat.render(chat.sampled(seg([([HELLO, WORLD], [-1.0, -0.5], 2)]))))["content"][0]
    assert entry["token"] == f"token_id:{HELLO}" and entry["top_logprobs"][0]["token"] == f"token_id:{WORLD}"
    assert entry["bytes"] == list(b"Hello")  # the token's own bytes (vLLM gives them for the sampled one)
    text = LogprobsFormatter(strings, chat=False, top=1, as_token_ids=True)
    body = json.loads(text.render(text.sampled(seg([([HELLO, WORLD], [-1.0, -0.5], 2)]))))
    assert body["tokens"] == [f"token_id:{HELLO}"] and list(body["top_logprobs"][0]) == [
        f"token_id:{HELLO}", f"token_id:{WORLD}"]


def test_token_strings_are_each_id_decoded_alone_special_tokens_shown(strings: TokenStrings) -> None:
    tokenizer = Model.load("tiny", "tiny").tokenizer
    for tid in [*range(0, 151000, 997), IM_END, 151643]:
        assert strings.alone(tid) == tokenizer.decode([tid], skip_special_tokens=False), tid
    assert strings.alone(IM_END) == "<|im_end|>"


@pytest.mark.parametrize("text", ["𓀀𓀁", " 𝔘𝔫 and 龘", "ꙮ!"])
def test_a_character_split_over_tokens_belongs_to_the_token_that_completes_it(strings: TokenStrings,
                                                                            text: str) -> None:
    """vLLM's correction: a token ending inside a character is "", the one completing it carries it, so
    the strings join to the text."""
    tokenizer = Model.load("tiny", "tiny").tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert any(strings.alone(t).endswith("\ufffd") for t in ids)
    fmt = LogprobsFormatter(strings, chat=True, top=1)
    entries = []
    for tid in ids:  # one token per output, as engines send them; the alternative is the token again
        entries += fmt.sampled(seg([([tid, tid], [-1.0, -1.0], 1)]))
    content = json.loads(fmt.render(entries))["content"]
    assert "".join(e["token"] for e in content) == text
    assert [e["top_logprobs"][0]["token"] for e in content] == [e["token"] for e in content]
    assert b"".join(bytes(e["bytes"]) for e in content) == text.encode()
    columns = LogprobsFormatter(strings, chat=False, top=1)
    rows = [row for tid in ids for row in columns.sampled(seg([([tid, tid], [-1.0, -1.0], 1)]))]
    body = json.loads(columns.render(rows))
    assert body["tokens"] == [e["token"] for e in content]
    assert body["text_offset"] == [len("".join(body["tokens"][:i])) for i in range(len(ids))]


def test_echoed_prompt_entries_start_with_a_null_and_offsets_run_into_the_completion(strings: TokenStrings) -> None:
    fmt = LogprobsFormatter(strings, chat=False, top=1)
    prompt = fmt.prompt([seg([([WORLD, COMMA], [-2.0, -1.0], 3)])], [HELLO, WORLD])
    generated = fmt.sampled(seg([([COMMA, COMMA], [-0.5, -0.5], 1)]))
    body = json.loads(fmt.render(prompt + generated))
    assert body == {"text_offset": [0, 5, 11], "token_logprobs": [None, -2.0, -0.5],
                    "tokens": ["Hello", " world", ","],
                    "top_logprobs": [None, {" world": -2.0, ",": -1.0}, {",": -0.5}]}


def test_prompt_logprobs_are_vllms_dicts_by_token_id(strings: TokenStrings) -> None:
    fmt = LogprobsFormatter(strings, chat=True, top=0)
    rows = [seg([([WORLD, COMMA, WORLD], [-2.0, -1.0, -2.0], 2)]), seg([([COMMA, BANG, HELLO], [-5.0, -1.0, -1.5], 9)])]
    body = json.loads(fmt.prompt_logprobs(rows, 3))
    assert body == [None,
                    {str(WORLD): {"logprob": -2.0, "rank": 2, "decoded_token": " world"},
                     str(COMMA): {"logprob": -1.0, "rank": 1, "decoded_token": ","}},
                    {str(COMMA): {"logprob": -5.0, "rank": 9, "decoded_token": ","},
                     str(BANG): {"logprob": -1.0, "rank": 1, "decoded_token": "!"},
                     str(HELLO): {"logprob": -1.5, "rank": 2, "decoded_token": "Hello"}}]
    assert json.loads(fmt.prompt_logprobs([], 1)) == [None]


# ---- the chat entries' bytes, pinned against a plain encoding of the same answer ----

ODD_TEXTS = ['say "hi" \\ back\\slash', "tab\tnew\nline \x00\x7f", "héllo wörld", "龘 𓀀𓀁 ꙮ!", "🙂🙃 e\u0301"]
ODD_LOGPROBS = [0.0, -0.0, -9999.0, -9999.5, -1e5, -math.inf, math.nan, -5e-05, -1.1920928955078125e-07, -1e-30,
                -0.0001, -123.456, -0.6931471824645996, -1.0]


def plain_chat_entries(strings: TokenStrings, rows: list[tuple[list[int], list[float]]], top: int,
                       as_token_ids: bool = False) -> list[dict[str, object]]:
    """A chat response's `logprobs.content` for these rows (a token and its alternatives, their logprobs), from
    each token's string as vLLM shows it (decoded alone; one that ends inside a character re-read with the
    tokens before it): the oracle of the formatter's pre-rendered fragments, once msgspec encodes it."""
    context: list[int] = []
    content: list[dict[str, object]] = []
    for ids, lps in rows:
        cells = []
        for tid, lp in zip(ids[:top + 1], lps[:top + 1], strict=True):
            text = strings.alone(tid)
            if text.endswith("\ufffd"):
                text = strings.corrected(tid, context)
            cells.append({"token": f"token_id:{tid}" if as_token_ids else text,
                          "logprob": lp if lp > -9999.0 else -9999.0, "bytes": list(text.encode())})
        content.append({**cells[0], "top_logprobs": cells[1:]})
        own = ids[0]
        context = [*context, own][-4:] if strings.alone(own).endswith("\ufffd") else []
    return content


def utf8(rendered: str | bytes) -> bytes:
    return rendered if isinstance(rendered, bytes) else rendered.encode()


@pytest.mark.parametrize("as_token_ids", [False, True])
@pytest.mark.parametrize(("k", "top"), [(5, 5), (5, 2), (3, 0), (20, 20)])
def test_chat_entries_are_byte_for_byte_a_plain_encoding_of_odd_tokens_and_logprobs(k: int, top: int,
                                                                                   as_token_ids: bool) -> None:
    """Non-ASCII, byte-level tokens that end inside a character, quotes, backslashes and control
    characters, special tokens, ids past the vocabulary; logprobs at and below the floor, -inf, NaN, 0.0,
    -0.0 and tiny ones; rows one per output and several per segment; a fresh table (cells made on the
    miss), then the same rows again (cells cached)."""
    tokenizer = Model.load("tiny", "tiny").tokenizer
    strings = TokenStrings(tokenizer)  # its own table, cold
    rnd = random.Random(k * 100 + top)
    text_ids = [t for text in ODD_TEXTS for t in tokenizer.encode(text, add_special_tokens=False).ids]
    assert any(strings.alone(t).endswith("\ufffd") for t in text_ids)
    pool = [*text_ids, IM_END, 151643, strings.vocab_size + 3, HELLO, WORLD, COMMA, BANG]
    rows = []
    for i, own in enumerate(text_ids * 2):
        alternatives = [rnd.choice(pool) for _ in range(k)]
        if k and i % 3 == 0:
            alternatives[i % k] = own  # the token among its alternatives
        rows.append(([own, *alternatives], [f32(ODD_LOGPROBS[(i + j) % len(ODD_LOGPROBS)]) for j in range(k + 1)]))
    expected = plain_chat_entries(strings, rows, top, as_token_ids)
    for _ in range(2):  # cold, then warm
        fmt = LogprobsFormatter(strings, chat=True, top=top, as_token_ids=as_token_ids)
        entries = []
        i = 0
        while i < len(rows):
            n = 1 if i % 5 else 3  # mostly one row per output, some segments of several
            got = fmt.sampled(seg([(ids, lps, 1) for ids, lps in rows[i:i + n]]))
            assert utf8(fmt.render(got)) == msgspec.json.encode({"content": expected[i:i + n]})
            entries += got
            i += n
        assert utf8(fmt.render(entries)) == msgspec.json.encode({"content": expected})
