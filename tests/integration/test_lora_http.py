"""LoRA adapters served by name over HTTP, as vLLM serves them, on a two-rank sim fleet through the
official openai SDK: an engine's --lora-modules at start, /v1/load_lora_adapter and
/v1/unload_lora_adapter at run time (behind --allow-runtime-lora-updating), `model` naming an adapter on
chat, completions and the token-in route, /v1/models listing them, and an adapter loaded at run time
loaded again on a rank that restarts. The sim mixes an adapter's name into its token stream, so an
adapter's output differs from the base model's for the same seed."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import SIM
from tests.support.adapters import fake_adapter
from tests.support.procs import EngineProc, FrontendProc, start_engine, start_frontend

MESSAGES = [{"role": "user", "content": "Tell me a story"}]


class Fleet:
    def __init__(self, engine: EngineProc, frontend: FrontendProc) -> None:
        self.engine, self.frontend = engine, frontend
        self.client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="none", max_retries=0, timeout=30)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.frontend.url + path, json=body, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("lora")
    boot2 = json.dumps({"name": "boot2", "path": str(fake_adapter(tmp, "boot2"))})
    engine = start_engine(tmp, *SIM, "--sim-decode-ms", "2", "--lora-modules", f"boot={fake_adapter(tmp, 'boot')}",
                          boot2, ranks=2)
    try:
        fe = start_frontend(tmp, "--data-parallel-size", "2", "--data-parallel-size-local", "0",
                            "--engine-addresses", f"{engine.endpoint(0)},{engine.endpoint(1)}",
                            "--allow-runtime-lora-updating")
        try:
            yield Fleet(engine, fe)
        finally:
            fe.stop()
    finally:
        engine.stop()


def _chat(fleet: Fleet, model: str, **kw: Any) -> Any:
    return fleet.client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8,  # type: ignore[arg-type]
                                                seed=3, temperature=0.8, **kw)


def test_an_engines_lora_modules_are_served_by_name(fleet: Fleet) -> None:
    base = _chat(fleet, "tiny")
    boot = _chat(fleet, "boot")
    assert boot.model == "boot" and base.model == "tiny"
    assert boot.choices[0].message.content != base.choices[0].message.content
    assert _chat(fleet, "boot").choices[0].message.content == boot.choices[0].message.content  # seeded
    assert _chat(fleet, "boot2").choices[0].message.content not in (boot.choices[0].message.content,
                                                                    base.choices[0].message.content)
    models = {m.id: m for m in fleet.client.models.list().data}
    assert set(models) >= {"tiny", "boot", "boot2"}
    assert models["boot"].parent == "tiny" and models["tiny"].parent is None  # type: ignore[attr-defined]
    schemas = httpx.get(fleet.frontend.url + "/openapi.json", timeout=30).json()["components"]["schemas"]
    assert set(schemas["ChatCompletionRequest"]["properties"]["model"]["enum"]) >= {"tiny", "boot", "boot2"}
    assert set(schemas["TokenizeChatRequest"]["properties"]["model"]["anyOf"][0]["enum"]) >= {"tiny", "boot"}
    # An adapter tokenizes as its base model.
    for path, body in (("/tokenize", {"prompt": "Once upon"}), ("/detokenize", {"tokens": [1, 2, 3]}),
                       ("/tokenize", {"messages": MESSAGES})):
        plain, named = fleet.post(path, body), fleet.post(path, {**body, "model": "boot"})
        assert plain.status_code == named.status_code == 200 and plain.json() == named.json(), named.text
        assert fleet.post(path, {**body, "model": "nope"}).status_code == 404


def test_streams_completions_and_token_in_name_the_adapter(fleet: Fleet) -> None:
    chunks = list(_chat(fleet, "boot", stream=True))
    assert {c.model for c in chunks} == {"boot"}
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == _chat(fleet, "boot").choices[0].message.content
    base = fleet.client.completions.create(model="tiny", prompt="Once upon", max_tokens=8, seed=3, temperature=0.8)
    boot = fleet.client.completions.create(model="boot", prompt="Once upon", max_tokens=8, seed=3, temperature=0.8)
    assert boot.model == "boot" and boot.choices[0].text != base.choices[0].text
    ids = list(range(100, 130))
    body = {"token_ids": ids, "sampling_params": {"max_tokens": 8, "temperature": 0.8, "seed": 3}}
    plain = fleet.post("/inference/v1/generate", body).json()
    named = fleet.post("/inference/v1/generate", {**body, "model": "boot"}).json()
    assert named["model"] == "boot" and named["choices"][0]["token_ids"] != plain["choices"][0]["token_ids"]


def test_an_unknown_model_is_a_404_naming_it(fleet: Fleet) -> None:
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        _chat(fleet, "nope")
    r = fleet.post("/inference/v1/generate", {"model": "nope", "token_ids": [1, 2, 3],
                                              "sampling_params": {"max_tokens": 2}})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_load_serve_and_unload_at_run_time(fleet: Fleet, tmp_path: Path) -> None:
    adapter = fake_adapter(tmp_path)
    r = fleet.post("/v1/load_lora_adapter", {"lora_name": "live", "lora_path": str(adapter)})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'live' added successfully."
    assert _chat(fleet, "live").model == "live"
    assert "live" in {m.id for m in fleet.client.models.list().data}
    again = fleet.post("/v1/load_lora_adapter", {"lora_name": "live", "lora_path": str(adapter)})
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    r = fleet.post("/v1/unload_lora_adapter", {"lora_name": "live"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'live' removed successfully."
    with pytest.raises(openai.NotFoundError):
        _chat(fleet, "live")
    gone = fleet.post("/v1/unload_lora_adapter", {"lora_name": "live"})
    assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/load_lora_adapter", {"lora_name": "x"}, "lora_path", "lora_path: this field is required"),
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/p", "load_inplace": True}, "load_inplace",
         "load_inplace=true (new weights under a loaded adapter's name) is not supported"),
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/p", "rank": 8}, "rank", "rank: unknown field"),
        ("/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": "/p"}, "lora_name", "the base model's name"),
        ("/v1/unload_lora_adapter", {"lora_name": 3}, "lora_name", "lora_name: expected `str`, got `int`"),
    ],
)
def test_bad_lora_bodies_name_the_field(fleet: Fleet, path: str, body: dict[str, Any], param: str,
                                        message: str) -> None:
    r = fleet.post(path, body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and r.json()["error"]["param"] == param


def test_run_time_updates_are_off_unless_allowed(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *SIM, "--sim-instant")
    fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint())
    try:
        r = httpx.post(fe.url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/p"}, timeout=30)
        assert r.status_code == 404 and "--allow-runtime-lora-updating" in r.json()["error"]["message"]
    finally:
        fe.stop()
        engine.stop()


def test_an_adapter_loaded_at_run_time_comes_back_on_a_restarted_rank(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, *SIM, "--sim-instant")
    fe = start_frontend(tmp_path, "--data-parallel-size-local", "0", "--engine-addresses", engine.endpoint(),
                        "--allow-runtime-lora-updating")
    fleet = Fleet(engine, fe)
    try:
        adapter = str(fake_adapter(tmp_path))
        assert fleet.post("/v1/load_lora_adapter", {"lora_name": "live", "lora_path": adapter}).status_code == 200
        before = _chat(fleet, "live").choices[0].message.content
        port = engine.port
        engine.stop()
        engine = start_engine(tmp_path, *SIM, "--sim-instant", port=port)
        fe.wait_ready()
        deadline = time.monotonic() + 30
        while True:  # the frontend loads it again once the new session is up
            try:
                after = _chat(fleet, "live").choices[0].message.content
                break
            except openai.APIStatusError:
                assert time.monotonic() < deadline, fe.log()[-3000:]
                time.sleep(0.1)
        assert after == before
        assert "loaded again on engine rank 0 (new session)" in fe.log()
    finally:
        fe.stop()
        engine.stop()
