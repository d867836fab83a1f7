"""Engine configuration: one frozen dataclass built from the command line (`engine --help`)."""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
from dataclasses import dataclass, field, fields, replace
from typing import Literal

import tracing
from protocol.handshake import TOKEN_ENV, auth_token_from

Backend = Literal["vllm", "sim"]
# vLLM's --runner and --convert values (vllm/config/model.py: RunnerOption, ConvertOption).
Runner = Literal["auto", "generate", "pooling"]
Convert = Literal["auto", "none", "embed", "classify"]
GENERATE_BATCHED_TOKENS = 8192  # the default step budget for generation, on both backends
RUNNERS: tuple[Runner, ...] = ("auto", "generate", "pooling")
CONVERTS: tuple[Convert, ...] = ("auto", "none", "embed", "classify")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    backend: Backend
    # As vLLM's flags: the model runner (auto: from the checkpoint) and the adapter that turns a model into
    # a pooling one (auto: from the architecture; embed/classify only with the pooling runner).
    runner: Runner = "auto"
    convert: Convert = "auto"
    host: str = "127.0.0.1"  # loopback: a deployment that needs more says so (compose, k8s: 0.0.0.0)
    port: int = 5555  # ROUTER port of the first local rank; rank i binds port + i
    # PUB port of the first local rank, rank i binds pub_port + i; default: one the OS picks for each rank,
    # announced in Ready (a fixed offset from --port landed on a neighbouring engine's ROUTER ports).
    pub_port: int | None = None
    data_parallel_size_local: int = 1
    data_parallel_start_rank: int = 0
    max_model_len: int | None = None  # default: the model's (capped at 4096 for the sim)
    kv_cache_bytes: int | None = None
    block_size: int | None = None  # default: the backend's (vLLM picks per platform; sim 16)
    max_num_seqs: int = 256
    # None: GENERATE_BATCHED_TOKENS, but for pooling (--runner pooling or --convert) on the vllm backend
    # vLLM's own default, max(2048, max_model_len): vLLM-CPU's step cost grows with this budget and an
    # encoder step is short (a tiny classifier's call took 6 ms at 2048, 115 ms at 16384, offline).
    max_num_batched_tokens: int | None = None
    # The handshake token (from --auth-token-file or ENGINE_AUTH_TOKEN): required when --host is not
    # loopback, unless insecure_no_auth_token. Kept out of repr, so a logged config does not show it.
    auth_token: str | None = field(default=None, repr=False)
    insecure_no_auth_token: bool = False
    heartbeat_interval_s: float = 0.1
    client_timeout_s: float = 5.0  # a frontend silent this long is gone: its requests are aborted
    drain_timeout_s: float = 30.0  # on SIGTERM, how long in-flight requests may still run
    stall_timeout_s: float = 60.0  # liveness beats stop if one engine step runs longer than this
    # An open weight update with no start or update_weights call for this long is abandoned (its client
    # is gone); where the model cannot run meanwhile, the rank fails rather than hold its requests.
    weight_update_timeout_s: float = 600.0
    max_rank_restarts: int = 5  # supervised unit: restarts of one rank within 10 minutes before the unit stops
    seed: int = 0
    max_logprobs: int = 20  # most logprobs / prompt_logprobs alternatives a request may ask for (vLLM's)
    # OTLP traces to this collector (vLLM's --otlp-traces-endpoint); the OTEL_* environment also configures
    # it (tracing/settings.py). None and no OTEL_* endpoint: not traced.
    otlp_traces_endpoint: str | None = None
    # LoRA (vllm backend; vLLM's flags): adapters loaded by the add_lora utility
    enable_lora: bool = False
    max_loras: int = 1  # adapters in one batch
    max_lora_rank: int = 16
    # (name, path) adapters loaded at start, before the handshake: a rank that restarts has them again
    lora_modules: tuple[tuple[str, str], ...] = ()
    # sim backend
    sim_prefill_tps: float = 20000.0
    sim_decode_ms: float = 10.0
    sim_decode_ms_per_seq: float = 0.05
    sim_instant: bool = False
    sim_eos_rate: float = 0.0
    sim_num_kv_blocks: int = 4096
    sim_echo: bool = False
    sim_script: str | None = None  # YAML or JSON rules {match, reply}: scripted replies (backends/sim/script.py)

    @property
    def pooling(self) -> bool:
        """Whether the flags ask for a pooling model (with --runner auto, vLLM may still pick one)."""
        return self.runner == "pooling" or self.convert in ("embed", "classify")

    @property
    def step_token_budget(self) -> int | None:
        """max_num_batched_tokens as a backend takes it: None leaves it to vLLM (pooling models)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return None if self.pooling and self.backend == "vllm" else GENERATE_BATCHED_TOKENS

    def __post_init__(self) -> None:
        _require(self.backend in ("vllm", "sim"), "--backend", self.backend, "vllm or sim")
        _require(self.runner in RUNNERS, "--runner", self.runner, ", ".join(RUNNERS))
        _require(self.convert in CONVERTS, "--convert", self.convert, ", ".join(CONVERTS))
        # vLLM has no converters for the generate runner (_RUNNER_CONVERTS["generate"] is empty).
        _require(self.runner != "generate" or self.convert in ("auto", "none"), "--convert", self.convert,
                 "auto or none with --runner generate (embed and classify adapt a model for --runner pooling)")
        _require(0 < self.port < 65536, "--port", self.port, "1..65535")
        _require(self.data_parallel_size_local >= 1, "--data-parallel-size-local",
                 self.data_parallel_size_local, ">= 1")
        _require(self.data_parallel_start_rank >= 0, "--data-parallel-start-rank",
                 self.data_parallel_start_rank, ">= 0")
        _require(self.port + self.data_parallel_size_local <= 65536, "--port", self.port,
                 "port + data-parallel-size-local <= 65536")
        if self.pub_port is not None:
            k = self.data_parallel_size_local
            _require(0 < self.pub_port and self.pub_port + k <= 65536, "--pub-port", self.pub_port,
                     "1..65535, and pub-port + data-parallel-size-local <= 65536")
            _require(self.pub_port + k <= self.port or self.port + k <= self.pub_port, "--pub-port",
                     self.pub_port, f"a range that misses the ROUTER ports {self.port}..{self.port + k - 1}")
        _require(self.max_model_len is None or self.max_model_len >= 16, "--max-model-len",
                 self.max_model_len, ">= 16")
        _require(self.kv_cache_bytes is None or self.kv_cache_bytes > 0, "--kv-cache-bytes",
                 self.kv_cache_bytes, "> 0")
        _require(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1, "--max-num-batched-tokens",
                 self.max_num_batched_tokens, ">= 1")
        _require(self.block_size in (None, 8, 16, 32, 64, 128), "--block-size", self.block_size,
                 "8, 16, 32, 64 or 128")
        _require(self.heartbeat_interval_s > 0, "--heartbeat-interval", self.heartbeat_interval_s, "> 0")
        _require(self.client_timeout_s > self.heartbeat_interval_s, "--client-timeout",
                 self.client_timeout_s, "> --heartbeat-interval")
        _require(self.drain_timeout_s >= 0, "--drain-timeout", self.drain_timeout_s, ">= 0")
        _require(self.stall_timeout_s > self.heartbeat_interval_s, "--stall-timeout", self.stall_timeout_s,
                 "> --heartbeat-interval")
        _require(self.weight_update_timeout_s > 0, "--weight-update-timeout", self.weight_update_timeout_s, "> 0")
        _require(self.max_rank_restarts >= 0, "--max-rank-restarts", self.max_rank_restarts, ">= 0")
        _require(0 <= self.max_logprobs <= 1024, "--max-logprobs", self.max_logprobs, "0..1024")
        _require(self.max_loras >= 1, "--max-loras", self.max_loras, ">= 1")
        _require(self.max_lora_rank in (1, 8, 16, 32, 64, 128, 256, 320, 512), "--max-lora-rank", self.max_lora_rank,
                 "1, 8, 16, 32, 64, 128, 256, 320 or 512 (vLLM's)")
        _require(not self.lora_modules or self.enable_lora or self.backend == "sim", "--lora-modules",
                 " ".join(f"{n}={p}" for n, p in self.lora_modules), "only with --enable-lora (or --backend sim)")
        names = [n for n, _ in self.lora_modules]
        _require(len(set(names)) == len(names), "--lora-modules", " ".join(names), "distinct adapter names")
        _require(self.sim_script is None or self.backend == "sim", "--sim-script", self.sim_script,
                 "only with --backend sim")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError(f"the auth token (--auth-token-file, --auth-token or ${TOKEN_ENV}) is empty")
        _require(not (self.insecure_no_auth_token and self.auth_token is not None), "--insecure-no-auth-token",
                 True, f"only without a token (one was given: --auth-token-file, --auth-token or ${TOKEN_ENV}); "
                 "drop one of the two")
        _require(self.auth_token is not None or self.insecure_no_auth_token or is_loopback(self.host), "--host",
                 self.host, f"a loopback address (127.0.0.1, ::1, localhost) without a token; to listen on "
                 f"{self.host} give the frontends' shared token (--auth-token-file FILE or ${TOKEN_ENV}), or "
                 "accept that any host reaching the port may pause, abort and reconfigure this engine "
                 "with --insecure-no-auth-token")

    def for_local_rank(self, i: int) -> EngineConfig:
        """The config of one rank process: its own ports and global rank, one rank each."""
        return replace(
            self,
            port=self.port + i,
            pub_port=None if self.pub_port is None else self.pub_port + i,
            data_parallel_start_rank=self.data_parallel_start_rank + i,
            data_parallel_size_local=1,
        )

    @property
    def rank(self) -> int:
        return self.data_parallel_start_rank


def is_loopback(host: str) -> bool:
    """Whether a ZMQ bind address reaches only this machine (a name other than localhost, an interface
    name or `*` may reach further, so they count as beyond loopback)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _require(ok: bool, flag: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{flag}={value!r} is invalid: allowed {allowed}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" where there is a value to show; a flag without one says its default in words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """`engine --help`: defaults are EngineConfig's, written once there."""
    d = {f.name: f.default for f in fields(EngineConfig)}
    p = argparse.ArgumentParser(prog="engine", formatter_class=_HelpFormatter, description="Headless engine: a "
                                "model behind the engine protocol (ZMQ ROUTER per rank + PUB for KV events and load).",
                                allow_abbrev=False)  # a prefix (--mod) must not pass for a flag
    p.add_argument("--headless", action="store_true", help="accepted for vLLM parity; the engine is always headless")
    p.add_argument("--model", required=True, help="'tiny' (built on first use) or a local checkpoint directory")
    p.add_argument("--backend", choices=("vllm", "sim"), default="vllm",
                   help="vllm: vLLM's EngineCore in-process; sim: the simulator (same protocol, a timing model)")
    p.add_argument("--runner", choices=RUNNERS, default=d["runner"],
                   help="the model runner, as vLLM's flag: generate (text generation) or pooling (embeddings, "
                        "class scores: the pooling tasks); auto picks from the checkpoint's architecture")
    p.add_argument("--convert", choices=CONVERTS, default=d["convert"],
                   help="as vLLM's flag: adapt the model for --runner pooling: embed (tasks embed, token_embed) or "
                        "classify (classify, token_classify); none keeps the model's own head; auto picks from the "
                        "architecture (vllm), and serves all four pooling tasks (sim)")
    p.add_argument("--host", default=d["host"],
                   help="address the ROUTER and PUB sockets bind; beyond loopback the handshake token is required "
                        "(--auth-token-file or $" + TOKEN_ENV + ") unless --insecure-no-auth-token")
    p.add_argument("--port", type=int, default=d["port"],
                   help="ROUTER port of the first local rank; rank i binds port + i")
    p.add_argument("--pub-port", type=int, default=d["pub_port"],
                   help="PUB port (KV events, load) of the first local rank; rank i binds pub-port + i. Default: "
                        "a port the OS picks for each rank, so it cannot collide with another engine's; "
                        "frontends learn it from the handshake (Ready.pub_port) and the rank logs it")
    p.add_argument("--data-parallel-size-local", type=int, default=d["data_parallel_size_local"],
                   help="engine ranks this command starts, one process each")
    p.add_argument("--data-parallel-start-rank", type=int, default=d["data_parallel_start_rank"],
                   help="global rank of the first local rank")
    p.add_argument("--max-model-len", type=int, default=d["max_model_len"],
                   help="context length (prompt + output tokens); default: the model's, capped at 4096 for the sim")
    p.add_argument("--kv-cache-bytes", type=int, default=d["kv_cache_bytes"],
                   help="KV-cache size in bytes; default: vLLM's own sizing on GPUs,"
                        " 64 MiB on CPUs, --sim-num-kv-blocks for the sim")
    p.add_argument("--block-size", type=int, default=d["block_size"],
                   help="tokens per KV block (8, 16, 32, 64 or 128); default: the backend's (vLLM picks per "
                        "platform, sim 16)")
    p.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"], help="most requests running at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=d["max_num_batched_tokens"],
                   help="most tokens one engine step processes (default: 8192; vLLM's own for a pooling "
                        "model, with --runner pooling or --convert, on the vllm backend)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="file holding the token frontends must send in their handshake (surrounding whitespace "
                        f"dropped); default: ${TOKEN_ENV}, else none asked (then --host must be loopback)")
    p.add_argument("--auth-token", default=d["auth_token"],
                   help=f"the token itself; it shows in `ps`: prefer --auth-token-file or ${TOKEN_ENV}")
    p.add_argument("--insecure-no-auth-token", action="store_true",
                   help="listen beyond loopback without a token: anyone who reaches the port can pause or abort "
                        "all generation, load adapters and push weights (only behind a network policy that "
                        "admits the frontends alone)")
    p.add_argument("--heartbeat-interval", type=float, default=d["heartbeat_interval_s"], dest="heartbeat_interval_s",
                   help="seconds between Stats heartbeats to every frontend, also when idle")
    p.add_argument("--client-timeout", type=float, default=d["client_timeout_s"], dest="client_timeout_s",
                   help="seconds a frontend may be silent before it counts as gone and its requests are aborted")
    p.add_argument("--drain-timeout", type=float, default=d["drain_timeout_s"], dest="drain_timeout_s",
                   help="on SIGTERM, seconds in-flight requests may still run before they are aborted")
    p.add_argument("--stall-timeout", type=float, default=d["stall_timeout_s"], dest="stall_timeout_s",
                   help="heartbeats stop (peers declare this rank dead) if one step runs longer than this")
    p.add_argument("--weight-update-timeout", type=float, default=d["weight_update_timeout_s"],
                   dest="weight_update_timeout_s",
                   help="seconds an open weight update may go without a start or update_weights call before it "
                        "counts as abandoned; on the vllm backend, whose model cannot run during an update, the "
                        "rank then fails and its supervisor starts it again from the checkpoint")
    p.add_argument("--max-rank-restarts", type=int, default=d["max_rank_restarts"],
                   help="with --data-parallel-size-local > 1: a rank that dies is started again while the others "
                        "serve, up to this many times within 10 minutes; past that (or 0) the unit stops")
    p.add_argument("--seed", type=int, default=d["seed"], help="random seed of the backend")
    p.add_argument("--max-logprobs", type=int, default=d["max_logprobs"],
                   help="most alternatives a request's logprobs or prompt_logprobs may ask for, as vLLM's flag")
    p.add_argument(tracing.FLAG, default=d["otlp_traces_endpoint"], metavar="URL",
                   help="export OpenTelemetry traces over OTLP to this collector (vLLM's flag: grpc unless "
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf): a span per request that carries a "
                        "trace context; OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* variables configure it "
                        "too; default: off")
    p.add_argument("--enable-lora", action="store_true",
                   help="vllm: serve LoRA adapters (vLLM's flag): the add_lora utility loads one, a request names it; "
                        "the sim always serves them (add_lora records a name), with or without this flag")
    p.add_argument("--max-loras", type=int, default=d["max_loras"],
                   help="vllm: most LoRA adapters in one batch (vLLM's flag; with --enable-lora)")
    p.add_argument("--max-lora-rank", type=int, default=d["max_lora_rank"],
                   help="vllm: largest LoRA rank an adapter may have (vLLM's flag; with --enable-lora)")
    p.add_argument("--lora-modules", nargs="+", action="extend", type=_lora_module, default=[],
                   metavar="NAME=PATH",
                   help="LoRA adapters loaded at start, before this engine handshakes (vLLM's flag: NAME=PATH or "
                        "JSON {\"name\": ..., \"path\": ...}); requests name them as their model")
    p.add_argument("--sim-prefill-tps", type=float, default=d["sim_prefill_tps"],
                   help="sim: prompt tokens processed per second")
    p.add_argument("--sim-decode-ms", type=float, default=d["sim_decode_ms"], help="sim: base time of one decode step")
    p.add_argument("--sim-decode-ms-per-seq", type=float, default=d["sim_decode_ms_per_seq"],
                   help="sim: extra decode-step time per running request")
    p.add_argument("--sim-instant", action="store_true", help="sim: steps take no time (the timing model is off)")
    p.add_argument("--sim-eos-rate", type=float, default=d["sim_eos_rate"],
                   help="sim: chance per generated token that it is EOS")
    p.add_argument("--sim-num-kv-blocks", type=int, default=d["sim_num_kv_blocks"], help="sim: KV blocks in the pool")
    p.add_argument("--sim-echo", action="store_true", help="sim: generate the prompt's tokens again")
    p.add_argument("--sim-script", default=d["sim_script"], metavar="FILE",
                   help="sim: scripted replies, a YAML or JSON list of {match: REGEX, reply: TEXT}; the first rule "
                        "whose regex (re.DOTALL) searches the decoded prompt gives the reply, token by token, then "
                        "EOS; it ignores stop_token_ids, min_tokens and ignore_eos, only max_tokens cuts it short; "
                        "other prompts get random tokens")
    return p


def _lora_module(text: str) -> tuple[str, str]:
    """One --lora-modules value: NAME=PATH, or vLLM's JSON form {"name": ..., "path": ...}."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: not JSON ({exc})") from None
        name, path = (spec.get("name"), spec.get("path")) if isinstance(spec, dict) else (None, None)
    else:
        name, _, path = text.partition("=")
    if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PATH or {{\"name\": ..., \"path\": ...}}, "
                                         "both non-empty")
    return name, path


def parse_args(argv: list[str] | None = None) -> EngineConfig:
    p = build_parser()
    ns = vars(p.parse_args(argv))
    ns.pop("headless")
    ns["lora_modules"] = tuple(ns["lora_modules"])
    try:
        tracing.settings_from("engine", os.environ, ns["otlp_traces_endpoint"])  # a bad setting fails here
        ns["auth_token"] = auth_token_from(ns["auth_token"], ns.pop("auth_token_file"), os.environ)
        return EngineConfig(**ns)
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits
