// Tensors that live on each layer's device, like the KV cache: one per layer, allocated in the
// buffer type of the device llama.cpp put that layer on. Profiling sums and neuron selections
// are kept this way, so graphs read and write them without a trip through the host.
#pragma once

#include "ggml.h"

#include <cstdint>
#include <vector>

struct ggml_backend_buffer;
struct llama_model;

namespace selectinfer {

class LayerTensors {
public:
    // One 1-D tensor of `lengths[i]` elements of `type` for layer `layers[i]`, named name-<layer>.
    LayerTensors(const llama_model * model, const std::vector<int> & layers, ggml_type type,
                 const std::vector<int64_t> & lengths, const char * name);
    ~LayerTensors();
    LayerTensors(const LayerTensors &) = delete;
    LayerTensors & operator=(const LayerTensors &) = delete;

    ggml_tensor * operator[](size_t i) const { return tensors_[i]; }
    size_t size() const { return tensors_.size(); }
    void clear();  // all bytes to zero

private:
    std::vector<ggml_tensor *>         tensors_;
    std::vector<ggml_context *>        ctxs_;
    std::vector<ggml_backend_buffer *> bufs_;
};

}  // namespace selectinfer
