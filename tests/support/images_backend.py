"""A small OpenAI-compatible images server for router tests, run as its own process:
`python -m tests.support.images_backend --port P`.

POST /v1/images/generations answers `n` deterministic 8x8 PNGs (their colour drawn from the prompt and
the image's index), as b64_json (the default) or as URLs it serves at GET /images/<id>.png, and echoes
the model it was sent (`model`); GET /health answers ok; GET /admin/stats reports the requests seen
(`requests`, `models`, `last_body`, `paths`). It checks nothing of the body but `prompt` and `n`: the
router's checks are what the tests exercise.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import struct
import time
import zlib
from typing import Any

import msgspec

from tests.support.openai_backend import _body, _lifespan, _send

_decode = msgspec.json.Decoder()
SIDE = 8  # pixels: small, and enough to tell two images apart


def png(seed: str) -> bytes:
    """An 8x8 RGB PNG of one colour drawn from `seed`: the same seed, the same bytes."""
    colour = hashlib.sha256(seed.encode()).digest()[:3]
    rows = b"".join(b"\x00" + colour * SIDE for _ in range(SIDE))  # filter 0 (none) before each row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", SIDE, SIDE, 8, 2, 0, 0, 0)  # 8 bits, truecolour, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


class ImagesBackend:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.images: dict[str, bytes] = {}  # served at /images/<id>.png
        self.stats: dict[str, Any] = {"requests": 0, "models": [], "last_body": None, "paths": []}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/health":
            await _send(send, 200, {"status": "ok"})
        elif path == "/admin/stats":
            await _send(send, 200, self.stats)
        elif path == "/v1/images/generations" and scope["method"] == "POST":
            await self._generate(_decode.decode(await _body(receive)), send)
        elif path.startswith("/images/") and path[len("/images/"):] in self.images:
            data = self.images[path[len("/images/"):]]
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"image/png")]})
            await send({"type": "http.response.body", "body": data})
        else:
            self.stats["paths"].append(path)
            await _send(send, 404, {"error": {"message": f"no route {path}", "type": "not_found_error"}})

    async def _generate(self, body: dict[str, Any], send: Any) -> None:
        self.stats["requests"] += 1
        self.stats["models"].append(body.get("model"))
        self.stats["last_body"] = body
        prompt, n = body.get("prompt"), body.get("n") or 1
        if not isinstance(prompt, str) or not prompt or not isinstance(n, int):
            await _send(send, 400, {"error": {"message": "prompt and n are wrong", "type": "invalid_request_error",
                                              "param": "prompt", "code": None}})
            return
        data = []
        for i in range(n):
            image = png(f"{prompt}#{i}")
            if body.get("response_format") == "url":
                name = f"{hashlib.sha256(image).hexdigest()[:16]}.png"
                self.images[name] = image
                data.append({"url": f"{self.base}/images/{name}", "revised_prompt": prompt})
            else:
                data.append({"b64_json": base64.b64encode(image).decode(), "revised_prompt": prompt})
        await _send(send, 200, {"created": int(time.time()), "data": data, "model": body.get("model"),
                                "output_format": "png", "size": body.get("size") or "auto"})


def main() -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    config.accesslog = None
    asyncio.run(serve(ImagesBackend(args.port), config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
