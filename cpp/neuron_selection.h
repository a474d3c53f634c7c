// Selective computation (step 3 of the method): the FFN of a SelectInfer layer.
//
// Prefill runs dense over the loaded neurons and, in the same graph, selects the prompt's
// neurons (ggml_si_select) into a per-layer I32 tensor that lives on the layer's device, like
// the KV cache. Decode steps then compute only those neurons (build_sparse_ffn). The selection
// stays fixed for the generation and is redone by the next prompt. When every loaded neuron is
// computed (dense, or phi = gamma), decode uses the prompt's dense graph and nothing is selected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layer_tensors.h"

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_model;

namespace selectinfer {

struct SelectionConfig {
    float compute_ratio = -1;    // phi, fraction of the original N computed per layer; < 0: file default
    float token_ratio   = -1;    // alpha, k = round(alpha * mean positive activations); < 0: file default
    bool  by_magnitude  = false; // rank a token's neurons by |a| instead of a
    bool  dense         = false; // compute every loaded neuron (no selection)
    bool  coreinfer     = false; // CoreInfer: no static neurons, the prompt chooses all phi N (0 < phi <= gamma);
                                 // the method itself with a gamma = 1, delta = 0 file
};

// A decode step's FFN of a SelectInfer layer over the selection ids (static rows 0..n_static-1
// first, then n_dynamic scattered rows): the static block by upstream's dense matmul, the
// dynamic rows by the sparse ops (gate and up: ggml_si_mul_rows; down: ggml_si_mul_rows_t).
ggml_tensor * build_sparse_ffn(ggml_context * ctx, ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down_t,
                               ggml_tensor * x, ggml_tensor * ids, int n_static, int n_dynamic);

class NeuronSelection {
public:
    // nullptr for a model without SelectInfer layers. Reads SELECTINFER_COMPUTE_RATIO,
    // SELECTINFER_TOKEN_RATIO, SELECTINFER_SELECT_BY (value|magnitude), SELECTINFER_DENSE and
    // SELECTINFER_COREINFER from the environment, so that any program using libllama
    // (llama-bench, llama-perplexity, llama-server) can set them.
    static std::unique_ptr<NeuronSelection> for_model(const llama_model * model);

    // Validates and applies a configuration (call before the first decode); throws
    // std::invalid_argument naming the bad value.
    void configure(const SelectionConfig & config);
    const SelectionConfig & config() const { return config_; }

    // What the next batches are. By default (programs that do not say, like llama.cpp's tools)
    // a one-token batch is a decode step and any other batch a prompt; the engine says, so that
    // a one-token prompt selects too.
    enum class Phase { by_batch_size, prompt, decode };
    void set_phase(Phase phase) { phase_ = phase; }

    // The FFN output of layer il for input x [n_embd, rows] of a batch of n_ubatch tokens, or
    // nullptr for a dense layer.
    ggml_tensor * build_ffn(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * x, int il, int64_t n_ubatch) const;
    // Whether llama.cpp may reuse the last graph it built: not when the phase changed since
    // (a one-token prompt and a decode step have the same shapes but different graphs).
    bool graph_reusable() const;

    // The neurons (rows of the layer's FFN matrices) each SelectInfer layer computes at decode.
    std::vector<std::vector<int32_t>> selected() const;
    std::vector<int> layers() const;
    // The last layer sees only the output tokens of a prompt: a caller that wants its selection
    // made from every prompt token asks for every token's output (the engine does).
    bool sparsifies_last_layer() const;

private:
    struct Layer {
        int il = -1;
        int n_load = 0;
        int n_static = 0;  // the file's; the selection keeps them unless in CoreInfer mode
        int n_select = 0;
    };
    int kept_static(const Layer & l) const { return config_.coreinfer ? 0 : l.n_static; }
    explicit NeuronSelection(const llama_model * model);
    void allocate();

    const llama_model * model_;
    int n_original_ = 0;          // N: ratios are fractions of the original FFN width
    float load_ratio_ = 0, static_ratio_ = 0, default_phi_ = 0, default_alpha_ = 0;
    SelectionConfig config_;
    Phase phase_ = Phase::by_batch_size;
    mutable bool built_prompt_ = false;  // whether the last graph built was a prompt's
    std::vector<Layer> layers_;   // SelectInfer layers only
    std::vector<int> layer_index_;  // il -> index in layers_, -1 for dense layers
    std::unique_ptr<LayerTensors> ids_;  // I32 [n_select] per SelectInfer layer: the selection
};

}  // namespace selectinfer
