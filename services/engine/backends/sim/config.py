"""Settings of the sim backend: pool and batch sizes vLLM would have, and the timing model.

Built by the engine CLI in the engine process; validated here so a bad flag fails at start.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimConfig:
    block_size: int = 16
    num_kv_blocks: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    prefill_tps: float = 20000.0  # prompt tokens computed per second
    decode_ms: float = 10.0  # base cost of a step in which any sequence decodes
    decode_ms_per_seq: float = 0.05  # added per sequence in such a step's batch
    instant: bool = False  # every step takes 0 s (frontend benchmarks)
    eos_rate: float = 0.0  # chance per generated token to be EOS
    seed: int = 0
    echo: bool = False  # generate the prompt's tokens again, in order (scripted output)

    def __post_init__(self) -> None:
        _int_at_least("block_size", self.block_size, 1)
        _int_at_least("num_kv_blocks", self.num_kv_blocks, 1)
        _int_at_least("max_num_seqs", self.max_num_seqs, 1)
        _int_at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _int_at_least("max_model_len", self.max_model_len, 2)
        _float_in("prefill_tps", self.prefill_tps, 0.0, float("inf"), low_open=True)
        _float_in("decode_ms", self.decode_ms, 0.0, float("inf"))
        _float_in("decode_ms_per_seq", self.decode_ms_per_seq, 0.0, float("inf"))
        _float_in("eos_rate", self.eos_rate, 0.0, 1.0)
        if not isinstance(self.instant, bool):
            raise ValueError(f"instant must be a bool, got {self.instant!r}")
        seed = self.seed
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {self.seed!r}")
        # As vLLM: every running sequence must be able to decode in one step.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens must be >= max_num_seqs ({self.max_num_seqs}), "
                f"got {self.max_num_batched_tokens}"
            )
        # A request of max_model_len tokens must fit the pool on its own, or it could never run.
        capacity = self.num_kv_blocks * self.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"num_kv_blocks * block_size must be >= max_model_len ({self.max_model_len}), "
                f"got {self.num_kv_blocks} * {self.block_size} = {capacity}"
            )


def _int_at_least(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _float_in(
    name: str, value: object, low: float, high: float, *, low_open: bool = False
) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        bracket = "(" if low_open else "["
        upper = "inf)" if high == float("inf") else f"{high}]"
        raise ValueError(f"{name} must be a number in {bracket}{low}, {upper}, got {value!r}")
