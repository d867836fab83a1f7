"""Drives one generation response from output processing to the ASGI send: a JSON body once the request
finishes, or SSE events with every event queued since the last wake-up joined into one body send;
chat and text completions, and the token-out answers of /inference/v1/generate.
Runs on each API server's event loop."""
from __future__ import annotations

from starlette.types import Send

from services.frontend import responses
from services.frontend.asgi import send_json
from services.frontend.errors import error_body
from services.frontend.logprobs import Entry
from services.frontend.output import OutputProcessor
from services.frontend.stream import EngineFailure

SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _rank_header(outputs: OutputProcessor) -> tuple[bytes, bytes]:
    return b"x-data-parallel-rank", str(outputs.stream.rank).encode()


async def send_completion(send: Send, outputs: OutputProcessor, model: str) -> None:
    """The whole response as one JSON body, once the request has finished."""
    parts: list[str] = []
    reasoning: list[str] = []
    entries: list[Entry] = []
    finish = None
    try:
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
    except EngineFailure as exc:
        await send_json(send, exc.status, error_body(exc.status, str(exc), exc.param))
        return
    use = outputs.usage(outputs.completion_tokens)
    options, formatter = outputs.options, outputs.formatter
    logprobs = prompt_logprobs = None
    if formatter is not None:
        if options.logprobs is not None:
            logprobs = formatter.render(entries + outputs.tail_logprobs)
        if options.prompt_logprobs is not None:
            prompt_logprobs = formatter.prompt_logprobs(outputs.prompt_segments, outputs.stream.prompt_len)
    response_id = options.response_id or outputs.stream.request_id
    if options.chat:
        body = responses.chat_completion(response_id, model, "".join(parts), finish, outputs.stop_reason,
                                         use, reasoning="".join(reasoning) if outputs.parsing else None,
                                         tool_calls=outputs.calls if outputs.parsing else None,
                                         logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    else:
        body = responses.text_completion(response_id, model, "".join(parts), finish, outputs.stop_reason, use,
                                         logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    await send_json(send, 200, body, [_rank_header(outputs)])


async def send_stream(send: Send, outputs: OutputProcessor, model: str) -> None:
    """SSE events as the outputs arrive.

    The response starts with the first output, so that x-data-parallel-rank names the rank that
    serves it (also after a draining rank's refusal moved it) and a failure before any output
    gets its own status rather than an error event."""
    options = outputs.options
    writer = responses.ChunkWriter(options.response_id or outputs.stream.request_id, model, chat=options.chat)
    text, usage, continuous = writer.text, outputs.usage, options.continuous_usage
    formatter = outputs.formatter
    render = formatter.render if formatter is not None and options.logprobs is not None else None
    started = False
    try:
        while outputs.finish is None:
            pieces = await outputs.pieces()
            if render is not None:  # logprobs: each piece's, or null when it has none
                events = [text(p, usage(n) if continuous else None, render(e) if e else None) if isinstance(p, str)
                          else writer.delta(p, usage(n) if continuous else None, render(e) if e else None)
                          for p, n, e in zip(pieces, outputs.counts, outputs.logprobs, strict=True)]
            elif continuous:
                events = [text(p, usage(n)) if isinstance(p, str) else writer.delta(p, usage(n))
                          for p, n in zip(pieces, outputs.counts, strict=True)]
            else:
                events = [text(p) if isinstance(p, str) else writer.delta(p) for p in pieces]
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200,
                            "headers": [*SSE_HEADERS, _rank_header(outputs)]})
                if options.chat:
                    events.insert(0, writer.role(usage(0) if continuous else None))
            finish = outputs.finish
            if finish is not None:
                total = usage(outputs.completion_tokens)
                tail = outputs.tail_logprobs
                events.append(writer.finish(finish, outputs.stop_reason, total if continuous else None,
                                            render(tail) if render is not None and tail else None))
                if options.include_usage:
                    events.append(writer.usage(total))
                events.append(responses.DONE)
            if events:
                await send({"type": "http.response.body", "body": b"".join(events), "more_body": finish is None})
    except EngineFailure as exc:
        if not started:
            await send_json(send, exc.status, error_body(exc.status, str(exc), exc.param), [_rank_header(outputs)])
            return
        await send({"type": "http.response.body", "body": writer.error(exc.status, str(exc)) + responses.DONE,
                    "more_body": False})


async def send_tokens(send: Send, outputs: OutputProcessor, model: str) -> None:
    """/inference/v1/generate's answer in token ids (their text too when asked): one JSON body, or SSE
    chunks (one per wake-up: the ids of every output queued since the last) and [DONE]."""
    options = outputs.options
    request_id = options.response_id or outputs.stream.request_id
    if options.stream:
        await _stream_tokens(send, outputs, request_id)
        return
    ids: list[int] = []
    parts: list[str] = []
    finish = None
    try:
        while finish is None:
            parts.extend(p if isinstance(p, str) else p.content for p in await outputs.pieces())
            ids.extend(outputs.token_ids)
            finish = outputs.finish
    except EngineFailure as exc:
        await send_json(send, exc.status, error_body(exc.status, str(exc)))
        return
    body = responses.generate_response(request_id, model, ids, finish, outputs.usage(outputs.completion_tokens),
                                       "".join(parts) if options.text_out else None)
    await send_json(send, 200, body, [_rank_header(outputs)])


async def _stream_tokens(send: Send, outputs: OutputProcessor, request_id: str) -> None:
    options = outputs.options
    writer = responses.TokenChunkWriter(request_id)
    started = False
    try:
        while outputs.finish is None:
            pieces = await outputs.pieces()
            finish = outputs.finish
            events = []
            if outputs.token_ids or finish is not None:
                text = "".join(p if isinstance(p, str) else p.content for p in pieces) if options.text_out else None
                use = outputs.usage(outputs.completion_tokens) if options.continuous_usage else None
                events.append(writer.chunk(outputs.token_ids, finish, use, text))
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200,
                            "headers": [*SSE_HEADERS, _rank_header(outputs)]})
            if finish is not None:
                if options.include_usage:
                    events.append(writer.usage(outputs.usage(outputs.completion_tokens)))
                events.append(responses.DONE)
            if events:
                await send({"type": "http.response.body", "body": b"".join(events), "more_body": finish is None})
    except EngineFailure as exc:
        if not started:
            await send_json(send, exc.status, error_body(exc.status, str(exc)), [_rank_header(outputs)])
            return
        error = b"data: " + error_body(exc.status, str(exc)) + b"\n\n"
        await send({"type": "http.response.body", "body": error + responses.DONE, "more_body": False})
