#!/usr/bin/env bash
# Builds the engine as a variant and runs the tests that look for CPU- and memory-specific bugs
# against it (`make test-asan`, `make test-portable`, `make test-sse42`, `make test-avx512`,
# `make test-aarch64`, `make test-dl`; CI runs them all after `make test`):
#
#   sanitize  AddressSanitizer + UndefinedBehaviorSanitizer (native CPU): the op, selection,
#             conversion, validation and fuzz tests; any report fails the run
#   portable  SELECTINFER_NATIVE=OFF (x86-64 with AVX2/FMA/F16C, no AVX-512 or AMX): the code paths an
#             older or AMD CPU takes, with the op tests and a generation on the default model
#   sse42     SELECTINFER_NATIVE=OFF without AVX (x86-64-v2: SSE4.2, no AVX, AVX2, FMA, F16C or BMI2):
#             an older Atom, Celeron or Pentium, whose native build has none of the vector
#             paths (the generic loops, F16 from its bits), with the op tests and a generation on
#             the default model
#   avx512    SELECTINFER_NATIVE=OFF with AVX-512 (F, CD, VL, DQ, BW) and VNNI, no AMX: the code an
#             AMD Zen 4 or an Intel Xeon since Cascade Lake without AMX takes (the 512-bit
#             loops, the prompts' F32 GEMM where an AMX build takes tiles), with the op tests
#             and a generation on the default model; on a CPU without those levels it says so and
#             runs nothing
#   aarch64   cross-built for 64-bit ARM (armv8.2-a with fp16 and dot products: Jetson Orin, recent
#             phones and boards) with Debian's cross compiler, the tests run by an arm64 Python
#             under qemu-aarch64 (scripts/arm64_sysroot.sh)
#   dl        the CPU backend as a module loaded at run time from shared libraries installed beside
#             the extension (what the one-binary build uses; one module): op, selection, CLI tests
#   all-variants  SELECTINFER_CPU_ALL_VARIANTS: a CPU module per x86-64 variant, the best one for this
#             CPU loaded at run time (slow to build: about a dozen CPU backends)
#
# The variant's build lives in build/<variant>/ (reused on later runs); its Python package is
# staged in build/<variant>/pkg and runs with the test venv's other packages (not its selectinfer,
# installed or editable); its programs are in build/<variant>/cmd.
set -euo pipefail
cd "$(dirname "$0")/.."

variant=${1:?usage: scripts/test_variant.sh sanitize|portable|sse42|avx512|aarch64|dl|all-variants [pytest args]}
shift
PY=${PY:-.venv/bin/python}
dir=build/$variant
tests=(tests/test_sparse_ops.py tests/test_selective.py tests/test_forward_vs_numpy.py tests/test_si_validation.py)
env_vars=()
dl=""                  # shared libraries and backend modules, staged by cmake --install
instrumented=""        # a symbol the extension must have
capture=()             # pytest's output capture: its default, fd level
features_check="pass"  # what system_info() must say
deps=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")  # the test venv's packages
case $variant in
  sanitize)
    cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DSELECTINFER_SANITIZE=address,undefined")
    tests+=(tests/test_convert.py tests/test_fuzz.py)
    instrumented=__asan_init
    runtime="$(${CXX:-g++} -print-file-name=libasan.so):$(${CXX:-g++} -print-file-name=libubsan.so)"
    # Python's own allocations are not ours to judge: no leak report; every other report is fatal
    env_vars=(LD_PRELOAD="$runtime" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_odr_violation=0
              UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
    # a report ends the process inside a test: pytest's capture of fd 2 would swallow it, so only
    # Python's own output is captured (the report reaches the log)
    capture=(--capture=sys)
    ;;
  portable)
    cmake_args=(-DSELECTINFER_NATIVE=OFF)
    tests+=(tests/test_default_model.py tests/test_cli.py)
    # what the build must (not) use, whatever this machine's CPU has
    features_check="i = n.system_info(); assert 'AVX2 = 1' in i and 'AVX512 = 1' not in i and 'AMX_INT8 = 1' not in i, i"
    ;;
  sse42)
    cmake_args=(-DSELECTINFER_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF)
    tests+=(tests/test_default_model.py tests/test_cli.py)
    features_check="i = n.system_info(); assert 'SSE3 = 1' in i and 'AVX = 1' not in i and 'AVX2 = 1' not in i, i"
    ;;
  avx512)
    cmake_args=(-DSELECTINFER_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF)
    tests+=(tests/test_default_model.py tests/test_cli.py)
    cpu=$(grep -m1 '^flags' /proc/cpuinfo || true)
    for flag in avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni; do
      if [[ " $cpu " != *" $flag "* ]]; then
        echo "selectinfer: this CPU has no $flag: the avx512 variant cannot run here (not built, not tested)"
        exit 0
      fi
    done
    features_check="i = n.system_info(); assert 'AVX512 = 1' in i and 'AVX512_VNNI = 1' in i and 'AMX_INT8 = 1' not in i, i"
    ;;
  aarch64)
    sysroot=$(scripts/arm64_sysroot.sh)
    cmake_args=(-DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DSELECTINFER_NATIVE=OFF
                -DGGML_CPU_ARM_ARCH=armv8.2-a+fp16+dotprod
                "-DPython_INCLUDE_DIR=$sysroot/usr/include/python3.11"
                "-DCMAKE_CXX_FLAGS=-idirafter $sysroot/usr/include")  # pyconfig.h of the arm64 Python
    features_check="i = n.system_info(); assert 'NEON = 1' in i and 'DOTPROD = 1' in i, i"
    ;;
  dl | all-variants)
    [ "$variant" = dl ] && cmake_args=(-DSELECTINFER_BACKEND_DL=ON) || cmake_args=(-DSELECTINFER_CPU_ALL_VARIANTS=ON)
    tests+=(tests/test_cli.py tests/test_default_model.py)
    features_check="i = n.system_info(); assert 'CPU :' in i, i"  # a CPU backend was loaded
    dl=1
    ;;
  *)
    echo "unknown variant '$variant' (sanitize, portable, sse42, avx512, aarch64, dl or all-variants)" >&2
    exit 2
    ;;
