from __future__ import annotations

from typing import Any

import pytest

from services.engine.config import EngineConfig, parse_args


def test_cli_flags_map_to_config() -> None:
    c = parse_args(["--headless", "--model", "tiny", "--backend", "sim", "--port", "7000",
                    "--data-parallel-size-local", "2", "--data-parallel-start-rank", "4",
                    "--max-model-len", "512", "--kv-cache-bytes", "1048576", "--sim-instant"])
    assert (c.model, c.backend, c.port, c.data_parallel_size_local, c.rank) == ("tiny", "sim", 7000, 2, 4)
    assert (c.max_model_len, c.kv_cache_bytes, c.sim_instant, c.pub_port) == (512, 1048576, True, None)


def test_each_local_rank_gets_its_ports_and_global_rank() -> None:
    c = EngineConfig(model="tiny", backend="sim", port=7000, data_parallel_size_local=3,
                     data_parallel_start_rank=2)
    r = c.for_local_rank(2)
    assert (r.port, r.pub_port, r.rank, r.data_parallel_size_local) == (7002, None, 4, 1)  # the OS picks it
    fixed = EngineConfig(model="tiny", backend="sim", port=7000, pub_port=9000, data_parallel_size_local=3)
    assert [fixed.for_local_rank(i).pub_port for i in range(3)] == [9000, 9001, 9002]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "0"], "--port=0 is invalid: allowed 1..65535"),
        (["--data-parallel-size-local", "0"], "--data-parallel-size-local=0 is invalid"),
        (["--block-size", "7"], "--block-size=7 is invalid: allowed 8, 16, 32, 64 or 128"),
        (["--client-timeout", "0.05"], "--client-timeout=0.05 is invalid"),
        (["--backend", "tpu"], "invalid choice: 'tpu'"),
        (["--port", "7000", "--pub-port", "7001", "--data-parallel-size-local", "2"],
         "--pub-port=7001 is invalid: allowed a range that misses the ROUTER ports 7000..7001"),
        (["--pub-port", "65535", "--data-parallel-size-local", "2"], "--pub-port=65535 is invalid"),
    ],
)
def test_bad_flags_exit_with_a_message_naming_the_flag(argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "tiny", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_lora_flags_are_vllms_with_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    c = parse_args(["--model", "tiny"])
    assert (c.enable_lora, c.max_loras, c.max_lora_rank) == (False, 1, 16)
    c = parse_args(["--model", "tiny", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"])
    assert (c.enable_lora, c.max_loras, c.max_lora_rank) == (True, 2, 8)
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--max-lora-rank", "12"])
    assert "--max-lora-rank=12 is invalid: allowed 1, 8, 16, 32, 64, 128, 256, 320 or 512" in capsys.readouterr().err


def test_lora_modules_take_vllms_two_forms() -> None:
    c = parse_args(["--model", "tiny", "--backend", "sim", "--lora-modules", "a=/x", '{"name": "b", "path": "/y"}',
                    "--lora-modules", "c=/z=w"])
    assert c.lora_modules == (("a", "/x"), ("b", "/y"), ("c", "/z=w"))
    assert parse_args(["--model", "tiny", "--enable-lora", "--lora-modules", "a=/x"]).lora_modules == (("a", "/x"),)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "sim", "--lora-modules", "a"], "'a': expected NAME=PATH"),
        (["--backend", "sim", "--lora-modules", "=/x"], "'=/x': expected NAME=PATH"),
        (["--backend", "sim", "--lora-modules", '{"name": "a"}'], "expected NAME=PATH"),
        (["--backend", "sim", "--lora-modules", "{nope"], "not JSON"),
        (["--backend", "sim", "--lora-modules", "a=/x", "a=/y"], "--lora-modules='a a' is invalid: allowed distinct"),
        (["--lora-modules", "a=/x"], "--lora-modules='a=/x' is invalid: allowed only with --enable-lora"),
    ],
)
def test_bad_lora_modules_name_the_flag(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "tiny", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_default_bind_is_loopback_and_needs_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGINE_AUTH_TOKEN", raising=False)
    c = parse_args(["--model", "tiny"])
    assert (c.host, c.auth_token) == ("127.0.0.1", None)
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert parse_args(["--model", "tiny", "--host", host]).auth_token is None


@pytest.mark.parametrize("host", ["0.0.0.0", "*", "10.0.0.5", "::", "eth0", "engine-0"])
def test_beyond_loopback_without_a_token_the_engine_refuses_to_start(
        host: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ENGINE_AUTH_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "tiny", "--host", host])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--host={host!r} is invalid: allowed a loopback address" in err
    assert "--auth-token-file" in err and "--insecure-no-auth-token" in err
    # The operator's explicit opt-out, named for its risk.
    c = parse_args(["--model", "tiny", "--host", host, "--insecure-no-auth-token"])
    assert (c.host, c.auth_token, c.insecure_no_auth_token) == (host, None, True)


