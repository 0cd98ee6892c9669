# tileweave — the two commands a new user runs: `make run` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
JOBS    ?= auto

.PHONY: run test test-fast test-slow test-fuzz test-zoo-cuda test-gpu test-browser lint venv install install-dev sys-deps samples clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

install: venv
	$(BIN)/pip install -q -e .

install-dev: venv
	$(BIN)/pip install -q -e '.[dev]'

# Debian packages the tests need: graphviz (dot) for SVG rendering and the overview layout, chromium for the browser tests, g++ for
# the cuda-sim emulator, PoCL (OpenCL on the CPU) for the OpenCL backend.
sys-deps:
	@if ! command -v dot >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1 \
	    || ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium g++ pocl-opencl-icd >/dev/null; \
	  else echo "need Debian packages graphviz, chromium, g++ and pocl-opencl-icd: sudo apt-get install graphviz chromium g++ pocl-opencl-icd"; fi; \
	fi

# Starts the workbench on the default bundled sample (no GPU needed) and prints its local URL.
run: install
	$(BIN)/tileweave app --port 8501

test: install-dev sys-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(JOBS) -m 'not slow and not gpu and not browser'
	@command -v chromium >/dev/null 2>&1 || { echo "chromium missing: run make sys-deps as root"; exit 1; }
	$(BIN)/python -m pytest -q -m browser -p no:xdist tests/e2e

test-slow: install-dev
	$(BIN)/python -m pytest -q -n $(JOBS) -m slow

# The graph fuzzer's slow profile (1,000 random ONNX graphs in 8 fixed-seed shards, every policy, onnxruntime
# as oracle); .ci/run runs it after `make test`. TILEWEAVE_FUZZ_SEED=random explores anew.
test-fuzz: install-dev
	$(BIN)/python -m pytest -q -n $(JOBS) -m slow tests/engine/test_fuzz_graphs.py

# Every zoo model x policy planned for the h200 preset and compiled by NVRTC for sm_90 (no GPU needed; ~2-5
# minutes on two cores); .ci/run runs it after the fuzzer.
test-zoo-cuda: install-dev
	$(BIN)/python -m pytest -q -n $(JOBS) -m slow tests/samples/test_zoo_cuda.py

# The first thing to run on a machine with an NVIDIA GPU (driver R580+, docs/gpu.md): every sample x policy
# and the persistent kernel on the device, against onnxruntime. One process: the tests share the GPU.
test-gpu: install-dev
	$(BIN)/python -c "from engine.runtime.cuda_driver import require_cuda; print('GPU:', require_cuda())"
	$(BIN)/python -m pytest -q -p no:xdist -m gpu -rs

lint: install-dev
	$(BIN)/ruff check .

samples: install
	$(BIN)/python samples/make_samples.py

clean:
	rm -rf .tileweave-cache .pytest_cache .ruff_cache
