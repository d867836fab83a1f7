"""The vllm backend's pooling path around a fake EngineCore (no model runs): a wire request becomes the
EngineCoreRequest vLLM's own server makes (PoolingParams verified, a pair's split as vLLM's cross-encoder
scoring passes it), and vLLM's pooled tensor leaves as float32 bytes behind a PackedPooled ref."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from protocol import GenerateRequest, PoolingParams, SamplingParams
from protocol.pooled import to_list
from services.engine.backend import RequestRejected
from tests.support.fake_engine_core import backend_with_fake_core

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    pytest.importorskip("vllm")
    with backend_with_fake_core() as backend:
        yield backend


def pooling(rid: str, task: str = "classify", **params: Any) -> GenerateRequest:
    return GenerateRequest(rid, [1, 2, 3, 4, 5], SamplingParams(max_tokens=1), time.time(), priority=2,
                           cache_salt="s", pooling=PoolingParams(task, **params))


def finished(rid: str, tensor: Any) -> Any:
    from vllm.v1.engine import EngineCoreOutput, FinishReason
    from vllm.v1.metrics.stats import PrefillStats

    o = EngineCoreOutput(rid, [], finish_reason=FinishReason.STOP, pooling_output=tensor)
    o.prefill_stats = PrefillStats(5, 5, 0)
    return o


def test_a_pair_becomes_vllms_cross_encoder_request(backend: Any) -> None:
    backend.add("pair", pooling("pair", token_type_split=3, use_activation=False))
    sent = backend._core.requests["pair"]
    assert sent.sampling_params is None and sent.prompt_token_ids == [1, 2, 3, 4, 5]
    params = sent.pooling_params
    assert (params.task, params.use_activation, params.dimensions) == ("classify", False, None)
    assert params.extra_kwargs == {"compressed_token_type_ids": 3}  # vLLM's scoring io_processor's key
    assert (sent.priority, sent.cache_salt) == (2, "s")
    backend.abort(["pair"])


def test_defaults_are_vllms_and_a_single_text_has_no_token_types(backend: Any) -> None:
    backend.add("one", pooling("one", task="embed"))
    params = backend._core.requests["one"].pooling_params
    assert params.use_activation is True and params.extra_kwargs is None  # the pooler's default, set by verify
    backend.abort(["one"])


def test_dimensions_on_a_model_without_matryoshka_is_refused_with_vllms_reason(backend: Any) -> None:
    with pytest.raises(RequestRejected, match=r"^pooling\.dimensions: Model 'tiny' does not support Matryoshka "
                                              r"embeddings; dimensions must be unset \(received dimensions=8\)\.$"):
        backend.add("d", pooling("d", task="embed", dimensions=8))
    assert "d" not in backend._core.requests and "d" not in backend._in_flight


def test_pooled_tensors_leave_as_float32_bytes_with_their_shape(backend: Any) -> None:
    import torch

    backend.add("vec", pooling("vec"))
    backend.add("rows", pooling("rows", task="token_classify"))
    vec = torch.tensor([0.25, -1.5, 3.0], dtype=torch.float16)  # vLLM's dtype may be the model's
    rows = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    backend._core.script.append([finished("vec", vec), finished("rows", rows)])
    result = backend.step()
    outs = {o.request_id: o for o in result.outputs}
    for rid, expected, shape in (("vec", [0.25, -1.5, 3.0], [3]), ("rows", rows.tolist(), [5, 2])):
        out = outs[rid]
        assert (out.finish_reason, out.new_token_ids, out.pooled.shape) == ("stop", [], shape)
        ref, data = result.pooled[rid]
        assert ref is out.pooled
        assert to_list([bytes(data)], ref) == expected
        assert out.timings is not None  # its finish carries its timings, as a generated request's
    assert backend._in_flight == {}
