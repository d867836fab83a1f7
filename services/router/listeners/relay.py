"""A call relayed to a backend and its answer back (router process): dispatched to the first pool of its
plan with a free replica (backends/dispatch.py), then upstream's answer to the client: passed through as
it arrives, translated by the request's API codec, or an upstream refusal in its shape."""
from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.types import Send

from services.router.backends.dispatch import Attempt, Dispatcher
from services.router.backends.sse import SSEData
from services.router.backends.upstream import READ_ERRORS, UpstreamError, UpstreamResponse, decode_object, shaped
from services.router.errors import HTTPError
from services.router.listeners.asgi import JSON, TrackedSend
from services.router.listeners.call import Call
from services.router.listeners.codecs.codec import CHAT_PATH
from services.router.listeners.codecs.openai import as_chunks
from services.router.listeners.connections import chunk_writer, cycle_of, start_with_first
from services.router.metrics import RouterMetrics

log = logging.getLogger("router")

SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_json = msgspec.json.Encoder()


class Relay:
    def __init__(self, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics

    async def relay(self, call: Call, send: Send, first: Attempt | None = None) -> None:
        """The request to the first pool of its plan that has a free replica, and the answer to the client.
        `first`: that pool's first attempt, made already (the lane's hand-over)."""
        opened = await self.dispatcher.open_any(call.chat, call.choice.text, call.codec.upstream_path,
                                                call.choice.plan, {}, bulk=call.bulk, ticket=call.ticket, first=first)
        call.headers += [(b"x-router-pool", opened.pool.encode()),
                         (b"x-router-replica", opened.lease.replica.url.encode()),
                         (b"x-router-attempts", str(opened.attempts).encode())]
        response = opened.response
        ok: bool | None = None  # None: abandoned (the client left), which says nothing about the replica
        try:
            if response.status != 200:
                await self._upstream_refusal(call, response, send)
                ok = True
            elif call.codec.passthrough:
                ok = await self._pass_through(call, response, send)
            elif call.chat.get("stream"):
                ok = await self._adapt_stream(call, response, send)
            else:
                chat = decode_object(await response.read())
                await self.send_adapted(call, chat, send)
                ok = True
        except (*READ_ERRORS, UpstreamError) as exc:
            ok = False
            log.warning("upstream %s failed mid-response: %s", opened.lease.replica.url, exc)
            if call.status == 0:
                raise HTTPError(502, f"upstream {opened.lease.replica.url} failed: {exc}") from None
        finally:
            response.close()
            opened.lease.release(ok)
            if ok is False:
                self.metrics.upstream_errors.labels(opened.pool).inc()

    async def _pass_through(self, call: Call, response: UpstreamResponse, send: Send) -> bool:
        """Upstream bytes to the client: a stream as each piece arrives, a JSON body in one send once
        complete (it is useless to a client before then). False when upstream broke off."""
        content_type = response.content_type.encode()
        streaming = content_type.startswith(b"text/event-stream")
        last = b""
        try:
            if not streaming:
                body = await response.read()
                call.seen_body(body)
                await call.start(send, 200, [(b"content-type", content_type),
                                             (b"content-length", str(len(body)).encode())])
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return True
            # The hot path, once per upstream chunk: the bytes go out as they came (no SSE parse, no
            # re-framing). When nothing reads them on the way (no recorder, no usage) and the server is
            # this router's uvicorn, the upstream connection's callback writes each read's bytes to the
            # client's transport itself (connections.chunk_writer): no wake-up of this task, no send.
            # Otherwise, and for what the client's paused transport refused, the server's own send (a
            # middle piece changes no response state). The last piece, when upstream's end came with it,
            # goes out with the response's end: one write (and one wake-up of the client) fewer per request.
            body_send = send.raw if isinstance(send, TrackedSend) else send
            watched = call.recorder is not None or call.usage is not None
            cycle = None if watched else cycle_of(body_send)
            head = [(b"content-type", content_type)]
            # Body bytes that came with upstream's head go out with the client's head, in one write.
            if cycle is not None and not cycle.flow.write_paused and (first := response.ready()):
                if not await start_with_first(cycle, lambda: call.start(send, 200, head), first):
                    await body_send({"type": "http.response.body", "body": first, "more_body": True})
            else:
                await call.start(send, 200, head)
            async for chunk in response.chunks(chunk_writer(cycle) if cycle is not None else None):
                if watched:
                    call.seen_raw(chunk)
                if response.complete:
                    last = chunk
                    continue  # the loop ends here: nothing is left
                await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
        except READ_ERRORS as exc:
            log.warning("upstream %s broke off a response: %s", response.url, exc)
            if call.status == 0:
                raise
            if streaming:
                tail = call.codec.stream(call.request).error(f"upstream failed mid-stream: {type(exc).__name__}")
                await send({"type": "http.response.body", "body": tail, "more_body": False})
            call.seen_end(False)
            return False
        call.seen_end()
        await send({"type": "http.response.body", "body": last, "more_body": False})
        return True

    async def _adapt_stream(self, call: Call, response: UpstreamResponse, send: Send) -> bool:
        """Upstream chat chunks as the API's events, translated as each arrives."""
        stream = call.codec.stream(call.request)
        await call.start(send, 200, SSE)
        await send({"type": "http.response.body", "body": stream.start(), "more_body": True})
        done, reader = False, SSEData()

        async def translate(events: list[bytes]) -> None:
            """Send what translates; a bad event is raised after the good ones before it went out."""
            nonlocal done
            out, bad = [], None
            for data in events:
                if data.strip() == b"[DONE]":
                    done = True
                elif data.strip():
                    try:
                        chunk = decode_object(data)
                        call.seen_chunk(chunk)
                        out.append(shaped(stream.feed, chunk))
                    except UpstreamError as exc:
                        bad = exc
                        break
            if out:
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            if bad is not None:
                raise bad

        try:
            async for chunk in response.chunks():
                await translate(reader.feed(chunk))
            await translate(reader.finish())
        except (*READ_ERRORS, UpstreamError) as exc:
            log.warning("upstream %s broke off a stream: %s", response.url, exc)
        # A stream that ended without [DONE] (or was no event stream at all) broke off.
        tail = stream.finish() if done else stream.error("upstream ended the stream early")
        call.seen_end(done)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return done

    async def send_adapted(self, call: Call, chat: dict[str, Any], send: Send) -> None:
        """A whole upstream answer as the API's response body."""
        body = shaped(call.codec.from_chat, chat, call.request)
        call.seen_whole(chat)
        if call.escalation is not None:
            body["router"] = call.escalation
        data = _json.encode(body)
        await call.start(send, 200, [*JSON, (b"content-length", str(len(data)).encode())])
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def send_whole(self, call: Call, completion: dict[str, Any], send: Send) -> None:
        """A whole chat or text completion (an escalate stage's, a cached one) as the client asked for it:
        one body in the API's shape, or replayed as that API's stream."""
        if not call.chat.get("stream"):
            await self.send_adapted(call, completion, send)
            return
        options = call.chat.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        chunks = shaped(as_chunks, completion, chat=call.codec.upstream_path == CHAT_PATH, include_usage=usage)
        stream = call.codec.stream(call.request)
        body = stream.start() + b"".join(shaped(stream.feed, c) for c in chunks) + stream.finish()
        call.seen_whole(completion)
        await call.start(send, 200, SSE)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _upstream_refusal(self, call: Call, response: UpstreamResponse, send: Send) -> None:
        """A 4xx from upstream (bad request, unknown model there, ...): passed on in the API's shape."""
        raw = await response.read()
        body = call.codec.refusal_body(response.status, raw)
        if body is None:
            await call.start(send, response.status, [(b"content-type", response.content_type.encode())])
            await send({"type": "http.response.body", "body": raw, "more_body": False})
            return
        await call.start(send, response.status, JSON)
        await send({"type": "http.response.body", "body": body, "more_body": False})
