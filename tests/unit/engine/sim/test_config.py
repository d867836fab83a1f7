from __future__ import annotations

import dataclasses

import pytest

from services.engine.backends.sim import SimConfig


def test_defaults_are_valid_and_fields_are_the_cli_contract() -> None:
    config = SimConfig()
    assert [f.name for f in dataclasses.fields(SimConfig)] == [
        "block_size",
        "num_kv_blocks",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "prefill_tps",
        "decode_ms",
        "decode_ms_per_seq",
        "instant",
        "eos_rate",
        "seed",
        "echo",
    ]
    assert (config.block_size, config.num_kv_blocks, config.max_model_len) == (16, 4096, 4096)
    assert config.instant is False and config.eos_rate == 0.0


def test_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SimConfig().block_size = 32  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("block_size", 0, ">= 1"),
        ("num_kv_blocks", -1, ">= 1"),
        ("max_num_seqs", 0, ">= 1"),
        ("max_num_batched_tokens", 0, ">= 1"),
        ("max_model_len", 1, ">= 2"),
        ("block_size", 1.5, ">= 1"),
        ("max_num_seqs", True, ">= 1"),
        ("prefill_tps", 0.0, "(0.0, inf)"),
        ("decode_ms", -1.0, "[0.0, inf)"),
        ("decode_ms_per_seq", float("nan"), "[0.0, inf)"),
        ("eos_rate", 1.5, "[0.0, 1.0]"),
        ("eos_rate", -0.1, "[0.0, 1.0]"),
        ("seed", -1, "[0, 2**64)"),
        ("seed", 2**64, "[0, 2**64)"),
        ("instant", 1, "bool"),
    ],
)
def test_bad_value_names_field_and_range(field: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        SimConfig(**{field: value})  # type: ignore[arg-type]
    message = str(excinfo.value)
    assert message.startswith(field), message
    assert allowed in message, message


def test_budget_must_cover_every_running_sequence() -> None:
    with pytest.raises(ValueError, match=r"max_num_batched_tokens must be >= max_num_seqs \(256\)"):
        SimConfig(max_num_batched_tokens=100)
    SimConfig(max_num_batched_tokens=100, max_num_seqs=100)


def test_pool_must_hold_one_request_of_max_model_len() -> None:
    with pytest.raises(ValueError, match=r"num_kv_blocks \* block_size must be >= max_model_len"):
        SimConfig(num_kv_blocks=10, block_size=16, max_model_len=161)
    SimConfig(num_kv_blocks=10, block_size=16, max_model_len=160)
