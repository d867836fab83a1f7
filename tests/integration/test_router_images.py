"""The Images API through real processes on real sockets: the router, an OpenAI-compatible images server
(tests/support/images_backend.py) as its image pool and the chat test backend as its text pool, driven
by the official `openai` SDK: images come back as b64_json and as URLs, n of them, made by the pool's
model; bad sizes, counts and formats are BadRequestErrors naming the field; an entry whose decisions mix
text and image pools sends images only to the image pool and chat only to the text pool."""
from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.procs import HttpProc, free_port_block, start_backend, start_router

CONFIG = """
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  words: {{model: words-m, replicas: [{{url: "{chat}"}}]}}
  paint: {{model: paint-m, outputs: [image], replicas: [{{url: "{images}"}}]}}
entries:
  painter: {{default: [paint]}}
  studio:
    signals: [{{name: draw, type: keyword, keywords: [draw]}}]
    decisions:
      - {{name: writing, when: draw, pools: [words]}}
      - {{name: drawing, when: draw, pools: [paint]}}
    default: [words]
"""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def start_images(tmp_path: Path) -> HttpProc:
    import subprocess

    port = free_port_block(1, spread=0)
    log_path = tmp_path / f"images-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.images_backend", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    images = HttpProc(proc, port, log_path)
    try:
        images.wait_http()
    except BaseException:
        images.stop()
        raise
    return images


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpProc, HttpProc, HttpProc]]:
    tmp_path = tmp_path_factory.mktemp("images")
    chat, images = start_backend(tmp_path, "chat"), start_images(tmp_path)
    try:
        router = start_router(tmp_path, CONFIG.format(chat=chat.url, images=images.url))
        try:
            yield router, images, chat
        finally:
            router.stop()
    finally:
        chat.stop()
        images.stop()


@pytest.fixture
def client(fleet: tuple[HttpProc, HttpProc, HttpProc]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet[0].url + "/v1", api_key="x", max_retries=0, timeout=30) as sdk:
        yield sdk


def test_b64_json_images_made_by_the_pools_model(client: openai.OpenAI, fleet: tuple[HttpProc, ...]) -> None:
    raw = client.images.with_raw_response.generate(model="painter", prompt="a red square", n=2,
                                                   response_format="b64_json", size="256x256")
    assert (raw.headers["x-router-entry"], raw.headers["x-router-decision"], raw.headers["x-router-pool"]) == (
        "painter", "default", "paint")
    answer = raw.parse()
    images = [base64.b64decode(item.b64_json or "") for item in answer.data or []]
    assert len(images) == 2 and all(image.startswith(PNG_MAGIC) for image in images)
    assert images[0] != images[1]  # two images, not one twice
    assert (answer.model_extra or {})["model"] == "paint-m"  # the pool's model, not the public name
    assert fleet[1].stats()["last_body"] == {"model": "paint-m", "prompt": "a red square", "n": 2,
                                             "response_format": "b64_json", "size": "256x256"}


def test_url_images_point_at_what_the_backend_serves(client: openai.OpenAI) -> None:
    answer = client.images.generate(model="painter", prompt="a blue circle", n=2, response_format="url")
    urls = [item.url or "" for item in answer.data or []]
    assert len(urls) == 2 and len(set(urls)) == 2
    for url in urls:
        fetched = httpx.get(url, timeout=10)
        assert fetched.status_code == 200 and fetched.content.startswith(PNG_MAGIC)


@pytest.mark.parametrize(("fields", "param"), [
    ({"size": "100x100"}, "size"), ({"n": 0}, "n"), ({"n": 11}, "n"), ({"response_format": "gif"}, "response_format"),
    ({"output_format": "bmp"}, "output_format"), ({"quality": "ultra"}, "quality"),
])
def test_bad_size_count_and_format_are_bad_requests_naming_the_field(
        client: openai.OpenAI, fleet: tuple[HttpProc, ...], fields: dict[str, Any], param: str) -> None:
    before = fleet[1].stats()["requests"]
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(model="painter", prompt="a red square", **fields)
    assert info.value.status_code == 400 and info.value.param == param, info.value.body
    assert fleet[1].stats()["requests"] == before  # refused by the router: the pool never saw it


def test_streaming_is_refused_as_not_supported(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(model="painter", prompt="x", stream=True)
    assert info.value.param == "stream" and "not supported" in info.value.message


def test_mixed_decisions_send_images_to_the_image_pool_and_chat_to_the_text_pool(
        client: openai.OpenAI, fleet: tuple[HttpProc, ...]) -> None:
    router, images, chat = fleet
    drawn = client.images.with_raw_response.generate(model="studio", prompt="draw a cat")
    assert (drawn.headers["x-router-decision"], drawn.headers["x-router-pool"]) == ("drawing", "paint")
    assert images.stats()["models"][-1] == "paint-m"
    said = client.chat.completions.with_raw_response.create(
        model="studio", messages=[{"role": "user", "content": "draw a cat"}])
    assert (said.headers["x-router-decision"], said.headers["x-router-pool"]) == ("writing", "words")
    assert said.parse().choices[0].message.content == "chat:words-m"
    # No image decision holds and the default is a text pool: images have nowhere to go.
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(model="studio", prompt="a cat")
    assert info.value.param == "model" and "no image-output pool" in info.value.message
    # Chat never goes to the image-only pool.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="painter", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.param == "model"
    assert "/v1/chat/completions" not in images.stats()["paths"]
