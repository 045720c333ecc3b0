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

.PHONY: serve test build stop lint unit integration clean

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q -c requirements/constraints.txt -e ".[runtime,server,generator,client,dev]"
	touch $@

TINY_CLIP := .build/tiny-clip/open_clip_pytorch_model.bin

$(TINY_CLIP): | $(STAMP)
	$(PY) -m generator tiny-clip .build/tiny-clip

serve: $(STAMP) $(TINY_CLIP)
	$(PY) -m generator serve

build: $(STAMP) $(TINY_CLIP)
	$(PY) -m generator build

stop:
	@if [ -x $(PY) ]; then $(PY) -m generator stop; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check generator client tests bench

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

integration: $(STAMP)
	$(PY) -m pytest tests/integration -q

test: $(STAMP) lint
	$(PY) -m pytest tests -q

clean:
	rm -rf $(VENV) .build model_repository/*/ model_repository/.generator-state.json

# Benchmark suite: Triton vs the raw ONNX Runtime ceiling and peer services, written to
# docs/benchmarks.md (BENCH_ARGS="--quick" for a smoke test, "--device gpu" on a GPU),
# then the precision / graph-optimisation knobs in-process, written to docs/precision.md.
.PHONY: bench
bench: $(STAMP)
	$(PY) -m pip install -q -c requirements/constraints.txt -e ".[bench]"
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.precision $(PRECISION_ARGS)
