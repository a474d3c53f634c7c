// The SelectInfer GGUF as the engine reads it (step 2 of the method, selective loading): the
// `selectinfer.*` keys, read once when llama.cpp has loaded the model and checked against its
// tensors, so that nothing later trusts an unchecked value from the file. The writer is
// python/selectinfer/method/convert.py; the two agree on the key names and on SI_FORMAT_VERSION.
//
// A file is untrusted input: every problem is a std::runtime_error naming the key (and layer)
// and what to do, which llama.cpp's loader reports as a failed load.
#pragma once

#include "selection_strategy.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct llama_layer;
struct llama_model;
struct llama_model_base;
struct llama_model_loader;

namespace selectinfer {

constexpr uint32_t kFormatVersion = 2;  // selectinfer.format_version this build reads

// The gated activation of an architecture's FFN: act(gate) * up.
enum class GatedActivation { silu, gelu };

// A layer's gate statistics from the profile's input moments, one per loaded neuron (compensation.h).
struct GateStats {
    std::vector<float> gate_rms;   // sqrt(E[g^2]) of the neuron's gate
    std::vector<float> up_slope;   // E[g u] / E[g^2]: up's least-squares slope on the gate
    std::vector<float> gate_mean;  // E[g] and E[u] (profiles with input means), or both empty: taken as 0
    std::vector<float> up_mean;
    std::vector<float> up_rms;     // sqrt(E[u^2]) of the neuron's up (files converted since), or empty: a
                                   // step scores its neurons by |act(g)| times this weight where present

    // The statistics of neurons [first, end).
    GateStats from(size_t first) const;
};

// What a SelectInfer GGUF says about its layers, validated.
struct SiModelInfo {
    uint32_t format_version = 0;
    GatedActivation activation = GatedActivation::silu;  // the architecture's (llama, qwen2: SiLU; gemma3: GELU)
    int32_t  n_original     = 0;   // N: the source model's FFN width; ratios are fractions of it
    float    load_ratio     = 0;   // gamma
    float    static_ratio   = 0;   // delta
    float    compute_ratio  = -1;  // phi the file suggests; < 0: none (the engine's default)
    float    token_ratio    = -1;  // alpha the file suggests; < 0: none
    std::optional<Strategy> strategy;  // the selection strategy the file suggests; none: the engine's default
    std::map<int, int32_t> n_static;  // SelectInfer layer -> static neurons (rows 0..n_static-1)
    std::map<int, int32_t> n_load;    // SelectInfer layer -> loaded neurons (rows of its FFN tensors)
    std::map<int, std::vector<float>> neuron_shares;  // every SelectInfer layer or none: the profile's shares
                                                      // of its mass, largest first (layer_budgets.h)
    std::map<int, GateStats> gate_stats;  // every SelectInfer layer or none (dropped-neuron compensation)
};

// For a model llama.cpp has just loaded: null for a dense model, otherwise the validated
// description of its SelectInfer layers. Throws std::runtime_error when the metadata is malformed
// or disagrees with the tensors, or when a layer's FFN is not one the sparse ops compute (a gated
// FFN without biases: SwiGLU in a llama or qwen2 model, GeGLU in a gemma3 model).
std::shared_ptr<const SiModelInfo> read_si_model_info(const llama_model & model, const llama_model_loader & loader);

// A SelectInfer layer in the file (format_version 2): ffn_gate and ffn_up [n_embd, n_load] with
// the static neurons' rows first, ffn_down_static [n_static, n_embd] (the static neurons' columns
// of the down projection, in upstream's layout) and ffn_down_t [n_embd, n_load - n_static] (the
// other neurons' down projection, one row per neuron). The static neurons are computed at every
// step, as one block: before llama.cpp creates the tensors, rows [0, n_static) of ffn_gate and
// ffn_up become tensors of their own (upstream's matmul kinds: ggml repacks them where it can, for
// AMX or CPU_REPACK) and rows [n_static, n_load) `blk.N.ffn_gate_dyn` / `ffn_up_dyn` (row-gathered
// kinds, plain buffers): same file, same bytes, two views of each tensor's data in the loader.
// A layer without static neurons keeps gate and up whole.
void split_static_rows(llama_model_loader & loader);
// How a layer's gathered gate and up rows load (NeuronSelection::gathered_load): as the rows our
// kernels gather; the gate as upstream's matmul kind, which ggml repacks where it can (gate-guided
// steps read every gathered gate row, and only through the matmul: the gate values go into
// ggml_si_ffn_rows); or both (dense use: no step gathers).
enum class GatheredLoad { rows, gate_whole, dense };
// Creates the FFN tensors of layer il when it is a SelectInfer layer (false: a dense layer), the
// gathered gate and up rows as `load` says.
bool create_ffn_tensors(llama_model_base & model, llama_layer & layer, int il, int64_t n_embd, int64_t n_ff,
                        GatheredLoad load);
// The strategy a file names (selectinfer.strategy), or none: absent, or not a strategy (which the
// checks after the load refuse).
std::optional<Strategy> file_strategy(const llama_model_loader & loader);

// The validated info of a loaded model (set by the loader through ffn_hook.h), or null.
const SiModelInfo * si_model_info(const llama_model & model);

}  // namespace selectinfer
