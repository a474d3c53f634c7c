#!/usr/bin/env bash
# The GPU check of the CUDA backend, on a machine with an NVIDIA GPU: builds the engine for that
# GPU only, runs the CUDA tests and the GPU benchmark, and writes JSON results into OUT.
#
# Made for a machine that has nvcc, CMake, ninja, pybind11, scikit-build-core, numpy and pytest but
# no package registry, and to which only the repository and up to 64 MiB besides can be copied:
#   where the registry is:  scripts/device_check.sh --prepare
#       writes build/device-check/: llama.cpp's source pruned to what the build reads (21 MB),
#       the wheels the tests import beyond those (gguf, tqdm, safetensors, PyYAML), and the default
#       model in parts of at most 30 MiB (the model is 92 MiB: copy the parts over several calls,
#       the folder keeps what earlier calls brought); prints what to copy with each call.
#   on the GPU machine:     scripts/device_check.sh OUT      (about 8 minutes, 16 cores)
# Phases, each timed; one that fails is recorded and the next still run:
#   build   pip install . with SELECTINFER_CUDA=ON for this GPU only (CMAKE_CUDA_ARCHITECTURES=native;
#           without flash-attention kernels, which the check does not use and which double the build)
#   tests   tests/test_cuda.py, test_cuda_logic.py, test_sparse_ops.py -> OUT/tests.xml, OUT/tests.txt
#           (the end-to-end tests need the default model: without all its parts they are left out, and the log says so)
#   bench   Llama-3.2-3B-shaped random weights, dense F16 and Q4_0 and SelectInfer gamma 0.7 files of
#           each, every layer on the GPU, phi 0.3 / 0.4 / 0.5 and dense over loaded, decode and
#           prefill tokens/s with the bytes-read ideal -> OUT/bench-F16.json, OUT/bench-Q4_0.json
#   memory  GPU memory each file takes with every layer on the GPU -> OUT/gpu-memory.json
# OUT/summary.json: the GPU, each phase's status and seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
HERE=$PWD/build/device-check
PY=${PY:-python3}

if [ "${1:-}" = "--prepare" ]; then
  set -e
  [ -n "${PY_PREPARE:-}" ] || PY_PREPARE=$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
  PY=$PY_PREPARE  # with selectinfer installed (make install), for the default model
  mkdir -p "$HERE"
  if [ ! -d "$HERE/llama-src" ]; then
    "$PY" cmake/llama_cpp_source.py --export-pruned "$HERE/llama-src"
  fi
  rm -rf "$HERE/wheels" && mkdir -p "$HERE/wheels"
  "$PY" -m pip download -q --no-deps -d "$HERE/wheels" gguf tqdm safetensors --only-binary=:all:
  for v in 3.10 3.11 3.12 3.13; do  # PyYAML is compiled: one wheel per Python the machine may have
    "$PY" -m pip download -q --no-deps -d "$HERE/wheels" pyyaml --only-binary=:all: --python-version "$v" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  done
  model=$("$PY" -c "from selectinfer import pull; print(pull('smollm2-135m', quiet=True))")
  rm -f "$HERE"/model-part-*
  split -b 30M "$model" "$HERE/model-part-"
  echo "model $(basename "$model") $(sha256sum "$model" | cut -d' ' -f1)" > "$HERE/model.txt"
  echo "device_check: prepared $HERE ($(du -sh "$HERE" | cut -f1)); copy with each call (at most 64 MiB):"
  echo "  call 1: build/device-check/llama-src build/device-check/wheels build/device-check/model.txt build/device-check/model-part-aa"
  echo "  call 2: build/device-check/model-part-ab build/device-check/model-part-ac ... then run scripts/device_check.sh OUT"
  ls "$HERE"/model-part-* | sed 's|^|  part: |'
  exit 0
fi

OUT=${1:?usage: scripts/device_check.sh OUT | --prepare}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export SELECTINFER_CACHE_DIR=$HERE/cache
export SELECTINFER_LLAMA_SOURCE=$HERE/llama-src
VENV=$HERE/venv
MODEL_OK=0
VPY=$VENV/bin/python
declare -A STATUS SECONDS_OF
phase() {  # phase NAME COMMAND...: runs it, logs to OUT/NAME.log, records status and time
  local name=$1; shift
  local start=$(date +%s)
  echo "device_check: $name ..." >&2
  if "$@" > "$OUT/$name.log" 2>&1; then STATUS[$name]=ok; else STATUS[$name]="failed (rc $?, see $name.log)"; fi
  SECONDS_OF[$name]=$(( $(date +%s) - start ))
  echo "device_check: $name ${STATUS[$name]} in ${SECONDS_OF[$name]} s" >&2
  tail -3 "$OUT/$name.log" >&2
}

