"""Frontend CPU cost per streamed token with output parsers: N concurrent SSE streams of a scripted reply
(reasoning, text, then tool calls, ~250 tokens) through three frontends over one instant sim engine:
no parser, `--tool-call-parser hermes --reasoning-parser qwen3`, and `--tool-call-parser qwen3_coder`,
in alternating rounds of one run, so the three figures are measured side by side.

Usage: python bench/frontend_parsers.py [--streams 256] [--repeat 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frontend_stream import ROOT, _cpu_seconds, _free_port, wait_ready

REASONING = "<think>\n" + "Let me think about which city and which unit the user wants. " * 8 + "\n</think>\n\n"
ARGS = {"city": "Paris", "unit": "celsius", "days": 5, "detail": "hourly " * 20}
HERMES = (REASONING + "I will look it up.\n" + "".join(
    f'<tool_call>\n{json.dumps({"name": "get_weather", "arguments": ARGS})}\n</tool_call>\n' for _ in range(2)))
CODER = (REASONING + "I will look it up.\n" + "".join(
    "<tool_call>\n<function=get_weather>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in ARGS.items())
    + "</function>\n</tool_call>\n" for _ in range(2)))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string"}, "days": {"type": "integer"},
    "detail": {"type": "string"}}}}}]
MODES = {"no parser": ([], "hermes format"),
         "hermes + qwen3": (["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                             "--reasoning-parser", "qwen3"], "hermes format"),
         "qwen3_coder": (["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"], "coder format")}


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, int]:
    """(completion tokens from the usage chunk, tool-call deltas seen)."""
    tokens = calls = 0
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: {"):
                calls += line.count(b'"tool_calls":[')
                if b'"usage":{' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens, calls


async def _round(base: str, streams: int, prompt: str, tools: bool) -> tuple[int, int]:
    body: dict[str, object] = {"model": "tiny", "messages": [{"role": "user", "content": prompt}],
                               "max_tokens": 2000, "stream": True, "stream_options": {"include_usage": True}}
    if tools:
        body["tools"] = TOOLS
    raw = json.dumps(body).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(*(_one(session, base + "/v1/chat/completions", raw) for _ in range(streams)))
    return sum(t for t, _ in results), sum(c for _, c in results)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps([{"match": "hermes format", "reply": HERMES},
                                      {"match": "coder format", "reply": CODER}]))
        engine_port = _free_port()
        engine = subprocess.Popen([py, "-m", "services.engine", "--headless", "--model", "tiny", "--backend", "sim",
                                   "--sim-instant", "--host", "127.0.0.1", "--port", str(engine_port),
                                   "--pub-port", str(_free_port()), "--max-num-seqs", "1024",
                                   "--sim-script", str(script)], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        frontends: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        try:
            for name, (flags, _) in MODES.items():
                port = _free_port()
                proc = subprocess.Popen([py, "-m", "services.frontend", "--model", "tiny", "--host", "127.0.0.1",
                                         "--port", str(port), "--data-parallel-size-local", "0",
                                         "--engine-addresses", f"tcp://127.0.0.1:{engine_port}",
                                         "--log-level", "warning", *flags], cwd=ROOT)
                frontends[name] = (proc, f"http://127.0.0.1:{port}")
            for name, (_, base) in frontends.items():
                wait_ready(base)
                asyncio.run(_round(base, 8, MODES[name][1], name != "no parser"))  # warm-up
            per_token: dict[str, list[float]] = {name: [] for name in MODES}
            seen: dict[str, int] = {}
            for _ in range(args.repeat):
                for name, (proc, base) in frontends.items():
                    cpu0 = _cpu_seconds(proc.pid)
                    tokens, calls = asyncio.run(_round(base, args.streams, MODES[name][1], name != "no parser"))
                    per_token[name].append((_cpu_seconds(proc.pid) - cpu0) / tokens * 1e6)
                    seen[name] = tokens // args.streams
                    if name != "no parser":
                        assert calls >= 2 * args.streams, f"{name}: {calls} tool-call deltas for {args.streams}"
            print(f"{args.streams} concurrent streams of a scripted reply (reasoning, text, 2 tool calls), "
                  "1 instant sim rank; frontend CPU per streamed token, alternating rounds")
            base_median = statistics.median(per_token["no parser"])
            for name, runs in per_token.items():
                median = statistics.median(runs)
                print(f"  {name:16s} median {median:5.1f} us  x{median / base_median:4.2f}  "
                      f"({seen[name]} tokens/stream; runs: {', '.join(f'{x:.1f}' for x in runs)})")
        finally:
            for proc, _ in frontends.values():  # frontends first: a stopping engine is no news to them then
                proc.send_signal(signal.SIGTERM)
            for proc, _ in frontends.values():
                proc.wait(60)
            engine.send_signal(signal.SIGTERM)
            engine.wait(60)


if __name__ == "__main__":
    main()
