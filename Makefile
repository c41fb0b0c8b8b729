# Two commands matter: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp is remade whenever the dependency files change, so `make` re-installs only then.
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps demo test test-heavy test-all lint format clean bench gpu-check image container-test cluster-test

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing dlscale and its pinned dependencies into $(VENV) (first run only) ..."
	@# torch first and alone: constraints pin it to 2.13.0, which pip takes from the local CPU wheel.
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,ray]'
	@touch $(STAMP)

# Debian packages the service and its tests need (PostgreSQL, Chromium, bubblewrap): installs them
# as root, else says how.
system-deps:
	bash scripts/system-deps.sh

demo: setup
	$(BIN)/dlscale train examples/lenet-digits.yaml

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# `make test` leaves out the tests marked heavy (further end-to-end variants of what it checks
# once: docs/development.md); `make test-heavy` runs just those, `make test-all` everything.
PYTEST := $(BIN)/python -m pytest -q --durations=40
test: system-deps lint
	$(PYTEST) -m "not heavy"

test-heavy: system-deps setup
	$(PYTEST) -m heavy

test-all: system-deps lint
	$(PYTEST)

bench: setup
	$(BIN)/python benchmarks/loop_overhead.py

# On a machine with a CUDA GPU: every strategy at fp32/bf16/fp16, NCCL, pinned memory; a table.
gpu-check: setup
	$(BIN)/python -m pytest -q -m gpu tests/gpu
	$(BIN)/python benchmarks/gpu_check.py --out runs/gpu-check
	$(BIN)/python benchmarks/gpu_predict.py --steps 10

# The container image (podman or docker; docker/build.sh says what it needs), and its tests.
image: setup
	bash docker/build.sh

container-test: image
	DLSCALE_CONTAINER_TESTS=1 $(BIN)/python -m pytest -q tests/container

# Opt-in, as root: hosts made of network namespaces on this machine, a Ray node on each, and
# every strategy, fault and the link's prediction across them (tests/cluster; several minutes).
cluster-test: setup
	DLSCALE_CLUSTER_TESTS=1 $(BIN)/python -m pytest -q tests/cluster

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