esac

"$PY" -m pip install -q pybind11 ninja
mkdir -p "$dir"
cmake -S . -B "$dir" -G Ninja -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
      "${cmake_args[@]}" > "$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" --target _native _testing selectinfer-cli

# the package: our Python sources beside the variant's extension module
rm -rf "$dir/pkg" "$dir/cmd" "$dir/install"
mkdir -p "$dir/pkg/selectinfer" "$dir/cmd"
(cd python && find selectinfer -name '*.py' -print0) | tar -C python --null -T - -cf - | tar -C "$dir/pkg" -xf -
native=$(ls "$dir"/_native*.so)
testing=$(ls "$dir"/_testing*.so)
cli=$(find "$dir" -maxdepth 2 -name selectinfer-cli -type f | head -1)
if [ -n "$dl" ]; then  # installed as pip would: the extension, libraries and modules together
  cmake --install "$dir" --prefix "$PWD/$dir/install" > /dev/null
  cp -P "$dir"/install/selectinfer/lib* "$dir"/install/selectinfer/_native*.so "$dir"/install/selectinfer/_testing*.so \
        "$dir/pkg/selectinfer/"
  native=$(ls "$dir"/pkg/selectinfer/_native*.so)
  cli=$dir/install/bin/selectinfer-cli
  echo "selectinfer: $variant modules: $(cd "$dir/install/selectinfer" && ls libggml-cpu*.so | tr '\n' ' ')"
fi
if [ -n "$instrumented" ] && ! nm -D "$native" | grep "$instrumented" > /dev/null; then
  echo "selectinfer: $native is not instrumented ($instrumented missing)" >&2
  exit 1
fi

if [ "$variant" = aarch64 ]; then
  # the arm64 Python under qemu, its numpy from Debian; the test venv's pure-Python packages
  # (pytest, gguf, ...) after its own, so that none of their x86-64 extension modules is taken
  cp "$native" "$dir/pkg/selectinfer/_native.so"
  cp "$testing" "$dir/pkg/selectinfer/_testing.so"
  cp "$cli" "$dir/selectinfer-cli.arm64"
  printf '%s\n' "$deps" > "$sysroot/usr/lib/python3/dist-packages/selectinfer-test-deps.pth"
  python=("$(command -v qemu-aarch64)" -L "$sysroot" "$sysroot/usr/bin/python3.11")
  env_vars+=(PYTHONPATH="$PWD/$dir/pkg")
  printf '#!/bin/sh\nexec %s -L %s %s "$@"\n' "$(command -v qemu-aarch64)" "$sysroot" \
      "$PWD/$dir/selectinfer-cli.arm64" > "$dir/cmd/selectinfer-cli"
else
  # a venv that sees the staged package first, then the test venv's packages; its .pth files (an
  # editable install's import hook among them) are not processed, so no other selectinfer gets in
  [ -n "$dl" ] || cp "$native" "$testing" "$dir/pkg/selectinfer/"
  if [ -n "$dl" ]; then  # keep its rpath to the installed libraries
    ln -sf "$PWD/$cli" "$dir/cmd/selectinfer-cli"
  else
    cp "$cli" "$dir/cmd/"
  fi
  venv=$dir/venv
  [ -x "$venv/bin/python" ] || "$PY" -m venv --without-pip "$venv"
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  printf '%s\n%s\n' "$PWD/$dir/pkg" "$deps" > "$site/selectinfer-variant.pth"
  python=("$PWD/$venv/bin/python")
fi
printf '#!/bin/sh\nexec %s -c "import sys; from selectinfer.cli import main; sys.exit(main())" "$@"\n' \
    "${python[*]}" > "$dir/cmd/selectinfer"
chmod +x "$dir/cmd/selectinfer" "$dir/cmd/selectinfer-cli"
env "${env_vars[@]}" "${python[@]}" -c "import selectinfer._native as n; assert n.__file__.startswith('$PWD/$dir/pkg'), n.__file__
$features_check"

echo "selectinfer: $variant build, running ${tests[*]}"
env "${env_vars[@]}" SELECTINFER_BIN="$PWD/$dir/cmd" "${python[@]}" -m pytest -p no:cacheprovider -q "${capture[@]}" "${tests[@]}" "$@"
