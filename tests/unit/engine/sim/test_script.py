from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.engine.backends.sim.script import Script, ScriptError, load_script
from services.engine.config import EngineConfig, parse_args

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def encode(text: str) -> list[int]:  # one token per character: easy to read in assertions
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(path: Path) -> Script:
    return load_script(path, encode, decode)


def test_yaml_rules_load_in_order_with_replies_tokenized(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", "- match: weather\n  reply: sunny\n- {match: '.', reply: fallback}\n")
    script = load(path)
    assert [r.pattern.pattern for r in script.rules] == ["weather", "."]
    assert [r.reply for r in script.rules] == ["sunny", "fallback"]
    assert script.rules[0].reply_ids == tuple(encode("sunny"))


def test_json_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path, "s.json", json.dumps([{"match": "Paris", "reply": TOOL_CALL}]))
    assert load(path).rules[0].reply == TOOL_CALL


def test_first_matching_rule_wins_and_no_match_is_none(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", "- {match: 'weather', reply: one}\n- {match: 'weather|time', reply: two}\n")
    script = load(path)
    assert script.reply_for(encode("the weather and the time")) == tuple(encode("one"))
    assert script.reply_for(encode("what time is it")) == tuple(encode("two"))
    assert script.reply_for(encode("hello")) is None


def test_match_searches_anywhere_and_dot_matches_newlines(tmp_path: Path) -> None:
    script = load(write(tmp_path, "s.yaml", "- {match: 'user.*Paris', reply: hit}\n"))
    assert script.reply_for(encode("<|im_start|>user\nweather in Paris?<|im_end|>")) == tuple(encode("hit"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {match: a, reply: b}\n- [not, a, mapping]\n", "rule 1: expected a mapping"),
        ("- {match: a, reply: b}\n- {match: a}\n", "rule 1: reply must be a non-empty string"),
        ("- {match: '', reply: b}\n", "rule 0: match must be a non-empty string"),
        ("- {match: a, reply: 3}\n", "rule 0: reply must be a non-empty string"),
        ("- {match: a, reply: b}\n- {match: a, reply: b}\n- {match: '(unclosed', reply: b}\n",
         "rule 2: match '(unclosed' is not a valid regex"),
        ("- {match: a, reply: b, finish: length}\n", "rule 0: unknown key(s) ['finish']"),
        ("{match: a, reply: b}\n", "expected a non-empty list of rules"),
        ("[]\n", "expected a non-empty list of rules {match: REGEX, reply: TEXT}, got an empty list"),
        ("", "expected a non-empty list of rules"),
        ("- {match: a, reply: [b\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_file_and_the_rule(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ScriptError) as info:
        load(path)
    assert str(info.value).startswith(f"--sim-script {str(path)!r}: ")
    assert message in str(info.value)


def test_bad_json_and_missing_file_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.json", '[{"match": "a", "reply": "b"},]')
    with pytest.raises(ScriptError, match=r"bad\.json'?: not valid JSON"):
        load(path)
    with pytest.raises(ScriptError, match=r"absent\.yaml'?: cannot read the file"):
        load(tmp_path / "absent.yaml")


def test_reply_with_no_tokens_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", "- {match: a, reply: b}\n- {match: a, reply: ' '}\n")
    with pytest.raises(ScriptError, match="rule 1: reply ' ' tokenizes to no tokens"):
        load_script(path, lambda text: encode(text.strip()), decode)


def test_flag_is_sim_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--model", "tiny", "--backend", "sim", "--sim-script", "s.yaml"]).sim_script == "s.yaml"
    assert parse_args(["--model", "tiny", "--backend", "sim"]).sim_script is None
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", "tiny", "--backend", "vllm", "--sim-script", "s.yaml"])
    assert info.value.code == 2
    assert "--sim-script='s.yaml' is invalid: allowed only with --backend sim" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--sim-script"):
        EngineConfig(model="tiny", backend="vllm", sim_script="s.yaml")


def test_wiring_uses_the_model_tokenizer_and_keeps_added_tokens(tmp_path: Path) -> None:
    """The tiny model's Qwen3 tokenizer: <tool_call> is one added token and decodes back as text."""
    from tokenizers import Tokenizer

    import checkpoints
    from services.engine.wiring import build_backend

    path = write(tmp_path, "s.yaml", json.dumps([{"match": "get_weather", "reply": TOOL_CALL}]))
    sim, _ = build_backend(EngineConfig(model="tiny", backend="sim", sim_script=str(path)))
    script = sim._script  # type: ignore[attr-defined]
    assert isinstance(script, Script)
    tokenizer = Tokenizer.from_file(str(checkpoints.resolve("tiny") / "tokenizer.json"))
    reply = list(script.rules[0].reply_ids)
    assert reply[0] == tokenizer.token_to_id("<tool_call>") and reply[-1] == tokenizer.token_to_id("</tool_call>")
    assert tokenizer.decode(reply, skip_special_tokens=False) == TOOL_CALL
    prompt = tokenizer.encode("<|im_start|>user\ncall get_weather<|im_end|>", add_special_tokens=False).ids
    assert script.reply_for(prompt) == tuple(reply)


def test_wiring_refuses_a_bad_file_at_build(tmp_path: Path) -> None:
    from services.engine.wiring import build_backend

    path = write(tmp_path, "s.yaml", "- {match: ok, reply: fine}\n- {match: '[', reply: x}\n")
    with pytest.raises(ValueError, match=r"s\.yaml'?: rule 1: match '\[' is not a valid regex"):
        build_backend(EngineConfig(model="tiny", backend="sim", sim_script=str(path)))
