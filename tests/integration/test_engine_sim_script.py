"""`--sim-script` through a real engine process: scripted replies come out token by token, as the model's
tokenizer spells them, so tool-call parsing can be tested without a model."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

import checkpoints
from protocol import Ready
from tests.integration.conftest import SIM
from tests.support.engine_client import EngineClient
from tests.support.procs import start_engine

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
RULES = [{"match": r"<\|im_start\|>user\n[^<]*weather", "reply": TOOL_CALL}, {"match": "weather", "reply": "no"}]


def test_scripted_reply_is_the_reply_text_exactly(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_file(str(checkpoints.resolve("tiny") / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|im_end|>")
    reply_ids = tokenizer.encode(TOOL_CALL, add_special_tokens=False).ids
    assert tokenizer.token_to_id("<tool_call>") in reply_ids  # one added token, not its characters

    script = tmp_path / "script.yaml"
    script.write_text(json.dumps(RULES))  # JSON is YAML too
    engine = start_engine(tmp_path, *SIM, "--sim-decode-ms", "1", "--sim-script", str(script))
    c = EngineClient(engine.endpoint())
    try:
        assert isinstance(c.handshake(timeout_s=60), Ready)
        prompt = tokenizer.encode("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
                                  "<|im_start|>assistant\n", add_special_tokens=False).ids
        other = tokenizer.encode("Tell me a story.", add_special_tokens=False).ids
        c.generate("tool", prompt, max_tokens=200)
        c.generate("cut", prompt, max_tokens=4)
        c.generate("random", other, max_tokens=6)
        res = c.collect(["tool", "cut", "random"])
        tool = res["tool"]
        assert (tool.finish_reason, tool.stop_reason) == ("stop", None)
        assert tool.token_ids == reply_ids + [eos]  # EOS last, as if the model had sampled it
        assert tokenizer.decode(tool.token_ids[:-1], skip_special_tokens=False) == TOOL_CALL
        assert tokenizer.decode(tool.token_ids, skip_special_tokens=True) == TOOL_CALL  # the frontend's default
        assert len(tool.steps) == len(tool.token_ids) == len(set(tool.steps))  # one token per step
        assert (res["cut"].token_ids, res["cut"].finish_reason) == (reply_ids[:4], "length")
        assert len(res["random"].token_ids) == 6 and res["random"].finish_reason == "length"
        assert res["random"].token_ids != reply_ids[:6]
    finally:
        c.close()
        engine.stop()


def test_bad_script_stops_the_engine_naming_file_and_rule(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("- {match: ok, reply: fine}\n- {match: '(', reply: x}\n")
    engine = start_engine(tmp_path, *SIM, "--sim-script", str(script), wait=False)
    assert engine.proc.wait(60) == 2
    assert f"--sim-script {str(script)!r}: rule 1: match '(' is not a valid regex" in engine.log()
