from __future__ import annotations

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
