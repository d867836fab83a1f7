"""The gRPC services on the real vLLM backend (CPU, tiny model), driven by the generated client: one
engine (--enable-lora) behind a frontend with --grpc-port. Generate's greedy output equals vLLM's
offline LLM; pause keep/abort/wait with a stream in flight (a frozen greedy stream continues with the
very tokens it gives unpaused); a LoRA adapter generated here loaded, listed, used and unloaded, and
adapters served over HTTP by model name (the engine's --lora-modules, /v1/load_lora_adapter); a
weight update streamed through UpdateWeights from a second checkpoint, after which greedy output equals
vLLM's offline LLM on that checkpoint and GetWeightVersion moved; sleep refused with its reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest

import checkpoints.tiny as tiny
from protocol.grpc import pb2, pb2_grpc, tensor_messages
from tests.support.procs import FrontendProc, free_port_block, start_frontend
from tests.support.safetensors_frames import weight_calls
from tests.vllm.conftest import Reaper

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPTS = [[785, 6722, 315, 9625, 374], list(range(2000, 2040)), [151644, 872, 198, 9707, 11, 879]]
SECOND_SEED = 7


class Fleet:
    def __init__(self, frontend: FrontendProc, port: int, second: OfflineReference) -> None:
        self.frontend = frontend
        self.second = second  # vLLM's offline LLM on the weight update's checkpoint, started with the fleet
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.inference = pb2_grpc.InferenceStub(self.channel)
        self.control = pb2_grpc.ControlStub(self.channel)
        self.rl = pb2_grpc.RlControlStub(self.channel)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, reaper: Reaper) -> Iterator[Fleet]:
    pytest.importorskip("vllm")
    engine_port, grpc_port = free_port_block(1), free_port_block(1)
    tmp = tmp_path_factory.mktemp("vllm-grpc")
    boot = write_adapter(tmp / "boot")  # loaded by the engine's --lora-modules, before its handshake
    # The reference for the weight update's test: a vLLM start-up of its own, run while this fleet's
    # starts and the module's other tests run, not after them.
    second = OfflineReference(tiny.write_checkpoint(tmp / "second", seed=SECOND_SEED), tmp / "second.log")
    try:
        fe = start_frontend(tmp, "--backend", "vllm", "--data-parallel-size-local", "1",
                            "--engine-port", str(engine_port), "--engine-arg=--max-model-len=512",
                            f"--engine-arg=--kv-cache-bytes={8 * 2**20}", "--engine-arg=--enable-lora",
                            "--engine-arg=--max-lora-rank=8", "--engine-arg=--max-loras=2",
                            f"--engine-arg=--lora-modules=boot={boot}", "--allow-runtime-lora-updating",
                            "--grpc-port", str(grpc_port))
        f = Fleet(fe, grpc_port, second)
        yield f
        f.channel.close()
    finally:
        second.stop()
    reaper.stop(fe)  # its exit code 0 checked at the session's end: it takes seconds to stop its engine


def _req(prompt: list[int], max_tokens: int = 16, **kw: Any) -> Any:
    return pb2.GenerateRequest(token_ids=prompt, sampling_params=pb2.SamplingParams(max_tokens=max_tokens,
                                                                                   temperature=0.0), **kw)


def greedy(fleet: Fleet, lora: str = "", max_tokens: int = 16) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        r = fleet.inference.Generate(_req(prompt, max_tokens, lora_name=lora), timeout=120)
        assert r.finish_reason == "length", r
        out.append(list(r.token_ids))
    return out


def offline(llm: Any, max_tokens: int = 16) -> list[list[int]]:
    import vllm
    refs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], vllm.SamplingParams(temperature=0,
                                                                                        max_tokens=max_tokens),
                        use_tqdm=False)
    return [list(ref.outputs[0].token_ids) for ref in refs]


def test_generate_equals_vllm_offline_llm(fleet: Fleet, llm: Any) -> None:
    assert greedy(fleet) == offline(llm)
    streamed = [t for c in fleet.inference.GenerateStream(_req(PROMPTS[1]), timeout=120) for t in c.token_ids]
    assert streamed == offline(llm)[1]
    info = fleet.control.GetModelInfo(pb2.GetModelInfoRequest())
    assert info.backend == "vllm" and info.max_model_len == 512


def test_sleep_is_unimplemented_with_the_reason(fleet: Fleet) -> None:
    with pytest.raises(grpc.RpcError) as err:
        fleet.rl.Sleep(pb2.SleepRequest(level=1))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED and "CuMemAllocator" in err.value.details()
    assert not fleet.rl.IsSleeping(pb2.IsSleepingRequest()).sleeping


def write_adapter(dest: Path, rank: int = 8) -> Path:
    """A random PEFT LoRA adapter for the tiny Qwen3's q_proj and v_proj, B non-zero (it changes output)."""
    import torch
    from safetensors.torch import save_file

    import checkpoints.tiny as tiny

    c = tiny.CONFIG
    h, hd = c["hidden_size"], c["head_dim"]
    outs = {"q_proj": c["num_attention_heads"] * hd, "v_proj": c["num_key_value_heads"] * hd}
    gen = torch.Generator().manual_seed(3)
    tensors = {}
    for i in range(c["num_hidden_layers"]):
        for module, out in outs.items():
            p = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{p}.lora_A.weight"] = torch.randn(rank, h, generator=gen) * 0.5
            tensors[f"{p}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.5
    dest.mkdir(parents=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    (dest / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(outs), "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
        "base_model_name_or_path": "tiny",
    }))
    return dest


