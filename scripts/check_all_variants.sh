#!/usr/bin/env bash
# Configures the one-binary build (SELECTINFER_CPU_ALL_VARIANTS: ggml's CPU backend as one module
# per CPU variant) and checks that every CPU variant target gets the sparse FFN kernels; building
# them all takes a dozen CPU backends (scripts/test_variant.sh all-variants does).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
dir=build/all-variants-configure
cmake -S . -B "$dir" -G Ninja -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
      -DSELECTINFER_CPU_ALL_VARIANTS=ON > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
targets=$(sed -n 's/^-- selectinfer: sparse FFN CPU kernels in //p' "$dir.log")
expected=$(grep -c "ggml_add_cpu_backend_variant(" "$(sed -n 's/^-- selectinfer: llama.cpp source: //p' "$dir.log")/ggml/src/CMakeLists.txt" || true)
n=$(echo "$targets" | tr ';' '\n' | grep -c "^ggml-cpu-" || true)
echo "selectinfer: all-variants build: the sparse kernels go into $n CPU variants: $targets"
if [ "$n" -lt 8 ]; then
  echo "selectinfer: expected the kernels in every CPU variant (ggml declares $expected)" >&2
  exit 1
fi
