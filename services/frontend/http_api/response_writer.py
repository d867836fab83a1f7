"""Drives one generation response from output processing to the ASGI send: a JSON body once the request
finishes, or SSE events with every event queued since the last wake-up joined into one body send;
chat and text completions, and the token-out answers of /inference/v1/generate.
Runs on each API server's event loop."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Message, Send

from services.frontend.engine_client.inflight import EngineFailure, Wakeup
from services.frontend.errors import error_body
from services.frontend.generation.direct_stream import DirectStream
from services.frontend.generation.output import OutputProcessor, Piece, usage_body
from services.frontend.http_api import openai_bodies
from services.frontend.http_api.asgi import send_json
from services.frontend.http_api.direct_stream import HttpCycle, HttpOutlet
from services.frontend.http_api.response_start import start_response
from services.frontend.text.logprobs_format import Entry

SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _rank_header(outputs: OutputProcessor) -> tuple[bytes, bytes]:
    return b"x-data-parallel-rank", str(outputs.stream.rank).encode()


class _Collected:
    """One choice's whole answer, gathered until it finished."""

    __slots__ = ("entries", "finish", "parts", "reasoning")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.entries: list[Entry] = []
        self.finish = ""


async def _collect(outputs: OutputProcessor) -> _Collected:
    """Every piece of one choice, until it finished. Raises EngineFailure."""
    got = _Collected()
    parts, reasoning, entries = got.parts, got.reasoning, got.entries
    finish = None
    while finish is None:
        for piece in await outputs.pieces():
            if isinstance(piece, str):
                parts.append(piece)
            else:
                parts.append(piece.content)
                reasoning.append(piece.reasoning)
        for piece_entries in outputs.logprobs:
            entries += piece_entries
        finish = outputs.finish
    got.finish = finish
    return got


def _choice(index: int, outputs: OutputProcessor, got: _Collected) -> dict[str, Any]:
    options, formatter = outputs.options, outputs.formatter
    logprobs = None
    if formatter is not None and options.logprobs is not None:
        logprobs = formatter.render(got.entries + outputs.tail_logprobs)
    text = "".join(got.parts)
    if options.chat:
        return openai_bodies.chat_choice(index, text, got.finish, outputs.stop_reason,
                                     reasoning="".join(got.reasoning) if outputs.parsing else None,
                                     tool_calls=outputs.calls if outputs.parsing else None, logprobs=logprobs)
    return openai_bodies.text_choice(index, text, got.finish, outputs.stop_reason, logprobs=logprobs,
                                 prompt_logprobs=_prompt_logprobs(outputs))


def _prompt_logprobs(outputs: OutputProcessor) -> str | None:
    formatter = outputs.formatter
    if formatter is None or outputs.options.prompt_logprobs is None:
        return None
    return formatter.prompt_logprobs(outputs.prompt_segments, outputs.stream.prompt_len)


def group_usage(prompts: list[list[OutputProcessor]]) -> dict[str, Any]:
    """A request's usage over its prompts and their choices, as vLLM sums it: each prompt's tokens once
    (its cached tokens as its first choice found them), every choice's completion tokens."""
    return usage_body(sum(p[0].stream.prompt_len for p in prompts),
                           sum(o.completion_tokens for p in prompts for o in p),
                           sum(p[0].cached_tokens for p in prompts))


async def send_completion(send: Send, prompts: list[list[OutputProcessor]], model: str) -> None:
    """The whole response as one JSON body, once every choice has finished: `prompts`, each prompt's
    choices (the choice indexes run over them in order). A choice that fails fails the response."""
    choices = [o for p in prompts for o in p]
    try:
        if len(choices) == 1:
            collected = [await _collect(choices[0])]
        else:
            collected = await _gather(choices)
    except EngineFailure as exc:
        await send_json(send, exc.status, error_body(exc.status, str(exc), exc.param))
        return
    first = choices[0]
    options = first.options
    use = group_usage(prompts)  # one choice: its own usage
    bodies = [_choice(i, o, got) for i, (o, got) in enumerate(zip(choices, collected, strict=True))]
    prompt_logprobs = _prompt_logprobs(first) if options.chat else None  # a completion's are its choices'
    body = openai_bodies.completion_body(options.response_id or first.stream.request_id, model, bodies, use,
                                     chat=options.chat, prompt_logprobs=prompt_logprobs)
    await send_json(send, 200, body, [_rank_header(first)])


