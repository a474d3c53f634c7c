// Profiling (step 1 of the method): per layer and FFN neuron n, S_n = sum_t |a_n(t)| where a is
// the input of the down projection. The sums are accumulated inside the graph, in one tensor per
// layer that lives on that layer's device like the KV cache, so only n_ff floats per layer ever
// reach the host, on CPU and CUDA alike.
#pragma once

#include <cstdint>
#include <vector>

struct ggml_backend_buffer;
struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_model;

namespace selectinfer {

class ActivationStats {
public:
    explicit ActivationStats(const llama_model * model);
    ~ActivationStats();
    ActivationStats(const ActivationStats &) = delete;
    ActivationStats & operator=(const ActivationStats &) = delete;

    // Adds sums[il] += sum over tokens of |act| to the graph (act: [n_ff, n_tokens]).
    void add_to_graph(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) const;

    // Per-layer sums, copied from the backends (synchronize the context first).
    std::vector<std::vector<float>> read() const;
    void reset();
    const std::vector<int64_t> & widths() const { return widths_; }

private:
    std::vector<ggml_tensor *>         sums_;  // F32 [n_ff(il)] per layer
    std::vector<int64_t>               widths_;
    std::vector<ggml_context *>        ctxs_;
    std::vector<ggml_backend_buffer *> bufs_;
};

}  // namespace selectinfer
