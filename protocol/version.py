"""Protocol version. MAJOR changes on any breaking edit; MINOR on every pure append."""
from __future__ import annotations

MAJOR = 1
MINOR = 3  # 1: RequestOutput.error_kind; 2: SamplingParams.json_schema;
# 3: SamplingParams.prompt_logprobs, RequestOutput.packed_logprobs/packed_prompt_logprobs (logprobs.py),
# and SamplingParams' other structured-output constraints and logits controls (regex ... bad_words)