def test_lora_loaded_listed_used_and_unloaded(fleet: Fleet, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter")
    base = greedy(fleet)
    fleet.control.LoadLora(pb2.LoadLoraRequest(name="ad", path=str(adapter)), timeout=60)
    assert list(fleet.control.ListLoras(pb2.ListLorasRequest()).names) == ["ad", "boot"]
    with_lora = greedy(fleet, lora="ad")
    assert with_lora != base
    assert greedy(fleet, lora="ad") == with_lora  # greedy: the adapter is used the same way each time
    with pytest.raises(grpc.RpcError) as err:
        fleet.inference.Generate(_req(PROMPTS[0], lora_name="other"), timeout=60)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "lora_name 'other': no such LoRA adapter is loaded" in err.value.details()
    fleet.control.UnloadLora(pb2.UnloadLoraRequest(name="ad"), timeout=60)
    assert list(fleet.control.ListLoras(pb2.ListLorasRequest()).names) == ["boot"]
    assert greedy(fleet) == base


def _http_generate(fleet: Fleet, model: str, prompt: list[int]) -> httpx.Response:
    return httpx.post(fleet.frontend.url + "/inference/v1/generate", timeout=120, json={
        "model": model, "token_ids": prompt, "sampling_params": {"max_tokens": 16, "temperature": 0.0}})


def test_lora_adapters_by_model_name_over_http(fleet: Fleet, tmp_path: Path) -> None:
    """`model` naming an adapter, as vLLM serves it: the engine's --lora-modules one and one loaded through
    /v1/load_lora_adapter (the same weights: write_adapter is seeded), each equal to gRPC's lora_name."""
    by_grpc = greedy(fleet, lora="boot")
    assert by_grpc != greedy(fleet)
    answer = _http_generate(fleet, "boot", PROMPTS[1]).json()
    assert answer["model"] == "boot" and answer["choices"][0]["token_ids"] == by_grpc[1]
    client = openai.OpenAI(base_url=fleet.frontend.url + "/v1", api_key="none", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="boot", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0)
    assert chat.model == "boot" and chat.usage is not None and chat.usage.completion_tokens == 4
    models = {m.id: m for m in client.models.list().data}
    assert models["boot"].parent == "tiny"  # type: ignore[attr-defined]
    live = write_adapter(tmp_path / "live")
    r = httpx.post(fleet.frontend.url + "/v1/load_lora_adapter", json={"lora_name": "live", "lora_path": str(live)},
                   timeout=120)
    assert r.status_code == 200, r.text
    assert _http_generate(fleet, "live", PROMPTS[1]).json()["choices"][0]["token_ids"] == by_grpc[1]
    bad = httpx.post(fleet.frontend.url + "/v1/load_lora_adapter", timeout=120,
                     json={"lora_name": "bad", "lora_path": str(tmp_path / "nowhere")})
    assert bad.status_code == 400 and "no adapter_config.json there" in bad.json()["error"]["message"], bad.text
    assert httpx.post(fleet.frontend.url + "/v1/unload_lora_adapter", json={"lora_name": "live"},
                      timeout=60).status_code == 200
    assert _http_generate(fleet, "live", PROMPTS[1]).status_code == 404


def _stream(fleet: Fleet, prompt: list[int], max_tokens: int, out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            out.extend(fleet.inference.GenerateStream(_req(prompt, max_tokens), timeout=120))
        except grpc.RpcError as exc:
            out.append(exc)
    t = threading.Thread(target=run)
    t.start()
    return t


def _wait(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_pause_modes_with_a_stream_in_flight(fleet: Fleet) -> None:
    reference = list(fleet.inference.Generate(_req(PROMPTS[0], 48), timeout=120).token_ids)
    chunks: list[Any] = []
    t = _stream(fleet, PROMPTS[0], 48, chunks)
    _wait(lambda: len(chunks) > 0)
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_KEEP))
    held: list[Any] = []
    t2 = _stream(fleet, PROMPTS[1], 4, held)
    _wait(lambda: fleet.rl.IsPaused(pb2.IsPausedRequest()).held == 1)
    frozen = len(chunks)
    time.sleep(0.3)
    assert len(chunks) == frozen and not held
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest())
    t.join(120)
    t2.join(120)
    assert [tok for c in chunks for tok in c.token_ids] == reference
    assert held[-1].finish_reason == "length"

    aborted: list[Any] = []
    t = _stream(fleet, PROMPTS[0], 400, aborted)
    _wait(lambda: len(aborted) > 0)
    assert fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_ABORT)).aborted == 1
    t.join(60)
    assert aborted[-1].finish_reason == "abort" if not isinstance(aborted[-1], grpc.RpcError) else True
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest())

    waited: list[Any] = []
    t = _stream(fleet, PROMPTS[0], 24, waited)
    _wait(lambda: len(waited) > 0)
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_WAIT), timeout=120)
    t.join(5)
    assert not t.is_alive() and waited[-1].finish_reason == "length"
    assert fleet.rl.IsPaused(pb2.IsPausedRequest()).paused
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest())