def test_the_opt_out_with_a_token_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ENGINE_AUTH_TOKEN", "s3cret")
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--host", "0.0.0.0", "--insecure-no-auth-token"])
    assert "--insecure-no-auth-token=True is invalid: allowed only without a token" in capsys.readouterr().err


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ENGINE_AUTH_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    c = parse_args(["--model", "tiny", "--host", "0.0.0.0", "--auth-token-file", str(token)])
    assert c.auth_token == "s3cret"
    assert "s3cret" not in repr(c)  # a logged config does not show it
    monkeypatch.setenv("ENGINE_AUTH_TOKEN", "from-env")
    assert parse_args(["--model", "tiny", "--host", "0.0.0.0"]).auth_token == "from-env"
    assert parse_args(["--model", "tiny", "--auth-token-file", str(token)]).auth_token == "s3cret"  # file first
    for argv, message in (
        (["--auth-token-file", str(tmp_path / "missing")], "--auth-token-file="),
        (["--auth-token-file", str(token), "--auth-token", "x"], "--auth-token-file and --auth-token are exclusive"),
    ):
        with pytest.raises(SystemExit):
            parse_args(["--model", "tiny", *argv])
        assert message in capsys.readouterr().err
    token.write_text(" \n")
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--host", "0.0.0.0", "--auth-token-file", str(token)])
    assert "the auth token (--auth-token-file, --auth-token or $ENGINE_AUTH_TOKEN) is empty" in capsys.readouterr().err


def test_runner_and_convert_are_vllms_flags_with_its_defaults() -> None:
    c = parse_args(["--model", "tiny"])
    assert (c.runner, c.convert) == ("auto", "auto")
    c = parse_args(["--model", "tiny", "--runner", "pooling", "--convert", "classify"])
    assert (c.runner, c.convert) == ("pooling", "classify")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runner", "draft"],
         "argument --runner: invalid choice: 'draft' (choose from 'auto', 'generate', 'pooling')"),
        (["--convert", "reward"],
         "argument --convert: invalid choice: 'reward' (choose from 'auto', 'none', 'embed', 'classify')"),
        (["--runner", "generate", "--convert", "embed"],
         "--convert='embed' is invalid: allowed auto or none with --runner generate"),
    ],
)
def test_bad_runner_or_convert_names_the_flag_and_the_allowed_values(argv: list[str], message: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", *argv])
    assert message in capsys.readouterr().err


def test_runner_checked_in_the_config_too() -> None:
    with pytest.raises(ValueError, match=r"--runner='pool' is invalid: allowed auto, generate, pooling"):
        EngineConfig(model="tiny", backend="sim", runner="pool")  # type: ignore[arg-type]


@pytest.mark.parametrize("argv, budget", [
    ([], 8192),  # generation, either backend
    (["--backend", "sim", "--runner", "pooling"], 8192),  # the sim's timing model needs a number
    (["--backend", "vllm", "--runner", "pooling"], None),  # vLLM's own: its CPU step cost grows with it
    (["--backend", "vllm", "--convert", "classify"], None),
    (["--backend", "vllm", "--runner", "pooling", "--max-num-batched-tokens", "4096"], 4096),  # asked: kept
])
def test_the_step_token_budget_is_vllms_own_for_a_pooling_model(argv: list[str], budget: int | None) -> None:
    assert parse_args(["--model", "tiny", *argv]).step_token_budget == budget
