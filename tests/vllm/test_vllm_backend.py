"""The vllm backend in-process around a fake EngineCore that replays scripted outputs (vLLM's own output
structs; no model runs): what each request's outputs carry, and that a finished or aborted request
leaves nothing behind in the backend."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from protocol import ERROR_INVALID, RequestOutput
from tests.support.fake_engine_core import backend_with_fake_core, output, request

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    pytest.importorskip("vllm")
    with backend_with_fake_core() as backend:
        yield backend


def _step(backend: Any, *outputs: Any) -> dict[str, RequestOutput]:
    backend._core.script.append(list(outputs))
    return {out.request_id: out for out in backend.step().outputs}


def test_finished_and_aborted_requests_leave_nothing_behind(backend: Any) -> None:
    queries = backend.load().prefix_cache_queries
    backend.add("plain", request("plain"))
    backend.add("logprobs", request("logprobs", logprobs=2))
    backend.add("aborted", request("aborted", logprobs=1))
    first = _step(backend, output("plain", [7], first=True), output("logprobs", [8], first=True, logprobs=2),
                  output("aborted", [9], first=True, logprobs=1))
    assert backend.load().prefix_cache_queries == queries + 12  # each one's prompt, counted once
    assert all(out.num_cached_tokens == 1 for out in first.values())
    assert all(out.timings is not None and out.timings.decode_time == 0 for out in first.values())
    assert first["logprobs"].packed_logprobs is not None and first["plain"].packed_logprobs is None
    backend.abort(["aborted"])
    last = _step(backend, output("plain", [10], finish=1), output("logprobs", [11], finish=0, logprobs=2))
    assert last["plain"].finish_reason == "length" and last["logprobs"].finish_reason == "stop"
    assert last["plain"].timings is not None and last["logprobs"].packed_logprobs is not None
    assert backend._in_flight == {} and not backend.has_work()


def test_a_constrained_request_failing_before_its_first_token_is_its_own_fault(backend: Any) -> None:
    backend.add("json", request("json", json_object=True))
    backend.add("json-ok", request("json-ok", json_object=True))
    out = _step(backend, output("json", [], finish=3), output("json-ok", [5], first=True))
    assert out["json"].finish_reason == "error" and out["json"].error_kind == ERROR_INVALID
    assert out["json"].error == "sampling.json_object: vLLM's structured output could not compile it"
    # After its first token an error is the engine's, not the grammar's.
    late = _step(backend, output("json-ok", [], finish=3))["json-ok"]
    assert late.finish_reason == "error" and late.error is None
    assert backend._in_flight == {}


def test_an_output_for_a_request_not_in_flight_passes_through(backend: Any) -> None:
    """vLLM may still report a request this backend already dropped (aborted while the step ran)."""
    out = _step(backend, output("gone", [3], first=True), output("gone2", [4], finish=0))
    assert out["gone"].new_token_ids == [3] and out["gone"].timings is None
    assert out["gone2"].finish_reason == "stop" and out["gone2"].timings is None
    assert backend._in_flight == {}
