"""docs/request-fields.md held to the installed vLLM (no engine started): every field of vLLM's own
ChatCompletionRequest and CompletionRequest is declared by the frontend's structs (so the table, which
tests/unit/frontend/test_request_fields.py holds to those structs, covers it), and the vllm backend
tells a grammar that fails vLLM's compile before its first token as the request's fault."""
from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from protocol import ERROR_INVALID, RequestOutput
from services.frontend.requests.openai_schema import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _fields(cls: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(cls)}


def test_every_field_of_vllms_requests_is_declared() -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion

    assert set(VllmChat.model_fields) - _fields(ChatCompletionRequest) == set()
    assert set(VllmCompletion.model_fields) - _fields(CompletionRequest) == set()


def test_structured_outputs_has_vllms_public_fields() -> None:
    pytest.importorskip("vllm")
    import dataclasses

    from vllm.sampling_params import StructuredOutputsParams

    from services.frontend.requests.openai_schema import StructuredOutputsParams as Ours

    public = {f.name for f in dataclasses.fields(StructuredOutputsParams) if f.init}
    assert public == _fields(Ours)


def _backend(outputs: list[SimpleNamespace]) -> object:
    from services.engine.backends.vllm import VllmBackend

    backend = VllmBackend.__new__(VllmBackend)  # no engine: only the output conversion is exercised
    backend._core = SimpleNamespace(  # type: ignore[attr-defined]
        step=lambda: ({0: SimpleNamespace(outputs=[outputs.pop(0)], timestamp=0.0)}, True),
        post_step=lambda executed: None)
    backend._events = SimpleNamespace(batches=[])  # type: ignore[attr-defined]
    backend._in_flight = {}  # type: ignore[attr-defined]
    backend._hits = backend._queries = backend._preemptions = 0  # type: ignore[attr-defined]
    backend._log_stats = True  # type: ignore[attr-defined]
    return backend


def _output(rid: str, tokens: list[int], finish: int | None) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, new_token_ids=tokens, finish_reason=finish, stop_reason=None,
                           prefill_stats=None, new_logprobs=None, events=None, pooling_output=None)


def test_a_constrained_request_ended_by_an_error_before_its_first_token_is_invalid() -> None:
    pytest.importorskip("vllm")
    from services.engine.backends.vllm import _InFlight

    step: list[SimpleNamespace] = []
    backend = _backend(step)
    backend._in_flight.update(compiled=_InFlight(1, constraint="grammar"),  # type: ignore[attr-defined]
                              failed=_InFlight(1, constraint="grammar"))
    def convert(output: SimpleNamespace) -> RequestOutput:
        step.append(output)
        return backend.step().outputs[0]  # type: ignore[attr-defined, no-any-return]

    failed = convert(_output("failed", [], 3))  # 3: vLLM's FinishReason.ERROR
    assert (failed.finish_reason, failed.error_kind) == ("error", ERROR_INVALID)
    assert failed.error == "sampling.grammar: vLLM's structured output could not compile it"
    # Once a token came, the grammar compiled: a later error is the engine's, not the request's.
    assert convert(_output("compiled", [5], None)).error_kind is None
    later = convert(_output("compiled", [], 3))
    assert (later.finish_reason, later.error_kind, later.error) == ("error", None, None)
    # An unconstrained request's error stays the engine's.
    assert convert(_output("plain", [], 3)).error_kind is None
    assert backend._in_flight == {}  # type: ignore[attr-defined]