def test_update_weights_from_a_second_checkpoint_equals_offline_llm_on_it(fleet: Fleet) -> None:
    second = fleet.second.checkpoint
    before = greedy(fleet)
    assert fleet.rl.GetWeightVersion(pb2.GetWeightVersionRequest()).version == "0"
    fleet.rl.PauseGeneration(pb2.PauseGenerationRequest(mode=pb2.PAUSE_MODE_WAIT), timeout=60)
    fleet.rl.StartWeightUpdate(pb2.StartWeightUpdateRequest())
    # A tensor larger than the server's message limit (the embedding here) goes in pieces.
    limit = fleet.control.GetServerInfo(pb2.GetServerInfoRequest()).max_message_bytes
    tensors = [tensor_messages(t["name"], t["dtype"], t["shape"], frame, limit)
               for args, frames in weight_calls(second / tiny.WEIGHTS_FILE)
               for t, frame in zip(args["tensors"], frames, strict=True)]
    assert any(len(pieces) > 1 for pieces in tensors)
    resp = fleet.rl.UpdateWeights(iter([m for pieces in tensors for m in pieces]), timeout=120)
    assert resp.tensors == len(tensors) and resp.bytes == sum(len(m.data) for pieces in tensors for m in pieces)
    assert fleet.rl.FinishWeightUpdate(pb2.FinishWeightUpdateRequest(version="step-1"), timeout=60).version == "step-1"
    fleet.rl.ResumeGeneration(pb2.ResumeGenerationRequest())
    assert fleet.rl.GetWeightVersion(pb2.GetWeightVersionRequest()).version == "step-1"
    after = greedy(fleet)
    assert after != before
    assert after == fleet.second.token_ids()


class OfflineReference:
    """vLLM's offline LLM on `checkpoint`, greedy over PROMPTS, in a process of its own, started at once and
    read by token_ids: a second LLM in this process would tear down the distributed state the package's
    `llm` fixture runs on."""

    def __init__(self, checkpoint: Path, log: Path) -> None:
        self.checkpoint = checkpoint
        code = f"""
import json, os
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import vllm
llm = vllm.LLM(model={str(checkpoint)!r}, max_model_len=512, kv_cache_memory_bytes=4 * 2**20, enforce_eager=True,
               dtype="bfloat16", seed=0)
outs = llm.generate([{{"prompt_token_ids": p}} for p in {PROMPTS!r}],
                    vllm.SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
print("IDS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""
        self._log = log
        with open(log, "wb") as out:  # a file, not a pipe: nothing reads it while vLLM starts
            self._proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, "HF_HUB_OFFLINE": "1"})

    def token_ids(self) -> list[list[int]]:
        self._proc.wait(timeout=300)
        said = self._log.read_text(errors="replace")
        lines = [line for line in said.splitlines() if line.startswith("IDS ")]
        assert self._proc.returncode == 0 and lines, said[-3000:]
        return json.loads(lines[-1][4:])

    def stop(self) -> None:
        """Kills it if it still runs (the test that reads it failed before it, or did not run)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
