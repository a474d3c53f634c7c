// Selective computation (step 3 of the method): the FFN of a SelectInfer layer.
//
// Prefill runs dense over the loaded neurons and, in the same graph, selects the prompt's
// neurons (ggml_si_count, ggml_si_select) into a per-layer I32 tensor that lives on the layer's
// device, like the KV cache. Decode steps then compute only those neurons (build_sparse_ffn).
// The selection stays fixed for the generation and is redone by the next prompt; a prompt
// evaluated in several batches selects from all of them (its counts add up across the batches).
// When every loaded neuron is computed (dense, or phi = gamma), decode uses the prompt's dense
// graph and nothing is selected.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layer_budgets.h"
#include "layer_tensors.h"
#include "selection_settings.h"
#include "selection_strategy.h"
#include "si_gguf.h"

class llm_graph_result;
struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_layer;
struct llama_model;

namespace selectinfer {

struct SiModelInfo;

// A SelectInfer layer's FFN weights (si_gguf.h). Neurons 0..n_static-1 are static: their rows of
// gate and up, and down_static [n_static, n_embd], go through upstream's matmul. The others are
// gathered: rows of gate_dyn / up_dyn (or of gate / up when n_static = 0) and of down_t, from
// neuron n_static on.
struct SiFfnWeights {
    GatedActivation activation = GatedActivation::silu;
    ggml_tensor * gate = nullptr;
    ggml_tensor * up = nullptr;
    ggml_tensor * gate_dyn = nullptr;
    ggml_tensor * up_dyn = nullptr;
    ggml_tensor * down_static = nullptr;
    ggml_tensor * down_t = nullptr;
    ggml_tensor * gate_pred_in = nullptr;   // the low-rank gate predictor, or null
    ggml_tensor * gate_pred_out = nullptr;
    int n_static = 0;

    static SiFfnWeights of(const llama_layer & layer, GatedActivation activation);
    // act(gate) * up, with the architecture's activation (glu_op: upstream's name for it)
    ggml_tensor * gated(ggml_context * ctx, ggml_tensor * gate, ggml_tensor * up) const;
    ggml_glu_op glu_op() const;
    ggml_tensor * gathered_gate() const { return n_static > 0 ? gate_dyn : gate; }
    ggml_tensor * gathered_up() const { return n_static > 0 ? up_dyn : up; }
};

// Every loaded neuron (a prompt, or dense over the loaded neurons): the activations that a
// prompt's selection counts, act [n_load, T] or, with static and gathered neurons, act
// [n_static, T] then act_rest [n_load - n_static, T], and the FFN output.
struct LoadedFfn {
    ggml_tensor * act;
    ggml_tensor * act_rest;  // nullptr: act holds every loaded neuron
    ggml_tensor * out;
};
LoadedFfn build_loaded_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x);
// A gathered gate or up weight w [K, R] times every token of x [K, T]: upstream's mul_mat, or on
// a CPU with AVX2 (and no GPU) ggml_si_mul_rows over every row, whose kernel is faster: for a
// prompt over a type in GGML_SI_REPACKED_GEMM_TYPES it repacks the rows for upstream's repacked
// GEMM, for one token over a type in GGML_SI_INT_DOT_TYPES it dots eight rows at a time.
ggml_tensor * gathered_product(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// A decode step's FFN of a SelectInfer layer over the selection ids (the n_static static neurons
// first, then n_dynamic gathered ones): the static block by upstream's matmul, the dynamic
// neurons by the sparse ops: on the CPU alone one ggml_si_ffn_rows node (added to the static
// block's output), else gate and up by ggml_si_mul_rows, down by ggml_si_mul_rows_t.
ggml_tensor * build_sparse_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, ggml_tensor * ids,
                               int n_dynamic);

// A layer's dropped-neuron compensation (compensation.h) for steps that keep n_dynamic gathered
// neurons: nu [n_gathered] (each neuron's expected activation when dropped) and out [n_embd]
// (sum_j nu_j d_j), F32 on the layer's device; null tensors: none.
struct Compensation {
    ggml_tensor * nu = nullptr;
    ggml_tensor * out = nullptr;
};

// A gate-guided decode step (one token): the static block as build_sparse_ffn, then gate over every
// gathered neuron, and up and down for the n_dynamic of them with the largest |act(gate)| (times
// score_scale [n_gathered], each neuron's up root mean square, where given); with compensation,
// the chosen neurons' act - nu, plus comp.out. The chosen neurons run as build_sparse_ffn's (on
// the CPU alone one ggml_si_ffn_rows node, given the gate's values and nu).
ggml_tensor * build_gate_guided_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, int n_dynamic,
                                    const Compensation & comp = {}, ggml_tensor * score_scale = nullptr);

// A predicted decode step (one token): the static block as build_sparse_ffn, then the low-rank
// predictor's gate over every gathered neuron, and gate, up and down for the n_dynamic of them with
// the largest |act(predicted gate)| (times score_scale); compensation as build_gate_guided_ffn.
ggml_tensor * build_predicted_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, int n_dynamic,
                                  const Compensation & comp = {}, ggml_tensor * score_scale = nullptr);

// A prompt batch's selection from its activations act [n_load, T] (or act, then act_rest, as
// LoadedFfn holds them) by a choosing strategy (frequency or sum_magnitude): the running scores
// (this batch's added to `counts`, the previous batches'; nullptr: from zero) and the chosen rows.
struct SelectionNodes {
    ggml_tensor * counts;
    ggml_tensor * ids;
};
SelectionNodes build_selection(ggml_context * ctx, ggml_tensor * act, ggml_tensor * act_rest, ggml_tensor * counts,
                               int n_static, int n_dynamic, const SelectionConfig & config);