async def _gather(choices: list[OutputProcessor]) -> list[_Collected]:
    """Each choice collected by a task of its own; the first failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(_collect(o)) for o in choices]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()


def _events(writer: openai_bodies.ChunkWriter, outputs: OutputProcessor, pieces: list[Piece],
            render: Callable[[list[Entry]], bytes] | None) -> list[bytes]:
    """The SSE events of one choice's latest pieces, and its finish event once it finished. With a
    stream_interval, the text pieces of one wake-up (several tokens') go out as one event, as vLLM
    sends one delta per interval."""
    text, usage, continuous = writer.text, outputs.usage, outputs.options.continuous_usage
    counts, entries = outputs.counts, outputs.logprobs
    if outputs.options.stream_interval > 1 and len(pieces) > 1:
        pieces, counts, entries = _joined(pieces, counts, entries if render is not None else None)
    if render is not None:  # logprobs: each piece's, or null when it has none
        events = [text(p, usage(n) if continuous else None, render(e) if e else None) if isinstance(p, str)
                  else writer.delta(p, usage(n) if continuous else None, render(e) if e else None)
                  for p, n, e in zip(pieces, counts, entries, strict=True)]
    elif continuous:
        events = [text(p, usage(n)) if isinstance(p, str) else writer.delta(p, usage(n))
                  for p, n in zip(pieces, counts, strict=True)]
    else:
        events = [text(p) if isinstance(p, str) else writer.delta(p) for p in pieces]
    finish = outputs.finish
    if finish is not None:
        tail = outputs.tail_logprobs
        total = usage(outputs.completion_tokens) if continuous else None
        logprobs = render(tail) if render is not None and tail else None
        events.append(writer.finish(finish, outputs.stop_reason, total, logprobs))
    return events


def _joined(pieces: list[Piece], counts: list[int], entries: list[list[Entry]] | None
            ) -> tuple[list[Piece], list[int], list[list[Entry]]]:
    """Runs of consecutive text pieces joined into one (their entries in order, the run's last count);
    a parser's deltas (reasoning, tool calls) stay as they are."""
    out: list[Piece] = []
    out_counts: list[int] = []
    out_entries: list[list[Entry]] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str) and out and isinstance(out[-1], str):
            out[-1] += piece
            out_counts[-1] = counts[i]
            if entries is not None:
                out_entries[-1] = out_entries[-1] + entries[i]
            continue
        out.append(piece)
        out_counts.append(counts[i])
        out_entries.append(entries[i] if entries is not None else [])
    return out, out_counts, out_entries


def _render(outputs: OutputProcessor) -> Callable[[list[Entry]], bytes] | None:
    formatter = outputs.formatter
    return formatter.render if formatter is not None and outputs.options.logprobs is not None else None


def _with_logprobs(writer: openai_bodies.ChunkWriter, outputs: OutputProcessor,
                   render: Callable[[list[Entry]], bytes]) -> Callable[[str], bytes]:
    """The event of a plain_text() piece with the logprobs plain_text() left for it."""
    return lambda piece: writer.text(piece, None, render(outputs.logprobs[0]) if outputs.logprobs[0] else None)


def _frame(writer: openai_bodies.ChunkWriter, outputs: OutputProcessor,
           render: Callable[[list[Entry]], bytes] | None) -> tuple[bytes, ...] | None:
    """What a plain piece's event is made of around its text (and its entries) where a C step can make it
    (OutputProcessor.native_step): ChunkWriter.text_frame() without logprobs, logprobs_frame() with a
    formatter whose render() only joins its entries."""
    if render is None:
        return writer.text_frame()
    around = outputs.formatter.render_frame()  # type: ignore[union-attr]  # `render` is its
    return None if around is None else writer.logprobs_frame(*around)


async def send_stream(send: Send, prompts: list[list[OutputProcessor]], model: str, wakeup: Wakeup | None,
                      cycle: HttpCycle | None = None) -> None:
    """SSE events as the outputs arrive: `prompts`, each prompt's choices (with several, their events
    interleave as they come, woken by `wakeup`, which every choice's stream wakes).

    The response starts with the first output, so that x-data-parallel-rank names the rank that
    serves it (also after a draining rank's refusal moved it) and a failure before any output
    gets its own status rather than an error event. `cycle`: uvicorn's, when the server is uvicorn
    (direct_stream.py)."""
    choices = [o for p in prompts for o in p]
    if len(choices) == 1:
        await _send_one_stream(send, choices[0], model, cycle)
        return
    assert wakeup is not None
    first = choices[0]
    options = first.options
    created = int(time.time())
    response_id = options.response_id or first.stream.request_id
    writers = [openai_bodies.ChunkWriter(response_id, model, chat=options.chat, index=i, created=created)
               for i in range(len(choices))]
    renders = [_render(o) for o in choices]
    running = list(range(len(choices)))
    started = False
    try:
        while running:
            ready = [i for i in running if choices[i].stream.ready]
            if not ready:
                await wakeup.wait()
                continue
            events: list[bytes] = []
            for i in ready:
                outputs = choices[i]
                events += _events(writers[i], outputs, await outputs.pieces(), renders[i])
            running = [i for i in running if choices[i].finish is None]
            head = None
            if not started:
                started = True
                head = {"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, _rank_header(first)]}
                if options.chat:  # as vLLM: each choice's role first
                    zero = options.continuous_usage
                    events[:0] = [w.role(o.usage(0) if zero else None) for w, o in zip(writers, choices, strict=True)]
            if not running:
                if options.include_usage:
                    events.append(writers[0].usage(group_usage(prompts)))
                events.append(openai_bodies.DONE)
            await _send_events(send, head, events, bool(running))
    except EngineFailure as exc:
        if not started:
            await send_json(send, exc.status, error_body(exc.status, str(exc), exc.param), [_rank_header(first)])
            return
        await send({"type": "http.response.body", "body": writers[0].error(exc.status, str(exc)) + openai_bodies.DONE,
                    "more_body": False})


async def _send_one_stream(send: Send, outputs: OutputProcessor, model: str, cycle: HttpCycle | None) -> None:
    """One choice's events; with `cycle` (uvicorn's), those between the first and the last are written by
    a DirectStream in the dispatch pass."""
    options = outputs.options
    writer = openai_bodies.ChunkWriter(options.response_id or outputs.stream.request_id, model, chat=options.chat)
    render, usage, continuous = _render(outputs), outputs.usage, options.continuous_usage
    plain = not continuous and options.stream_interval == 1  # a text piece is one writer.text()
    text = (writer.text if render is None else _with_logprobs(writer, outputs, render)) if plain else None
    direct = (DirectStream(HttpOutlet(cycle), outputs, lambda pieces: _events(writer, outputs, pieces, render), text,
                           _frame(writer, outputs, render) if plain else None)
              if cycle is not None else None)
    stream = outputs.stream
    started = False
    try:
        while outputs.finish is None:
            if started and direct is not None and not stream.ready and direct.usable():
                events = await direct.run()
                if not events and outputs.finish is None:
                    continue  # the stream ended (its last outputs wait), or the transport paused
            else:
                events = _events(writer, outputs, await outputs.pieces(), render)
            head = None
            if not started:
                started = True
                head = {"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, _rank_header(outputs)]}
                if options.chat:
                    events.insert(0, writer.role(usage(0) if continuous else None))
            finish = outputs.finish
            if finish is not None:
                if options.include_usage:
                    events.append(writer.usage(usage(outputs.completion_tokens)))
                events.append(openai_bodies.DONE)
            await _send_events(send, head, events, finish is None)
    except EngineFailure as exc:
        if not started:
            await send_json(send, exc.status, error_body(exc.status, str(exc), exc.param), [_rank_header(outputs)])
            return
        await send({"type": "http.response.body", "body": writer.error(exc.status, str(exc)) + openai_bodies.DONE,
                    "more_body": False})


async def _send_events(send: Send, head: Message | None, events: list[bytes], more: bool) -> None:
    """A stream's events as one body (none when there are none); after `head`, the response's start,
    when this is the first send (with it in one write: response_start.py)."""
    body: Message | None = None
    if events:
        body = {"type": "http.response.body", "body": b"".join(events), "more_body": more}
    if head is not None:
        await start_response(send, head, body)
    elif body is not None:
        await send(body)


async def send_tokens(send: Send, outputs: OutputProcessor, model: str, cycle: HttpCycle | None = None) -> None:
    """/inference/v1/generate's answer in token ids (their text too when asked): one JSON body, or SSE
    chunks (one per wake-up or dispatch pass: the ids of every output queued since the last) and [DONE]."""
    options = outputs.options
    request_id = options.response_id or outputs.stream.request_id
    if options.stream:
        await _stream_tokens(send, outputs, request_id, cycle)
        return
    ids: list[int] = []
    parts: list[str] = []
    entries: list[Entry] = []
    formatter = outputs.formatter
    finish = None
    try:
        while finish is None:
            parts.extend(p if isinstance(p, str) else p.content for p in await outputs.pieces())
            ids.extend(outputs.token_ids)
            if formatter is not None:
                entries += outputs.token_entries()
            finish = outputs.finish
    except EngineFailure as exc:
        await send_json(send, exc.status, error_body(exc.status, str(exc)))
        return
    logprobs = formatter.render(entries) if formatter is not None and options.logprobs is not None else None
    body = openai_bodies.generate_response(request_id, model, ids, finish, outputs.usage(outputs.completion_tokens),
                                       "".join(parts) if options.text_out else None, logprobs,
                                       _prompt_logprobs(outputs))
    await send_json(send, 200, body, [_rank_header(outputs)])


def _token_events(writer: openai_bodies.TokenChunkWriter, outputs: OutputProcessor,
                  render: Callable[[list[Entry]], bytes] | None, pieces: list[Piece]) -> list[bytes]:
    """The token-out chunk of the latest pieces() call (its ids, and the finish once finished), if any."""
    finish = outputs.finish
    if not outputs.token_ids and finish is None:
        return []
    text = "".join(p if isinstance(p, str) else p.content for p in pieces) if outputs.options.text_out else None
    use = outputs.usage(outputs.completion_tokens) if outputs.options.continuous_usage else None
    logprobs = render(outputs.token_entries()) if render is not None else None
    return [writer.chunk(outputs.token_ids, finish, use, text, logprobs)]


async def _stream_tokens(send: Send, outputs: OutputProcessor, request_id: str, cycle: HttpCycle | None) -> None:
    """The token-out SSE answer; with `cycle` (uvicorn's), its chunks between the first and the last are
    written by a DirectStream in the dispatch pass."""
    options = outputs.options
    writer = openai_bodies.TokenChunkWriter(request_id)
    render = _render(outputs)
    direct = (DirectStream(HttpOutlet(cycle), outputs, lambda pieces: _token_events(writer, outputs, render, pieces))
              if cycle is not None else None)
    stream = outputs.stream
    started = False
    try:
        while outputs.finish is None:
            if started and direct is not None and not stream.ready and direct.usable():
                events = await direct.run()
                if not events and outputs.finish is None:
                    continue  # the stream ended (its last outputs wait), or the transport paused
            else:
                events = _token_events(writer, outputs, render, await outputs.pieces())
            finish = outputs.finish
            head = None
            if not started:
                started = True
                head = {"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, _rank_header(outputs)]}
            if finish is not None:
                if options.include_usage:
                    events.append(writer.usage(outputs.usage(outputs.completion_tokens)))
                events.append(openai_bodies.DONE)
            await _send_events(send, head, events, finish is None)
    except EngineFailure as exc:
        if not started:
            await send_json(send, exc.status, error_body(exc.status, str(exc)), [_rank_header(outputs)])
            return
        error = b"data: " + error_body(exc.status, str(exc)) + b"\n\n"
        await send({"type": "http.response.body", "body": error + openai_bodies.DONE, "more_body": False})
