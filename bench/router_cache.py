"""Router prefix-cache hit rate and TTFT on a shared-prefix workload over real instances: 32 groups x 8
prompts sharing a ~2,000-token prefix (Qwen3 tokenizer), sent in shuffled order through a router pool
of 4 instances (a frontend over its own sim engine each, realistic timing), once per pool policy with
fresh instances.

Hit rate = sum(cached_tokens) / sum(prompt_tokens), from each stream's usage. Best = the same for an
unlimited cache with every request on the instance that already served its prefix: per request, the
longest token prefix shared with any request sent before it, in whole blocks, because the sim (as
vLLM) caches full blocks only and always computes a prompt's last token. Each instance's KV cache
holds about 12 of the 32 prefixes (--kv-blocks), so a policy that spreads a group over instances
also evicts. precise_prefix (the router tokenizes each request as the frontend does and scores the
blocks each instance's engine reports stored over the frontend's KvEvents gRPC stream) runs beside
cache_aware (the router's guess from request text); round_robin is the baseline the issue names;
least_outstanding (the pool default) is shown too. Every run's frontends serve --grpc-port.
Usage: .venv/bin/python bench/router_cache.py [--groups 32] [--per-group 8] [--concurrency 16] [--routers 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timing import percentile  # noqa: E402

from services.frontend.model import Model  # noqa: E402
from tests.support.procs import (  # noqa: E402
    EngineProc,
    FrontendProc,
    HttpProc,
    free_port_block,
    start_engine,
    start_frontend,
    start_router,
)

BLOCK = 16  # the sim's default block size
TARGET_RATIO = 0.90  # cache_aware hit rate within 10% of the best possible
WORDS = """
river mountain copper lantern harvest orbit velvet thunder meadow glacier compass falcon ember quartz
harbor willow canyon saffron beacon marble prairie tundra cobalt juniper violet anchor summit lagoon
cedar granite feather voyage circuit pepper cinnamon horizon island jungle kettle ladder magnet needle
ocean pillar quiver rocket saddle timber umbrella valley wagon yonder zephyr almond bridge candle
desert engine forest garden hammer insect jacket kingdom lemon mirror nickel orchard pencil quarry
ribbon silver tunnel uniform vessel window yellow zipper archive budget census digest ledger memo
invoice payroll quarterly revenue margin forecast audit clause statute tariff treaty verdict witness
protein enzyme neuron plasma photon proton crystal fossil magma nebula comet asteroid eclipse spectrum
algorithm compiler kernel socket buffer thread mutex cache vector matrix tensor gradient lattice
graph queue stack packet router switch firewall latency bandwidth throughput replica shard cluster
chapter novel poem stanza verse chorus melody rhythm tempo sonnet fable legend myth saga epic
carefully quickly slowly quietly boldly gently rarely often always never sometimes perhaps
although because however therefore meanwhile moreover nevertheless otherwise whereas unless
ancient modern subtle vivid fragile robust hollow dense brisk humid arid fertile barren lucid
measure gather follow explain compare imagine wander borrow reflect balance observe predict
""".split()


@dataclass(slots=True)
class Prompt:
    group: int
    text: str
    ids: list[int]


@dataclass(slots=True, eq=False)
class Result:
    group: int
    status: int
    ttft_ms: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    replica: str = ""
    error: str = ""


@dataclass(slots=True)
class Run:
    policy: str
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0


# ---- workload ----


class TokenCount:
    def __init__(self, model: Model) -> None:
        self.model = model

    def __call__(self, text: str) -> int:
        return len(self.model.encode(text, add_special_tokens=False))

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids as the frontend makes them for one user message (chat template, no specials)."""
        rendered = self.model.template.render([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.model.encode(rendered, add_special_tokens=False)


def _sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, k=rng.randint(6, 16))
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 9999)))
    return " ".join(words).capitalize() + rng.choice(".....;?!")


def _prefix(rng: random.Random, group: int, tokens: int, count: TokenCount) -> str:
    """About `tokens` tokens of varied sentences (the most whole sentences that fit)."""
    sentences = [f"Dossier {group}."]
    while count(" ".join(sentences)) < tokens:
        sentences += [_sentence(rng) for _ in range(20)]
    lo, hi = 1, len(sentences)
    while lo < hi:  # bisect on whole sentences: the longest text within `tokens`
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(" ".join(sentences[:mid])) <= tokens else (lo, mid - 1)
    return " ".join(sentences[:lo])


def workload(seed: int, groups: int, per_group: int, prefix_tokens: int) -> tuple[list[Prompt], float]:
    """Prompts in send order (shuffled), and the mean prefix length in tokens."""
    rng = random.Random(seed)
    count = TokenCount(Model.load("tiny", "tiny"))
    prompts, lengths = [], []
    for g in range(groups):
        prefix = _prefix(rng, g, prefix_tokens, count)
        lengths.append(count(prefix))
        for _ in range(per_group):
            a, b = rng.sample(WORDS, 2)
            question = f"\n\nQuestion {len(prompts)}: what does the dossier say about {a} and {b}?"
            prompts.append(Prompt(g, prefix + question, count.prompt_ids(prefix + question)))
    rng.shuffle(prompts)
    return prompts, statistics.mean(lengths)


