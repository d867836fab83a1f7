"""One canonical instance of every message, with every field set away from its default where it can
be: the golden byte fixtures are these, encoded."""
from __future__ import annotations

from protocol import (
    Abort,
    AllCleared,
    BlockRemoved,
    BlockStored,
    EngineDead,
    GenerateRequest,
    Heartbeat,
    Hello,
    Logprobs,
    Message,
    Outputs,
    PackedLogprobs,
    PackedPooled,
    PoolingParams,
    Ready,
    Reject,
    RequestOutput,
    RequestTimings,
    SamplingParams,
    Stats,
    UtilityCall,
    UtilityResult,
    pooled,
)
from protocol.logprobs import pack, segment_size

# Raw frames after the body, where a sample has them: req-4's logprobs, one sampled row with 2
# alternatives (its token 11 is the most likely), then 2 prompt rows with 1 alternative each.
SAMPLE_LOGPROBS = pack([11, 11, 12], [-0.25, -0.25, -1.5], [1])
SAMPLE_PROMPT_LOGPROBS = pack([5, 7, 6, 6], [-3.0, -0.5, -0.125, -0.125], [4, 1])
# req-5's pooled output, a 3-float embedding, in a raw frame of its own.
SAMPLE_POOLED = pooled.pack([0.5, -0.25, 0.125])
RAW_FRAMES: dict[str, list[bytes]] = {"Outputs": [SAMPLE_LOGPROBS + SAMPLE_PROMPT_LOGPROBS, SAMPLE_POOLED]}

SAMPLES: dict[str, Message] = {
    "Hello": Hello(1, 0, "0123456789abcdef", "frontend-a", "secret"),
    "Ready": Ready(3, "tiny", 4096, 16, 1024, "sim", "0.1.0", "epoch01", 5655, 1, 0, "pooling",
                   ["embed", "token_embed"]),
    "Reject": Reject("version_mismatch", "frontend speaks 2.0, engine speaks 1.0"),
    "Heartbeat": Heartbeat(7, 1700000000.25),
    "GenerateRequest": GenerateRequest(
        "req-1",
        [151644, 872, 198, 9707, 0, 151645],
        SamplingParams(
            max_tokens=32, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=1234,
            min_tokens=2, stop_token_ids=[151643], ignore_eos=True, logprobs=2,
            presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.1,
            json_schema='{"type": "object"}', prompt_logprobs=1, regex="[a-z]+", choice=["yes", "no"],
            grammar='root ::= "a"', json_object=True, structural_tag='{"type": "structural_tag"}',
            logit_bias={9707: 5.0, 11: -100.0}, allowed_token_ids=[11, 9707], bad_words=["bad", " words"],
        ),
        1700000000.5,
        priority=-1,
        lora="adapter-a",
        cache_salt="tenant-1",
        pinned_rank=1,
        pooling=PoolingParams("classify", 8, False, 3),
        trace_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ),
    "Abort": Abort(["req-1", "req-2"]),
    "UtilityCall": UtilityCall(9, "sleep", {"level": 1}),
    "UtilityResult": UtilityResult(9, False, {"running": 0}, "ValueError: busy"),
    "Outputs": Outputs(
        0,
        42,
        [
            RequestOutput("req-1", [11, 12], None, None, 16, timings=RequestTimings(0.125, 0.5, 0.0, 0)),
            RequestOutput("req-2", [151645], "stop", 151645, 0,
                          Logprobs([-0.25], [1], [[151645, 11]], [[-0.25, -1.5]]),
                          timings=RequestTimings(0.25, 1.5, 2.75, 2)),
            RequestOutput("req-3", [], "error", None, 0, None, "prompt too long", "invalid"),
            RequestOutput("req-4", [11], None, None, 0, None, None, None,
                          PackedLogprobs(0, 0, 1, 2), PackedLogprobs(0, segment_size(1, 2), 2, 1)),
            RequestOutput("req-5", [], "stop", pooled=PackedPooled(1, 0, [3])),
        ],
        1700000001.0,
    ),
    "Stats": Stats(2, 100, 1700000002.0, 5, 1, 0.375, 1024, 2048, 512, True, "epoch01", 3,
                   [4, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 20000),
    "EngineDead": EngineDead(1, "engine rank 1 failed: RuntimeError('boom')"),
    "BlockStored": BlockStored(0, 17, [2**64 - 1, 5], 2**63, 16, list(range(32)), "adapter-a"),
    "BlockRemoved": BlockRemoved(0, 18, [5]),
    "AllCleared": AllCleared(0, 19),
}
