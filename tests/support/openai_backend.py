"""A small OpenAI-compatible backend for router tests and benchmarks, run as its own process:
`python -m tests.support.openai_backend --port P --name a`.

Chat and completions, streamed or not, answer `reply` (default "<name>:<model>") with no delay unless
told; `POST /classify` answers in vLLM's pooling shape with the same `probs` for every input (a stand-in
for a classifier worker, its top class named by `labels`); its behaviour changes at run time through
POST /admin/config (status, delay_s, held, chunk_delay_s, chunks, reply, finish_reason, healthy,
newline, raw_body, probs, labels), POST /admin/reset restores the defaults and zeroes the stats, and it
reports what it saw at GET /admin/stats (`prompts` lists each generation's last message or prompt, in the
order they arrived; `traceparents` each one's traceparent header, or null). `held: true` keeps every
generation waiting, in flight, until set back to false: a test can fill a queue without racing a timer.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import msgspec

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


class Backend:
    def __init__(self, name: str) -> None:
        self.name = name
        self.settings: dict[str, Any] = {}
        self.defaults: dict[str, Any] = {"status": 200, "delay_s": 0.0, "held": False, "chunk_delay_s": 0.0,
                                         "chunks": 3,
                                         "reply": None, "finish_reason": "stop", "healthy": True,
                                         # Misbehaviours: SSE line ending, and a body to send instead of
                                         # the completion (as is, or as one event's data when streaming).
                                         "newline": "\n", "raw_body": None,
                                         # /classify: every input's probabilities, and the class names.
                                         "probs": [0.1, 0.8, 0.1], "labels": ["chat", "code", "math"]}
        self.stats: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        """Back to the defaults, and stats from zero (in-flight requests still count down)."""
        self.settings = dict(self.defaults)
        inflight, streaming = self.stats.get("inflight", 0), self.stats.get("streaming", 0)
        self.stats = {"requests": 0, "inflight": inflight, "streaming": streaming, "completed": 0,
                      "disconnected": 0, "models": [], "prompts": [], "last_body": None,
                      "traceparents": []}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/health":
            healthy = self.settings["healthy"]
            await _send(send, 200 if healthy else 503, {"status": "ok" if healthy else "unhealthy"})
        elif path == "/admin/stats":
            await _send(send, 200, self.stats)
        elif path == "/admin/reset":
            self.reset()
            await _send(send, 200, self.settings)
        elif path == "/admin/config":
            self.settings.update(_decode.decode(await _body(receive)))
            await _send(send, 200, self.settings)
        elif path == "/v1/models":
            await _send(send, 200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
        elif path in ("/v1/chat/completions", "/v1/completions"):
            self.stats["traceparents"].append(next((v.decode() for k, v in scope["headers"] if k == b"traceparent"),
                                                   None))
            await self._generate(path == "/v1/chat/completions", await _body(receive), receive, send)
        elif path == "/classify":
            await self._classify(await _body(receive), send)
        else:
            await _send(send, 404, {"error": {"message": f"no route {path}", "type": "not_found_error"}})

    async def _generate(self, chat: bool, raw: bytes, receive: Any, send: Any) -> None:
        s, stats = self.settings, self.stats
        body = _decode.decode(raw)
        stats["requests"] += 1
        stats["models"].append(body.get("model"))
        stats["prompts"].append(_prompt(body))
        stats["last_body"] = body
        stats["inflight"] += 1
        try:
            while self.settings["held"]:
                await asyncio.sleep(0.01)
            if s["delay_s"]:
                await asyncio.sleep(s["delay_s"])
            if s["status"] != 200:
                await _send(send, s["status"], {"error": {"message": f"{self.name} is told to fail",
                                                          "type": "server_error", "code": s["status"]}})
                return
            text = s["reply"] if s["reply"] is not None else f"{self.name}:{body.get('model')}"
            if s["raw_body"] is not None:
                await self._raw(bool(body.get("stream")), s["raw_body"].encode(), s["newline"].encode(), send)
            elif body.get("stream"):
                if not await self._stream(chat, body, text, receive, send):
                    return
            else:
                await _send(send, 200, _completion(chat, body, text, s["finish_reason"]))
            stats["completed"] += 1
        finally:
            stats["inflight"] -= 1

    async def _classify(self, raw: bytes, send: Any) -> None:
        s, body = self.settings, _decode.decode(raw)
        self.stats["requests"] += 1
        self.stats["last_body"] = body
        if s["delay_s"]:
            await asyncio.sleep(s["delay_s"])
        if s["status"] != 200:
            await _send(send, s["status"], {"error": {"message": f"{self.name} is told to fail", "code": s["status"]}})
            return
        texts = body["input"] if isinstance(body.get("input"), list) else [body.get("input")]
        probs = s["probs"]
        top = max(range(len(probs)), key=probs.__getitem__)
        await _send(send, 200, {"object": "list", "model": body.get("model"), "data": [
            {"index": i, "label": s["labels"][top], "probs": probs, "num_classes": len(probs)}
            for i in range(len(texts))]})

    async def _raw(self, stream: bool, raw: bytes, newline: bytes, send: Any) -> None:
        kind = b"text/event-stream" if stream else b"application/json"
        if stream:
            raw = b"data: " + raw + newline * 2 + b"data: [DONE]" + newline * 2
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": raw})

    async def _stream(self, chat: bool, body: dict[str, Any], text: str, receive: Any, send: Any) -> bool:
        """False when the client left before the end."""
        s = self.settings
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        self.stats["streaming"] += 1
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            n = max(1, int(s["chunks"]))
            pieces = [text[i * len(text) // n:(i + 1) * len(text) // n] for i in range(n)]
            for i, piece in enumerate(pieces):
                if gone.is_set():
                    self.stats["disconnected"] += 1
                    return False
                delta: dict[str, Any] = {"content": piece}
                if chat and i == 0:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": piece}
                choice["finish_reason"] = s["finish_reason"] if i == n - 1 else None
                await send({"type": "http.response.body", "body": _sse(_chunk(chat, body, [choice]), s["newline"]),
                            "more_body": True})
                if s["chunk_delay_s"]:
                    await asyncio.sleep(s["chunk_delay_s"])
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = _usage(body, text)
                await send({"type": "http.response.body", "body": _sse({**_chunk(chat, body, []), "usage": usage},
                                                                 s["newline"]),
                            "more_body": True})
            done = b"data: [DONE]" + s["newline"].encode() * 2
            await send({"type": "http.response.body", "body": done, "more_body": False})
            return True
        finally:
            self.stats["streaming"] -= 1
            watcher.cancel()


def _prompt(body: dict[str, Any]) -> Any:
    """The last message's content of a chat body, or a completion's prompt."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return messages[-1].get("content")
    return body.get("prompt")


def _completion(chat: bool, body: dict[str, Any], text: str, finish: str) -> dict[str, Any]:
    choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                              else {"index": 0, "text": text})
    choice["finish_reason"] = finish
    return {"id": "cmpl-test", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model"), "choices": [choice],
            "usage": _usage(body, text)}


def _chunk(chat: bool, body: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "cmpl-test", "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model"), "choices": choices}


def _usage(body: dict[str, Any], text: str) -> dict[str, int]:
    prompt = len(_json.encode(body.get("messages") or body.get("prompt") or "")) // 4
    completion = max(1, len(text) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(data: dict[str, Any], newline: str = "\n") -> bytes:
    return b"data: " + _json.encode(data) + newline.encode() * 2


async def _lifespan(receive: Any, send: Any) -> None:
    """Every lifespan event acknowledged, until shutdown."""
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send(send: Any, status: int, data: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": _json.encode(data)})


def main() -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="backend")
    args = parser.parse_args()
    config = Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    config.accesslog = None
    config.backlog = 2048
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(Backend(args.name), config))  # type: ignore[arg-type]
    else:
        uvloop.run(serve(Backend(args.name), config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