def best_cached(prompts: list[Prompt], block: int = BLOCK) -> list[int]:
    """Per prompt in send order: tokens an unlimited cache could serve, as the sim counts them
    (chained full-block hashes, at most (n - 1) // block blocks)."""
    seen: set[int] = set()
    out = []
    for p in prompts:
        ids, key, hit, missed = p.ids, 0, 0, False
        for i in range(len(ids) // block):
            key = hash((key, tuple(ids[i * block:(i + 1) * block])))
            if not missed and key in seen and i < (len(ids) - 1) // block:
                hit += 1
            else:
                missed = True
            seen.add(key)
        out.append(hit * block)
    return out


# ---- fleet ----


@contextmanager
def fleet(tmp: Path, instances: int, policy: str, engine_args: list[str], routers: int = 1) -> Iterator[list[HttpProc]]:
    """Fresh instances (sim engine + frontend each) behind `routers` routers, each with the same pool
    and `policy` (several: an HA pair or more behind a load balancer, each seeing its share of the
    traffic)."""
    engines: list[EngineProc] = []
    frontends: list[FrontendProc] = []
    started: list[HttpProc] = []
    try:
        for _ in range(instances):  # start all, then wait: the frontends load the tokenizer in parallel
            engines.append(start_engine(tmp, "--model", "tiny", "--backend", "sim", *engine_args, wait=False))
        grpc_ports = []
        for engine in engines:
            # Every policy's frontends serve gRPC, so that only the policy differs between runs.
            grpc_ports.append(free_port_block(1, spread=0))
            frontends.append(start_frontend(tmp, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                                            "--engine-addresses", engine.endpoint(), "--log-level", "warning",
                                            "--grpc-port", str(grpc_ports[-1]), wait_status=None))
        for engine in engines:
            engine.wait_ready()
        for fe in frontends:
            fe.wait_ready()
        replicas = ", ".join(f'{{url: "{fe.url}", grpc: "127.0.0.1:{port}"}}'
                             for fe, port in zip(frontends, grpc_ports, strict=True))
        for _ in range(routers):
            started.append(start_router(tmp, f"""
listeners: [{{port: {{port}}, host: 127.0.0.1}}]
pools:
  p: {{model: tiny, tokenizer: tiny, replicas: [{replicas}], policy: {policy},
      health: {{path: /ready, interval_s: 1}}}}
entries:
  fleet: {{default: [p]}}
"""))
        if policy == "precise_prefix":
            for router in started:
                _wait_streams(router, instances)
        yield started
    finally:
        for proc in [*started, *frontends, *engines]:
            proc.stop()


def _wait_streams(router: HttpProc, instances: int, timeout_s: float = 60.0) -> None:
    """Until the router has every replica's KvEvents stream (it logs each one's start)."""
    deadline = time.monotonic() + timeout_s
    while router.log().count("KvEvents from") < instances:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the router has no KvEvents stream after {timeout_s}s:\n{router.log()[-2000:]}")
        time.sleep(0.1)


# ---- client ----


async def _one(client: httpx.AsyncClient, url: str, prompt: Prompt, max_tokens: int) -> Result:
    body = {"model": "fleet", "messages": [{"role": "user", "content": prompt.text}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    result = Result(prompt.group, 0)
    t0 = time.perf_counter()
    async with client.stream("POST", url, json=body) as resp:
        result.status = resp.status_code
        result.replica = resp.headers.get("x-router-replica", "")
        if resp.status_code != 200:
            result.error = (await resp.aread())[:200].decode(errors="replace")
            return result
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if math.isnan(result.ttft_ms) and any((c.get("delta") or {}).get("content")
                                                  for c in chunk.get("choices") or ()):
                result.ttft_ms = (time.perf_counter() - t0) * 1000
            if usage := chunk.get("usage"):
                result.prompt_tokens = usage["prompt_tokens"]
                result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if "error" in chunk:
                result.error = str(chunk["error"])[:200]
    return result


async def drive(bases: list[str], prompts: list[Prompt], concurrency: int, max_tokens: int
                ) -> tuple[list[Result], float]:
    """Results in send order, and the wall time from the first send to the last answer. Prompt i goes to
    router i mod len(bases) (a load balancer's round robin)."""
    results: list[Result | None] = [None] * len(prompts)
    queue = iter(range(len(prompts)))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
        async def worker() -> None:
            for i in queue:
                results[i] = await _one(client, bases[i % len(bases)] + "/v1/chat/completions", prompts[i], max_tokens)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


# ---- report ----


def report(runs: list[Run], prompts: list[Prompt], best: list[int]) -> None:
    best_rate = sum(best) / sum(len(p.ids) for p in prompts)
    print(f"{'policy':<18} {'hit rate':>8} {'best':>6} {'ratio':>6} {'TTFT p50':>9} {'p99':>7} "
          f"{'hit p50':>8} {'miss p50':>9} {'wall s':>7}  instances/group  requests per instance")
    for run in runs:
        ok = [r for r in run.results if r.status == 200 and not r.error]
        prompt = sum(r.prompt_tokens for r in ok)
        rate = sum(r.cached_tokens for r in ok) / prompt if prompt else math.nan
        ttft = [r.ttft_ms for r in ok]
        hits = [r.ttft_ms for r in ok if r.cached_tokens > 0]
        misses = [r.ttft_ms for r in ok if r.cached_tokens == 0]
        spread: dict[int, set[str]] = defaultdict(set)
        for r in ok:
            spread[r.group].add(r.replica)
        per_group = statistics.mean(len(s) for s in spread.values()) if spread else math.nan
        load = sorted(Counter(r.replica for r in ok).values(), reverse=True)
        print(f"{run.policy:<18} {rate:8.3f} {best_rate:6.3f} {rate / best_rate:6.3f} {percentile(ttft, .5):7.1f}ms "
              f"{percentile(ttft, .99):5.0f}ms {statistics.median(hits) if hits else math.nan:6.1f}ms "
              f"{statistics.median(misses) if misses else math.nan:7.1f}ms {run.wall_s:7.2f}  "
              f"{per_group:15.2f}  {load}")
        if len(ok) != len(run.results):
            failed = Counter(f"{r.status} {r.error[:120]}" for r in run.results if r not in ok)
            print(f"  {len(run.results) - len(ok)} failed: {dict(failed)}")
        wrong = sum(1 for r, p in zip(run.results, prompts, strict=True) if r in ok and r.prompt_tokens != len(p.ids))
        if wrong:
            print(f"  {wrong} answers counted other prompt_tokens than the bench's tokenization")
    cache_aware = next((r for r in runs if r.policy == "cache_aware"), None)
    if cache_aware is not None:
        print(f"target: cache_aware hit rate >= {TARGET_RATIO:.2f} x best "
              f"({TARGET_RATIO * best_rate:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=1536, help="per instance, 16-token blocks")
    ap.add_argument("--prefill-tps", type=float, default=20000.0, help="sim prompt tokens per second")
    ap.add_argument("--decode-ms", type=float, default=10.0, help="sim base cost of a decode step")
    ap.add_argument("--policies", default="precise_prefix,cache_aware,round_robin,least_outstanding")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routers", type=int, default=1,
                    help="routers over the same pool, prompts sent to them in turn (an HA pair: 2)")
    args = ap.parse_args()
    prompts, prefix_len = workload(args.seed, args.groups, args.per_group, args.prefix_tokens)
    best = best_cached(prompts)
    mean_prompt = statistics.mean(len(p.ids) for p in prompts)
    engine_args = ["--sim-num-kv-blocks", str(args.kv_blocks), "--sim-prefill-tps", str(args.prefill_tps),
                   "--sim-decode-ms", str(args.decode_ms), "--block-size", str(BLOCK)]
    print(f"{args.groups} groups x {args.per_group} prompts, prefix {prefix_len:.0f} tokens (mean), prompt "
          f"{mean_prompt:.0f} tokens (mean, chat template included), shuffled, concurrency {args.concurrency}, "
          f"streamed, max_tokens {args.max_tokens}")
    print(f"{args.instances} instances (frontend + sim engine each): KV {args.kv_blocks} blocks x {BLOCK} tokens "
          f"= {args.kv_blocks * BLOCK:,} tokens, about {args.kv_blocks * BLOCK / mean_prompt:.1f} prompts' "
          f"prefixes per instance; prefill {args.prefill_tps:,.0f} tokens/s "
          f"({prefix_len / args.prefill_tps * 1000:.0f} ms per prefix miss), decode step {args.decode_ms:g} ms")
    print(f"fresh instances per policy; {args.routers} router(s), prompts sent to them in turn")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-router-cache-") as tmp:
        for policy in args.policies.split(","):
            with fleet(Path(tmp), args.instances, policy, engine_args, args.routers) as routers:
                results, wall = asyncio.run(drive([r.url for r in routers], prompts, args.concurrency,
                                                  args.max_tokens))
                runs.append(Run(policy, results, wall))
                for router in routers:
                    warnings = [line for line in router.log().splitlines() if " WARNING " in line or " ERROR " in line]
                    if warnings:
                        print(f"router ({policy}) logged {len(warnings)} warning/error line(s), first: {warnings[0]}")
    report(runs, prompts, best)


if __name__ == "__main__":
    main()