class NeuronSelection {
public:
    // nullptr for a model without SelectInfer layers. Applies the SELECTINFER_* environment, so
    // that any program using libllama (llama-bench, llama-perplexity, llama-server) can set them,
    // then the caller's settings (null: none) over it.
    static std::unique_ptr<NeuronSelection> for_model(const llama_model * model, const SelectionOverrides * caller);

    // Validates and applies a caller's settings over the file's and the environment's (call
    // before the first decode); throws std::invalid_argument naming the bad value.
    void configure(const SelectionOverrides & overrides);
    // Throws std::invalid_argument when the caller's settings over the file's and the
    // environment's do not fit the model (what a context created with them applies).
    static void check_settings(const llama_model * model, const SelectionOverrides & caller);
    // How a model loads its gathered gate and up rows, from the caller's settings (the model
    // parameter llama_model_params::selectinfer; null: none). Dense use (the caller's `dense`,
    // else SELECTINFER_DENSE): both as upstream's matmul kinds, which ggml repacks where it repacks
    // the original's (AMX, CPU_REPACK), and no step can gather from them: a context on such a model
    // must be dense too. The gate-guided strategy (the caller's, else SELECTINFER_STRATEGY's, else
    // the file's): the gate so, as its steps read every gathered gate row; a context on such a
    // model must be gate-guided or dense.
    static GatheredLoad gathered_load(const SelectionOverrides * caller, std::optional<Strategy> file_strategy);
    const SelectionConfig & config() const { return config_; }

    // What the next batches are. By default (programs that do not say, like llama.cpp's tools)
    // a one-token batch is a decode step and any other batch a prompt, and a prompt batch that
    // starts at position 0 or follows a decode step starts a new prompt. The engine says, so that
    // a one-token prompt selects too: prompt (a new prompt starts: its batches' counts add up from
    // zero), then decode.
    enum class Phase { by_batch_size, prompt, decode };
    void set_phase(Phase phase);
    // Called with every batch before it is computed (graphs reused included; not for the graphs
    // llama.cpp only builds to reserve memory): starts a new prompt's counts when it is one.
    void on_batch(bool prompt, int32_t first_position);

    // The FFN output of layer il for input x [n_embd, rows] of a batch of n_ubatch tokens, or
    // nullptr for a dense layer. Each graph also gets an input of `res` that sees each of its
    // batches before it is computed (on_batch).
    ggml_tensor * build_ffn(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res, ggml_tensor * x, int il,
                            int64_t n_ubatch);
    // Whether llama.cpp may reuse the last graph it built: not when the phase changed since
    // (a one-token prompt and a decode step have the same shapes but different graphs).
    bool graph_reusable() const;

    // The neurons (rows of the layer's FFN matrices) each SelectInfer layer computes at decode
    // (none for gate_guided and predicted, whose decode steps choose their own).
    std::vector<std::vector<int32_t>> selected() const;
    // The neurons each SelectInfer layer computes at a decode step, static ones included (every
    // strategy; the layer budgets' sizes).
    std::vector<int> computed_counts() const;
    std::vector<int> layers() const;
    // The last layer sees only the output tokens of a prompt: a caller that wants its selection
    // made from every prompt token asks for every token's output (the engine does).
    bool sparsifies_last_layer() const;

private:
    struct Layer {
        int il = -1;
        int n_load = 0;
        int n_static = 0;  // the file's, always computed (none in a file for CoreInfer mode)
        int n_select = 0;
        double neuron_bytes = 0;       // weight bytes a decode step reads per computed neuron (gate, up, down)
        double gate_row_bytes = 0;     // of which its gate row (read for every loaded neuron by gate_guided)
        // loaded (gathered_load) into a layout only upstream's matmul reads
        bool gathered_gate_repacked = false, gathered_up_repacked = false;
    };
    NeuronSelection(const llama_model * model, const SiModelInfo & info);
    void apply(const SelectionConfig & config);
    void validate(const SelectionConfig & config) const;
    void allocate();
    void allocate_compensation();
    void allocate_score_scale();
    bool compensating() const;  // whether decode steps add the dropped neurons' expected output

    const llama_model * model_;
    const SiModelInfo & info_;
    SelectionConfig file_config_;  // the file's defaults and the environment
    SelectionConfig config_;
    Phase phase_ = Phase::by_batch_size;
    bool built_prompt_ = false;  // whether the last graph built was a prompt's
    bool counting_ = false;      // whether the last batch computed was a prompt's (by_batch_size)
    std::vector<Layer> layers_;   // SelectInfer layers only
    std::vector<int> layer_index_;  // il -> index in layers_, -1 for dense layers
    std::unique_ptr<LayerTensors> ids_;     // I32 [n_select] per SelectInfer layer: the selection
    std::unique_ptr<LayerTensors> counts_;  // F32 [n_load] per SelectInfer layer: the prompt's votes so far
    std::unique_ptr<LayerTensors> comp_nu_, comp_out_;  // F32 [n_gathered], [n_embd]: Compensation, when on
    std::unique_ptr<LayerTensors> score_scale_;  // F32 [n_gathered]: up's rms, for step strategies on files with it
};

}  // namespace selectinfer
