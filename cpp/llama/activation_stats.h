// Profiling (step 1 of the method): per layer and FFN neuron n, S_n = sum_t |a_n(t)| where a is
// the input of the down projection. The sums are accumulated inside the graph, in one tensor per
// layer that lives on that layer's device like the KV cache, so only n_ff floats per layer ever
// reach the host, on CPU and CUDA alike. On request the sums of h h^T of each layer's FFN input h
// (after the FFN norm; n_embd^2 floats per layer) too: the converter's gate predictor whitens by
// them. Those are taken over prompt batches only (more than one token): a decode step's rank-one
// update would read and write all n_embd^2 sums per layer for one token, many times its weights.
#pragma once

#include "layer_tensors.h"

#include <cstdint>
#include <memory>
#include <vector>

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_model;

namespace selectinfer {

class ActivationStats {
public:
    ActivationStats(const llama_model * model, bool input_moments);

    // Adds sums[il] += sum over tokens of |act| to the graph (act: [n_ff, n_tokens]).
    void add_to_graph(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) const;

    // Adds moments[il] += x x^T and the sum of x (x: the FFN input [n_embd, n_tokens]); nothing
    // without moments or for a single token.
    void add_input_to_graph(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * x, int il) const;

    // Per-layer sums, copied from the backends (synchronize the context first).
    std::vector<std::vector<float>> read() const;
    // Per layer, the sum of x x^T, row-major [n_embd * n_embd], then the sum of x [n_embd]; empty
    // without moments.
    std::vector<std::vector<float>> read_input_moments() const;
    void reset();

private:
    std::unique_ptr<LayerTensors> sums_;     // F32 [n_ff(il)] per layer
    std::unique_ptr<LayerTensors> moments_;  // F32 [n_embd * n_embd + n_embd] per layer, or null
};

}  // namespace selectinfer
