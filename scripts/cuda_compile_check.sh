#!/usr/bin/env bash
# Compiles every CUDA file selectinfer adds or patches, for the GPUs the CUDA build targets by
# default (sm_87 Jetson Orin, sm_90 H100/H200), on a machine without a GPU: our kernels
# (cpp/ggml/cuda/sparse_ffn_cuda.cu) and ggml-cuda's dispatch as patched (ggml-cuda.cu, ggml-patches/0007).
# A kernel that does not compile cannot land (CI runs this). The rest of ggml-cuda is upstream's,
# unchanged, and would take most of CI's time on two cores.
#
# nvcc: the one on the PATH, else NVIDIA's PyPI wheels (nvidia-cuda-nvcc, -runtime, -cccl)
# installed into the cache; cuBLAS's headers (ggml-cuda includes them) from the nvidia-cublas
# wheel, its include/ only, unpacked once into the cache.
#   usage: scripts/cuda_compile_check.sh [ARCH ...]      (default: 87 90)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
CACHE=${SELECTINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/selectinfer}
CUDA_WHEELS=13.0.88     # nvcc and runtime of CUDA 13.0
CUBLAS_WHEEL=13.0.2.14  # cuBLAS of CUDA 13.0
ARCHS=("$@")
[ ${#ARCHS[@]} -gt 0 ] || ARCHS=(87 90)

pip_into() {  # pip_into DIR PACKAGE...: the wheels' files under DIR (cached)
  local dir=$1; shift
  if [ ! -e "$dir/.complete" ]; then
    rm -rf "$dir.tmp"
    "$PY" -m pip install -q --no-deps --target "$dir.tmp" "$@"
    touch "$dir.tmp/.complete"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
}

NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then
  cuda="$CACHE/cuda-$CUDA_WHEELS"
  echo "cuda_compile_check: no nvcc on the PATH; NVIDIA's CUDA $CUDA_WHEELS wheels from PyPI into $cuda" >&2
  pip_into "$cuda" "nvidia-cuda-nvcc==$CUDA_WHEELS" "nvidia-cuda-crt==$CUDA_WHEELS" "nvidia-nvvm==$CUDA_WHEELS" \
    "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cccl==13.0.85"
  root=$(dirname "$(dirname "$(find "$cuda" -path '*/bin/nvcc' | head -1)")")
  NVCC="$root/bin/nvcc"
  [ -x "$NVCC" ] || { echo "cuda_compile_check: no nvcc in the wheels under $cuda" >&2; exit 1; }
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CUBLAS_INCLUDE=()
if ! echo '#include <cublas_v2.h>' | "$NVCC" -E -x cu - -o /dev/null 2>/dev/null; then
  cublas="$CACHE/cublas-$CUBLAS_WHEEL-include"
  if [ ! -e "$cublas/.complete" ]; then
    echo "cuda_compile_check: cuBLAS headers from the nvidia-cublas $CUBLAS_WHEEL wheel (once)" >&2
    "$PY" -m pip download -q --no-deps "nvidia-cublas==$CUBLAS_WHEEL" -d "$tmp/wheel"
    rm -rf "$cublas.tmp" && mkdir -p "$cublas.tmp"
    "$PY" -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
z.extractall(sys.argv[2], [n for n in z.namelist() if '/include/' in n])" "$tmp"/wheel/*.whl "$cublas.tmp"
    touch "$cublas.tmp/.complete"
    rm -rf "$cublas" && mv "$cublas.tmp" "$cublas"
  fi
  CUBLAS_INCLUDE=(-I "$(dirname "$(find "$cublas" -name cublas_v2.h | head -1)")")
fi

TREE=$("$PY" cmake/llama_cpp_source.py --patches ggml-patches)
# ggml-cuda's own flags and definitions (its CMakeLists.txt)
FLAGS=(-std=c++17 -O3 -use_fast_math -extended-lambda -Xcompiler=-fPIC
       -DGGML_CUDA_USE_GRAPHS -DGGML_SCHED_MAX_COPIES=4 -DGGML_CUDA_PEER_MAX_BATCH_SIZE=128 -D_GNU_SOURCE
       -D_XOPEN_SOURCE=600 -DGGML_USE_CUDA
       -I "$TREE/ggml/include" -I "$TREE/ggml/src" -I "$TREE/ggml/src/ggml-cuda" -I cpp/ggml -I cpp/ggml/cuda "${CUBLAS_INCLUDE[@]}")
FILES=(cpp/ggml/cuda/sparse_ffn_cuda.cu "$TREE/ggml/src/ggml-cuda/ggml-cuda.cu")
echo "cuda_compile_check: $("$NVCC" --version | tail -1)" >&2
for arch in "${ARCHS[@]}"; do
  for f in "${FILES[@]}"; do
    start=$(date +%s)
    strict=()
    [ "$f" = "${FILES[0]}" ] && strict=(-Werror all-warnings)  # ours: nvcc's warnings are errors
    "$NVCC" "${FLAGS[@]}" "${strict[@]}" -arch="sm_$arch" -c "$f" -o "$tmp/out.o"
    echo "cuda_compile_check: sm_$arch $(basename "$f") compiled in $(( $(date +%s) - start )) s" >&2
  done
done
echo "cuda_compile_check: every selectinfer CUDA file compiles for ${ARCHS[*]/#/sm_}"
