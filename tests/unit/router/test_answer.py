from __future__ import annotations

import json
from typing import Any

import pytest

from services.router.listeners.codecs.openai import as_chunks
from services.router.plugins.answer import MAX_ANSWER_BYTES, Recorder

CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m",
    "system_fingerprint": "fp-1",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Paris is the capital.",
                                 "reasoning_content": "The user asks about France."},
         "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "weather", "arguments": '{"q": 1}'}}]},
         "finish_reason": "tool_calls"},
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
}
TEXT = {
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "m",
    "choices": [{"index": 0, "text": "once upon a time", "finish_reason": "length"},
                {"index": 1, "text": "there was", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10},
}


def _sse(chunks: list[dict[str, Any]], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def _stream_of(completion: dict[str, Any], chat: bool) -> list[dict[str, Any]]:
    """The chunks upstream streams for `completion`: n>1 choices interleaved, tool call arguments in
    pieces, the fingerprint on every chunk (as vLLM sends it)."""
    chunks = _interleaved(_split_arguments(as_chunks(completion, chat=chat, include_usage=True)))
    if "system_fingerprint" in completion:
        chunks = [{**c, "system_fingerprint": completion["system_fingerprint"]} for c in chunks]
    return chunks


def _interleaved(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """as_chunks sends choice 0 whole, then choice 1: a real n>1 stream interleaves them."""
    by_choice: dict[int, list[dict[str, Any]]] = {}
    tail = []
    for chunk in chunks:
        if chunk["choices"]:
            by_choice.setdefault(chunk["choices"][0]["index"], []).append(chunk)
        else:
            tail.append(chunk)
    out = []
    while any(by_choice.values()):
        for queue in by_choice.values():
            if queue:
                out.append(queue.pop(0))
    return out + tail


def _split_arguments(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tool call's arguments in two-character deltas, as a parser streams them; later deltas carry
    only the call's index, not its id or name."""
    out = []
    for chunk in chunks:
        calls = chunk["choices"][0].get("delta", {}).get("tool_calls") if chunk["choices"] else None
        if not calls:
            out.append(chunk)
            continue
        call = calls[0]
        arguments = call["function"]["arguments"]
        first = {**call, "function": {"name": call["function"]["name"], "arguments": arguments[:2]}}
        out.append({**chunk, "choices": [{**chunk["choices"][0], "delta": {"tool_calls": [first]}}]})
        for i in range(2, len(arguments), 2):
            piece = {"index": call["index"], "function": {"arguments": arguments[i:i + 2]}}
            out.append({**chunk, "choices": [{**chunk["choices"][0], "delta": {"tool_calls": [piece]}}]})
    return out


@pytest.mark.parametrize("completion", [CHAT, TEXT], ids=["chat", "completions"])
def test_passed_through_stream_assembles_to_the_whole_answer(completion: dict[str, Any]) -> None:
    chat = completion is CHAT
    body = _sse(_stream_of(completion, chat))
    recorder = Recorder(chat=chat)
    for i in range(0, len(body), 7):  # events cut anywhere, as the network delivers them
        recorder.raw(body[i:i + 7])
    recorder.end()
    answer = recorder.answer()
    assert answer is not None and answer.streamed and answer.complete
    assert answer.completion == completion
    assert answer.finish_reasons() == tuple(c["finish_reason"] for c in completion["choices"])


@pytest.mark.parametrize("completion", [CHAT, TEXT], ids=["chat", "completions"])
def test_adapted_stream_assembles_to_the_whole_answer(completion: dict[str, Any]) -> None:
    """The relay decodes each chunk itself (Responses, Messages) and reports the [DONE] it read."""
    chat = completion is CHAT
    recorder = Recorder(chat=chat)
    for chunk in _stream_of(completion, chat):
        recorder.chunk(chunk)
    recorder.end(True)
    answer = recorder.answer()
    assert answer is not None and answer.streamed
    assert answer.completion == completion


def test_reasoning_under_its_newer_name_and_no_usage() -> None:
    recorder = Recorder(chat=True)
    recorder.raw(_sse([
        {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                                 "reasoning": "think"}}]},
        {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "ok"},
                                                            "finish_reason": "stop"}]}]))
    recorder.end()
    answer = recorder.answer()
    assert answer is not None
    assert answer.completion["choices"] == [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "ok", "reasoning_content": "think"}}]
    assert "usage" not in answer.completion


def test_a_whole_body_is_kept_as_it_is() -> None:
    recorder = Recorder(chat=True)
    recorder.body(json.dumps(CHAT).encode())
    answer = recorder.answer()
    assert answer is not None and not answer.streamed and answer.completion == CHAT


@pytest.mark.parametrize("feed", [
    lambda r: r.raw(_sse([{"choices": [{"index": 0, "delta": {"content": "hi"}}]},
                          {"error": {"message": "engine died", "code": 502}}])),
    lambda r: r.raw(_sse([{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}],
                         done=False)),
    lambda r: r.raw(b"data: {not json\n\ndata: [DONE]\n\n"),
    lambda r: r.raw(b"data: [1, 2]\n\ndata: [DONE]\n\n"),
    lambda r: r.raw(_sse([{"choices": ["not a choice"]}])),
    lambda r: r.body(b"{not json"),
    lambda r: r.body(b"[]"),
], ids=["error-chunk", "no-done", "bad-json", "not-an-object", "bad-choice", "bad-body", "body-not-object"])
def test_anything_but_one_complete_answer_is_none(feed: Any) -> None:
    recorder = Recorder(chat=True)
    feed(recorder)
    recorder.end()
    assert recorder.answer() is None


def test_an_adapted_stream_that_broke_off_is_none() -> None:
    recorder = Recorder(chat=True)
    recorder.chunk({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
    recorder.end(False)
    assert recorder.answer() is None
    error = Recorder(chat=True)
    error.chunk({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    error.chunk({"error": {"message": "upstream failed"}})
    error.end(True)
    assert error.answer() is None


def test_a_stream_past_the_size_bound_is_not_kept() -> None:
    recorder = Recorder(chat=True)
    piece = _sse([{"choices": [{"index": 0, "delta": {"content": "x" * 65536}}]}], done=False)
    for _ in range(MAX_ANSWER_BYTES // len(piece) + 1):
        recorder.raw(piece)
    recorder.raw(_sse([{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]))
    recorder.end()
    assert recorder.answer() is None


@pytest.mark.parametrize("delta", [lambda text: {"content": text}, lambda text: {"reasoning_content": text},
                                   lambda text: {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}],
                         ids=["content", "reasoning", "tool-arguments"])
def test_an_adapted_stream_past_the_size_bound_is_not_kept(delta: Any) -> None:
    """Decoded chunks (a Responses or Messages stream) are bounded too, by the text they add."""
    recorder = Recorder(chat=True)
    text = "x" * 65536
    for _ in range(MAX_ANSWER_BYTES // len(text)):
        recorder.chunk({"choices": [{"index": 0, "delta": delta(text)}]})
    within = Recorder(chat=True)
    within.chunk({"choices": [{"index": 0, "delta": delta(text), "finish_reason": "stop"}]})
    within.end(True)
    assert within.answer() is not None
    recorder.chunk({"choices": [{"index": 0, "delta": delta("y"), "finish_reason": "stop"}]})
    recorder.end(True)
    assert recorder.answer() is None
