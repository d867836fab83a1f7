"""vLLM tests run the engine in-process and never reach a model hub; both are
read from the environment, so set them before any test imports vllm."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
