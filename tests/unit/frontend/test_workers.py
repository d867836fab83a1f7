"""Long bodies are prepared in worker processes: the same request as on the loop, errors that name
their field, the loop free meanwhile, and a worker that dies answered with a 503, then replaced."""
from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from services.frontend.errors import APIError
from services.frontend.model import Model
from services.frontend.requests.translator import Translator


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("tiny", "tiny")


@pytest.fixture(scope="module")
def translator(model: Model) -> Iterator[Translator]:
    translator = Translator(model, lambda: 10**7, long_prompt_chars=2000, max_concurrent_tokenizations=1)
    yield translator
    translator.close()


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "tiny", **fields}).encode()


async def _with_ticks(work: Any) -> tuple[Any, int]:
    """Await `work` while a task counts how often the loop ran it (every 2 ms)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        return await work, ticks
    finally:
        ticker.cancel()


def test_a_long_chat_is_prepared_in_a_worker_as_on_the_loop(translator: Translator, model: Model) -> None:
    short = Translator(model, lambda: 10**7, long_prompt_chars=10**9, max_concurrent_tokenizations=1)
    messages = [{"role": "user", "content": "naïve words, code {json} 日本語 " * 200}, {"role": "assistant",
                "content": "ok"}, {"role": "user", "content": "more"}]
    body = _body(messages=messages, max_tokens=7, temperature=0.5, stop=["x"])
    far = asyncio.run(translator.chat(body, b"0"))
    near = asyncio.run(short.chat(body, b"0"))
    assert far.request.prompt_token_ids == near.request.prompt_token_ids and len(near.request.prompt_token_ids) > 2000
    assert (far.max_tokens, far.request.sampling, far.request.pinned_rank) == (7, near.request.sampling, 0)
    assert far.output == near.output
    short.close()


def test_a_long_text_completion_and_token_ids_too(translator: Translator, model: Model) -> None:
    text = "hello world " * 1000
    [req] = asyncio.run(translator.completion(_body(prompt=text), None))
    assert req.request.prompt_token_ids == model.encode(text, add_special_tokens=True)
    ids = list(range(1000, 3000))
    [req] = asyncio.run(translator.completion(_body(prompt=ids), None))
    assert req.request.prompt_token_ids == ids


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": [{"role": "user", "content": "x" * 5000}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "x" * 5000}]}, "messages[0].role"),
    ({"prompt": list(range(3000)) + [10**9]}, "prompt"),
    ({"prompt": list(range(3000)) + [2**70]}, "prompt"),
])
def test_a_worker_refusal_comes_back_as_the_same_400(translator: Translator, fields: dict[str, Any],
                                                     param: str) -> None:
    with pytest.raises(APIError) as info:
        translate = translator.chat if "messages" in fields else translator.completion
        asyncio.run(translate(_body(**fields), None))
    assert (info.value.status, info.value.param) == (400, param), info.value.message


def test_long_tokenize_detokenize_and_token_in_bodies_are_worked_in_a_worker_as_on_the_loop(
        translator: Translator, model: Model) -> None:
    short = Translator(model, lambda: 10**7, long_prompt_chars=10**9, max_concurrent_tokenizations=1)
    messages = [{"role": "user", "content": "naïve words, code {json} 日本語 " * 200}]
    ids = model.encode("naïve words " * 1000, add_special_tokens=False)
    try:
        for body in (_body(messages=messages), _body(prompt="naïve words " * 1000, return_token_strs=True)):
            assert len(body) > 2000
            assert asyncio.run(translator.tokenize(body)) == asyncio.run(short.tokenize(body))
        body = _body(tokens=ids)
        assert asyncio.run(translator.detokenize(body)) == asyncio.run(short.detokenize(body))
        body = _body(token_ids=ids, sampling_params={"temperature": 0, "stop": ["x"], "max_tokens": 3})
        far, near = asyncio.run(translator.generate(body, None)), asyncio.run(short.generate(body, None))
        assert far.request.prompt_token_ids == near.request.prompt_token_ids == ids
        assert (far.request.sampling, far.output.stop) == (near.request.sampling, near.output.stop)
        with pytest.raises(APIError) as info:  # a worker's refusal names the field as the loop's does
            asyncio.run(translator.generate(_body(token_ids=[*ids, -5], sampling_params={}), None))
        assert info.value.param == f"token_ids[{len(ids)}]"
    finally:
        short.close()


def test_the_loop_runs_while_a_huge_prompt_is_tokenized(translator: Translator) -> None:
    """2 MB in one message: tokenizers' encode held the GIL for ~2 s in a worker thread."""
    body = _body(messages=[{"role": "user", "content": "naïve words, code {json} and 日本語 " * 60_000}])
    asyncio.run(translator.chat(_body(messages=[{"role": "user", "content": "warm " * 1000}]), None))
    req, ticks = asyncio.run(_with_ticks(translator.chat(body, None)))
    assert req.prompt_len > 500_000
    assert ticks >= 20, f"the loop ran {ticks} times while the prompt was tokenized"


def test_a_worker_that_dies_fails_its_request_with_a_503_and_is_replaced(model: Model) -> None:
    translator = Translator(model, lambda: 10**7, long_prompt_chars=100, max_concurrent_tokenizations=1)
    body = _body(messages=[{"role": "user", "content": "hello " * 100}])

    async def run() -> None:
        await translator.chat(body, None)  # the pool is up
        pool = translator._workers._pool
        assert pool is not None
        pending = asyncio.ensure_future(translator.chat(_body(messages=[{"role": "user",
                                                                         "content": "x " * 2_000_000}]), None))
        async with asyncio.timeout(10):  # until the long prompt is handed to the pool
            while not pool._pending_work_items:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(APIError) as info:
            await pending
        assert info.value.status == 503 and "retry" in info.value.message
        assert (await translator.chat(body, None)).prompt_len > 100  # a fresh pool serves the next one

    try:
        asyncio.run(run())
    finally:
        translator.close()
