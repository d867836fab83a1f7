"""The tiny checkpoint loads in vLLM offline and greedy decoding is varied
enough (many distinct ids, non-ASCII text) to exercise detokenization."""

from __future__ import annotations

from typing import Any

import pytest

# vllm's import trips torch's `reduce_op` FutureWarning, which the project's
# warnings-as-errors setting would turn into a test error.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

MAX_TOKENS = 64


def _greedy(llm: Any, prompts: list[list[int]]) -> list[Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def _prompts(llm: Any) -> list[list[int]]:
    tok = llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello, who are you?"}],
                                   tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")
    return [tok.encode(text, add_special_tokens=False)
            for text in (chat, "The capital of France is", "你好，世界")]


def test_greedy_output_is_varied_with_non_ascii_text(llm: Any) -> None:
    outputs = _greedy(llm, _prompts(llm))
    for out in outputs:
        ids = list(out.token_ids)
        assert len(ids) == MAX_TOKENS and out.finish_reason == "length"
        assert len(set(ids)) >= 16, out.text
        assert all(i < 151643 for i in ids)  # no special tokens
    texts = "".join(out.text for out in outputs)
    # U+FFFD alone would only show a lone byte token; require a real character.
    assert any(ord(c) > 127 and c != "\ufffd" for c in texts), texts
    assert any("\u4e00" <= c <= "\u9fff" for c in texts), texts


def test_greedy_output_is_reproducible(llm: Any) -> None:
    prompts = _prompts(llm)[:1]
    first, second = _greedy(llm, prompts), _greedy(llm, prompts)
    assert list(first[0].token_ids) == list(second[0].token_ids)
