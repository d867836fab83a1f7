"""The RL-control utilities on the real vLLM backend (CPU, tiny model), one engine for all: LoRA
adapters loaded, used and removed; a weight update streamed from a second checkpoint's safetensors file
(its greedy output then equals vLLM's offline LLM on that checkpoint); sleep refused with its reason."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import GenerateRequest, Outputs, Ready, SamplingParams, UtilityResult
from tests.support.engine_client import EngineClient
from tests.support.procs import EngineProc, start_engine
from tests.support.safetensors_frames import weight_calls

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPTS = [[785, 6722, 315, 9625, 374], list(range(2000, 2040)), [151644, 872, 198, 9707, 11, 879]]
SECOND_SEED = 7


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    pytest.importorskip("vllm")
    proc = start_engine(tmp_path_factory.mktemp("vllm-rl"), "--model", "tiny", "--backend", "vllm",
                        "--max-model-len", "512", "--kv-cache-bytes", str(8 * 2**20),
                        "--enable-lora", "--max-lora-rank", "8")
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def client(engine: EngineProc) -> Iterator[EngineClient]:
    c = EngineClient(engine.endpoint(0))
    ready = c.handshake(timeout_s=60)
    assert isinstance(ready, Ready) and ready.backend == "vllm", ready
    yield c
    c.close()


def greedy(client: EngineClient, tag: str, lora: str | None = None, max_tokens: int = 16) -> list[list[int]]:
    ids = [f"{tag}{i}" for i in range(len(PROMPTS))]
    for rid, prompt in zip(ids, PROMPTS, strict=True):
        client.send(GenerateRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), 0.0,
                                    lora=lora))
    out = client.collect(ids, 120)
    for rid in ids:
        assert out[rid].finish_reason == "length", (rid, out[rid].error)
    return [out[rid].token_ids for rid in ids]


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


def test_sleep_is_refused_with_the_reason(client: EngineClient) -> None:
    r = client.utility("sleep", level=1)
    assert not r.ok and "UtilityUnsupported" in (r.error or "") and "CuMemAllocator" in (r.error or "")
    assert client.utility("is_sleeping").result is False


def test_lora_loaded_listed_used_and_removed(client: EngineClient, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter")
    base = greedy(client, "base")
    assert client.utility("add_lora", name="ad", path=str(adapter), timeout_s=60).ok
    assert client.utility("list_loras").result == ["ad"]
    with_lora = greedy(client, "lora", lora="ad")
    assert with_lora != base
    assert greedy(client, "again", lora="ad") == with_lora  # greedy: the adapter is used the same way
    client.send(GenerateRequest("nope", PROMPTS[0], SamplingParams(max_tokens=4), 0.0, lora="other"))
    refused = client.collect(["nope"], 60)["nope"]
    assert refused.finish_reason == "error" and "lora 'other' is not loaded; loaded: ['ad']" in (refused.error or "")
    assert client.utility("remove_lora", name="ad", timeout_s=60).result is True
    assert client.utility("list_loras").result == []
    assert greedy(client, "after") == base


def test_pause_modes_on_vllm(client: EngineClient) -> None:
    """keep: frozen mid-generation, then the same greedy tokens as without a pause; abort: the running
    request ends "abort"; wait: the reply comes after the running request finished."""
    [reference] = greedy(client, "ref", max_tokens=48)[:1]
    client.generate("k", PROMPTS[0], max_tokens=48, temperature=0.0)
    first = client.recv(60)
    assert isinstance(first, Outputs)
    assert client.utility("pause").result == {"paused": True, "mode": "keep", "aborted": 0}
    client.generate("held", PROMPTS[1], max_tokens=4, temperature=0.0)
    assert client.utility("is_paused").result == {"paused": True, "mode": "keep", "held": 1}
    assert client.utility("resume").result is True
    early = [t for m in [first, *client.others] if isinstance(m, Outputs) for o in m.outputs
             if o.request_id == "k" for t in o.new_token_ids]
    client.others.clear()
    done = client.collect(["k", "held"], 120)
    assert early + done["k"].token_ids == reference and done["held"].finish_reason == "length"

    client.generate("a", PROMPTS[0], max_tokens=400, temperature=0.0)
    assert isinstance(client.recv(60), Outputs)
    assert client.utility("pause", mode="abort").result == {"paused": True, "mode": "abort", "aborted": 1}
    finished = [o.finish_reason for m in client.others if isinstance(m, Outputs) for o in m.outputs
                if o.request_id == "a" and o.finish_reason is not None]
    client.others.clear()
    assert finished == ["abort"]
    assert client.utility("resume").ok

    client.generate("w", PROMPTS[0], max_tokens=24, temperature=0.0)
    assert isinstance(client.recv(60), Outputs)
    call = client.send_utility("pause", mode="wait")
    order = []
    while True:
        msg = client.recv(60)
        if isinstance(msg, UtilityResult) and msg.call_id == call:
            assert msg.result == {"paused": True, "mode": "wait", "aborted": 0}
            break
        if isinstance(msg, Outputs):
            order += [o.finish_reason for o in msg.outputs if o.finish_reason is not None]
    assert order == ["length"]
    assert client.utility("resume").ok


def test_weight_update_from_a_second_checkpoint_equals_offline_llm_on_it(client: EngineClient,
                                                                        tmp_path: Path) -> None:
    import vllm

    import checkpoints.tiny as tiny

    second = tiny.write_checkpoint(tmp_path / "second", seed=SECOND_SEED)
    before = greedy(client, "w0")
    assert client.utility("weight_version").result == "0"
    r = client.utility("update_weights", tensors=[])
    assert not r.ok and "no weight update is open; call start_weight_update first" in (r.error or "")
    assert client.utility("start_weight_update").result is True
    r = client.utility("start_weight_update")
    assert not r.ok and "already open" in (r.error or "")
    total = 0
    for args, frames in weight_calls(second / tiny.WEIGHTS_FILE, per_call=4):
        r = client.utility("update_weights", frames=frames, timeout_s=60, **args)
        assert r.ok, r.error
        assert r.result == {"tensors": len(args["tensors"]), "bytes": sum(len(f) for f in frames)}
        total += r.result["bytes"]
    assert total == sum(len(f) for _, fs in weight_calls(second / tiny.WEIGHTS_FILE) for f in fs)
    assert client.utility("finish_weight_update", version="step-1", timeout_s=60).result == {"version": "step-1"}
    assert client.utility("weight_version").result == "step-1"
    after = greedy(client, "w1")
    assert after != before
    llm = vllm.LLM(model=str(second), max_model_len=512, kv_cache_memory_bytes=4 * 2**20, enforce_eager=True,
                   dtype="bfloat16", seed=0)
    try:
        refs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                            vllm.SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    finally:
        del llm
    assert after == [list(ref.outputs[0].token_ids) for ref in refs]