setup() {
  [ -d "$SELECTINFER_LLAMA_SOURCE" ] || { echo "no $SELECTINFER_LLAMA_SOURCE: run --prepare where the registry is, copy build/device-check"; return 1; }
  "$PY" -m venv --system-site-packages "$VENV"
  "$VPY" -m pip install -q --no-index --no-deps --find-links "$HERE/wheels" gguf tqdm safetensors pyyaml
  # the default model, from its parts when every part has arrived (checked by sha256)
  if [ -f "$HERE/model.txt" ]; then
    read -r _ name sha < "$HERE/model.txt"
    mkdir -p "$SELECTINFER_CACHE_DIR/models"
    cat "$HERE"/model-part-* > "$SELECTINFER_CACHE_DIR/models/$name.tmp"
    if [ "$(sha256sum "$SELECTINFER_CACHE_DIR/models/$name.tmp" | cut -d' ' -f1)" = "$sha" ]; then
      mv "$SELECTINFER_CACHE_DIR/models/$name.tmp" "$SELECTINFER_CACHE_DIR/models/$name"
      MODEL_OK=1
    else
      rm -f "$SELECTINFER_CACHE_DIR/models/$name.tmp"
      echo "the default model's parts are incomplete: its end-to-end tests are left out"
    fi
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader > "$OUT/gpu.txt" || true
}

build() {
  SELECTINFER_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=native -DGGML_CUDA_FA=OFF ${CMAKE_ARGS:-}" \
    "$VPY" -m pip install --no-build-isolation --no-deps --no-index -v .
  "$VENV/bin/selectinfer" info
}

tests() {
  local only=()  # without the default model (no registry here), the tests that need it are left out
  [ "$MODEL_OK" = 1 ] || only=(-k "not default_model and not selectinfer_on_the_gpu and not gathered and not profiling")
  "$VPY" -m pytest -v -rs tests/test_cuda.py tests/test_cuda_logic.py tests/test_sparse_ops.py \
    "${only[@]}" --junitxml "$OUT/tests.xml" | tee "$OUT/tests.txt"
}

bench() {
  local models=$HERE/models
  mkdir -p "$models"
  for type in F16 Q4_0; do
    local dense=$models/3b-$type.gguf si=$models/3b-$type-si70.gguf
    [ -f "$dense" ] || "$VENV/bin/selectinfer" random-model llama-3.2-3b --type "$type" -o "$dense"
    [ -f "$si" ] || "$VENV/bin/selectinfer" convert "$dense" -o "$si" --ranking random --load-ratio 0.7 --static-ratio 0.3
    "$VENV/bin/selectinfer" bench "$dense" "$si" --compute-ratios 0.3 0.4 0.5 -p 64 -n 32 -r 5 -ngl -1 \
      --json "$OUT/bench-$type.json"
  done
}

memory() {
  "$VPY" - "$HERE/models" "$OUT/gpu-memory.json" <<'EOF'
import json, sys
from pathlib import Path
from selectinfer import Model, _native

def gpu_free():
    return sum(d["memory_free_bytes"] for d in _native.compute_devices() if d["type"] in ("GPU", "IGPU"))

out = []
for path in sorted(Path(sys.argv[1]).glob("*.gguf")):
    before = gpu_free()
    with Model(path, n_ctx=512, n_gpu_layers=-1) as m:
        m.decode_tokens(m.tokenize("The capital of France is"), 4)
        used = before - gpu_free()
        out.append({"file": path.name, "file_bytes": path.stat().st_size, "gpu_memory_used_bytes": used,
                    "model_bytes": m.stats()["model_bytes"]})
Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
EOF
}

phase setup setup
phase build build
phase tests tests
phase bench bench
phase memory memory
{
  echo "{"
  echo "  \"gpu\": \"$(head -1 "$OUT/gpu.txt" 2>/dev/null)\","
  echo "  \"phases\": {"
  first=1
  for name in setup build tests bench memory; do
    [ $first = 1 ] || echo ","
    first=0
    printf '    "%s": {"status": "%s", "seconds": %s}' "$name" "${STATUS[$name]}" "${SECONDS_OF[$name]}"
  done
  echo; echo "  }"; echo "}"
} > "$OUT/summary.json"
cat "$OUT/summary.json"
