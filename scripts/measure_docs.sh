#!/usr/bin/env bash
# Every result file under docs/results/, measured with the installed selectinfer; then
# `python scripts/render_docs.py` writes the tables of README.md, docs/benchmarks.md and
# docs/accuracy.md from them. Run it on a quiet machine: about 8 minutes on 2 cores the first
# time (profiling included), about 7 once the model and its profile are cached.
#
#   scripts/measure_docs.sh            # writes docs/results/bench-smollm2.json, eval-smollm2.json
#
# Needs `selectinfer` on PATH or in .venv/bin (make install, make dev or make test). Work files
# (the SelectInfer files, the eval's folder) go to build/docs-measure/ (SELECTINFER_DOCS_WORK);
# the model and its profile are cached in selectinfer's cache as usual.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v selectinfer >/dev/null && [ -x "$ROOT/.venv/bin/selectinfer" ]; then
    PATH="$ROOT/.venv/bin:$PATH"
fi
command -v selectinfer >/dev/null || { echo "measure_docs.sh: selectinfer is not installed (make install)" >&2; exit 1; }
THREADS=${THREADS:-2}
WORK=${SELECTINFER_DOCS_WORK:-$ROOT/build/docs-measure}
RESULTS=$ROOT/docs/results
mkdir -p "$WORK" "$RESULTS"
cd "$WORK"  # relative names, so that each result's recorded command is the recipe

# 1. The default model (SmolLM2-135M-Instruct, Q4_1 as shipped), linked here under its own name.
ORIG=$(selectinfer pull -q smollm2-135m)
ln -sf "$ORIG" "$(basename "$ORIG")"
ORIG=$(basename "$ORIG")

# 2. Its SelectInfer files, from the engine's profile (10 prompts per built-in data set, task qa;
#    made once and cached, the same profile `selectinfer eval --profile-prompts 10` uses below):
#    SI70 (gamma 0.7, delta 0.3, the method's setting) and SI40 (gamma = delta = 0.4: a dense model
#    over the 0.4 N best neurons, the yardstick a perfect sparse kernel would match at phi 0.4).
#    Made again every run, so that they come from the installed build's converter (seconds).
selectinfer prepare "$ORIG" --task qa --load-ratio 0.7 --static-ratio 0.3 --max-prompts 10 -t "$THREADS" -o smollm2.si70.gguf
selectinfer prepare "$ORIG" --task qa --load-ratio 0.4 --static-ratio 0.4 --max-prompts 10 -t "$THREADS" -o smollm2.si40.gguf

# 3. Speed: the original, SI40 and SI70 side by side (interleaved rounds, medians), SI70 over every
#    loaded neuron and at phi 0.3 / 0.4 / 0.5.
selectinfer bench "$ORIG" smollm2.si40.gguf smollm2.si70.gguf --compute-ratios 0.3 0.4 0.5 \
    -p 64 -n 32 -r 5 -t "$THREADS" --json bench-smollm2.json
cp bench-smollm2.json "$RESULTS/bench-smollm2.json"

# 4. Memory, speed and quality: the original, Q8_0 and Q4_0 made from it, SI70 over its loaded
#    neurons and at phi 0.4 / 0.5, CoreInfer at each phi and random loading at phi 0.5;
#    continuation perplexity and closed-book QA on 40 held-out examples each, peak RSS of each
#    configuration's process. Started afresh: eval reuses a folder's earlier runs.
rm -rf eval-smollm2
selectinfer eval smollm2-135m -o eval-smollm2 --tasks text qa -n 40 --profile-prompts 10 --gammas 0.7 \
    --phis 0.4 0.5 --select-by value --quants Q8_0 Q4_0 --si-quants --speed-rounds 3 -t "$THREADS"
cp eval-smollm2/results.json "$RESULTS/eval-smollm2.json"

# 5. The renderer refuses result files without provenance: say so now, not at render time.
for f in "$RESULTS/bench-smollm2.json" "$RESULTS/eval-smollm2.json"; do
    python3 -c 'import json, sys; sys.exit("provenance" not in json.load(open(sys.argv[1])))' "$f" ||
        { echo "measure_docs.sh: $f has no provenance: this selectinfer is too old to write it" >&2; exit 1; }
done

echo "measure_docs.sh: wrote $RESULTS/bench-smollm2.json and $RESULTS/eval-smollm2.json;" \
     "now: python scripts/render_docs.py" >&2
