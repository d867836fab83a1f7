"""Protocol version. MAJOR changes on any breaking edit; MINOR on every pure append."""
from __future__ import annotations

MAJOR = 1
MINOR = 6  # 1: RequestOutput.error_kind; 2: SamplingParams.json_schema;
# 3: SamplingParams.prompt_logprobs, RequestOutput.packed_logprobs/packed_prompt_logprobs (logprobs.py),
# and SamplingParams' other structured-output constraints and logits controls (regex ... bad_words)
# 4: RequestOutput.timings (RequestTimings: vLLM's queue, prefill and decode times, engine-measured),
# Stats.num_preemptions, iteration_tokens, iteration_tokens_sum (vLLM's per-engine counters)
# 5: pooling: GenerateRequest.pooling (PoolingParams), RequestOutput.pooled (PackedPooled, pooled.py),
# Ready.runner and Ready.tasks
# 6: tracing: GenerateRequest.trace_headers (W3C traceparent/tracestate)
