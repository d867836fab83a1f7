"""A streamed token's cost with top-k logprobs on the direct stream's short path, in-process and one
core: N chat streams fed one sim-shaped output each per step (the sim's uniform draws over the tiny
model's vocabulary, its packed rows), each step's Outputs message dispatched as EngineSet does
(`_on_outputs`, then `end_of_pass`: the streams' plain steps, the formatter, render, the chunk writer) into
a recording transport, the collector's heap frozen as the frontend's is. Prints CPU us per token, warm (every
id's fragments made first) and cold (the formatter's tables fill as ids come, as in a fleet's first
rounds), with `--before REV` the same for that revision's tree in a subprocess, rounds alternating.
`--top 0`: plain streams (no logprobs asked), the plain step alone.
For instructions instead of a noisy clock: `PYTHONHASHSEED=0 valgrind --tool=callgrind python
bench/logprobs_stream.py --child warm --steps 0` and `--steps 200`, the difference over streams x 200
(fewer steps drown in the run-to-run spread of the start-up's count, ~10M).

Run: PYTHONPATH=$PWD python bench/logprobs_stream.py [--streams 32] [--steps 40] [--top 5] [--rounds 5]
                                                   [--before REV]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARM_STEPS = 60  # before the measured steps: the streams attached, the first token's process() done


def child(kind: str, streams: int, steps: int, top: int) -> float:
    """CPU seconds per token of `steps` steps over `streams` streams in this process's tree."""
    sys.path.insert(0, os.getcwd())
    from protocol import GenerateRequest, Outputs, PackedLogprobs, Ready, RequestOutput, SamplingParams
    from services.engine.backends.sim.fake_logprobs import FakeLogprobs
    from services.frontend.engine_client.engines import EngineSet
    from services.frontend.engine_client.inflight import InFlight, end_of_pass
    from services.frontend.generation.metrics import Metrics
    from services.frontend.generation.output import OutputProcessor
    from services.frontend.http_api.response_writer import send_stream
    from services.frontend.model import Model
    from services.frontend.requests.engine_request import EngineRequest, OutputOptions
    from services.frontend.text.logprobs_format import LogprobsFormatter
    from services.frontend.text.token_strings import token_strings
    from tests.unit.frontend.test_direct_stream import _attached, _cycle, _Engines

    model = Model.load("tiny", "tiny")
    vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
    if kind == "warm" and top:
        fmt = LogprobsFormatter(token_strings(model.tokenizer), chat=True, top=top)
        for tid in range(vocab):
            fmt._cell(tid)
    fake = FakeLogprobs(vocab)
    rnd = random.Random(1)
    draws = [[rnd.randrange(151000) for _ in range(streams)] for _ in range(WARM_STEPS + steps)]

    engines = EngineSet(["tcp://a:1"], frontend_id="bench", engine_timeout_s=60, heartbeat_interval_s=1)
    engine = engines.engines[0]

    def step(n: int, ids: list[int]) -> tuple[Outputs, list[bytes]]:
        """The step's Outputs message as the sim sends it: every stream's output, with top > 0 each one's
        packed logprobs at its offset of the one raw frame."""
        if not top:
            return Outputs(0, n, [RequestOutput(rid, [tid], None) for (rid, _), tid in zip(live, ids, strict=True)],
                           time.time()), []
        outs, parts, offset = [], [], 0
        for (rid, _), tid in zip(live, ids, strict=True):
            ref, segment = fake.segment([tid], top)
            outs.append(RequestOutput(rid, [tid], None, packed_logprobs=PackedLogprobs(0, offset, ref.positions,
                                                                                       ref.k)))
            parts.append(bytes(segment[0]))
            offset += len(parts[-1])
        return Outputs(0, n, outs, time.time()), [b"".join(parts)]

    live: list[tuple[str, InFlight]] = []

    async def main() -> float:
        engines._on_ready(engine, Ready(0, "tiny", 4096, 16, 1000, "sim", "bench", "e"), time.monotonic())
        metrics, tasks = Metrics("tiny"), []
        for i in range(streams):
            rid = f"r{i}"
            options = OutputOptions(chat=True, stream=True, include_usage=True, continuous_usage=False, stop=(),
                                    include_stop_str_in_output=False, skip_special_tokens=True,
                                    tool_choice="none", response_id="chatcmpl-1", logprobs=top or None)
            request = EngineRequest(GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=10_000), time.time()),
                                    10_000, options)
            stream = InFlight(rid, 3, 10_000)
            outputs = OutputProcessor(stream, request, tokenizer=model.tokenizer, engines=_Engines(), metrics=metrics)
            cycle, _ = _cycle()
            tasks.append(asyncio.ensure_future(send_stream(cycle.send, [[outputs]], "tiny", None, cycle)))
            live.append((rid, stream))
            engine.inflight[rid] = stream
        spent = 0.0
        for n, ids in enumerate(draws):
            message, frames = step(n, ids)
            t0 = time.process_time()
            engines._on_outputs(engine, message, frames)  # the dispatch pass, as EngineSet._on_batch runs it
            end_of_pass()
            if n >= WARM_STEPS:
                spent += time.process_time() - t0
            if n == 0:
                for _, stream in live:
                    await _attached(stream)
        for task in tasks:
            task.cancel()
        return spent / max(1, streams * steps)

    gc.collect()
    gc.freeze()  # as the frontend does once started (services/frontend/server.py): the model's tables out of
    # the collector's reach; without it a young collection's promotions make full ones walk them
    return asyncio.run(main())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--top", type=int, default=5, help="top_logprobs; 0: plain streams, no logprobs")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", metavar="REV", help="also run this git revision's tree, rounds alternating")
    p.add_argument("--child", choices=["warm", "cold"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(child(args.child, args.streams, args.steps, args.top) * 1e6)
        return
    from frontend_stream import tree_at  # bench/ is this script's path[0]; the parent need not load it

    trees = [("this tree", ROOT)] + ([(args.before, tree_at(args.before))] if args.before else [])
    figures: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for kind in ("warm", "cold"):
            for name, tree in trees:
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", kind,
                                      "--streams", str(args.streams), "--steps", str(args.steps), "--top",
                                      str(args.top)], cwd=tree, check=True, capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": str(tree)})
                figures.setdefault((kind, name), []).append(float(out.stdout.split()[-1]))
    print(f"{args.streams} streams x {args.steps} steps, top_logprobs={args.top}; CPU us per token, "
          f"median of {args.rounds} rounds (each round's figures in brackets)")
    for (kind, name), values in figures.items():
        print(f"[{kind}, {name}] {statistics.median(values):6.2f} us ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
