// A loaded model's tensors (any GGUF, dense or SelectInfer): the checks llama.cpp leaves to the
// kernels, where a file with the wrong tensor types would crash (a matrix of integers reaches a
// null dot product, a quantized norm an assertion), and where the weights ended up.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

struct llama_model;
struct llama_model_loader;

namespace selectinfer {

// Every matrix has a type the CPU kernels multiply (a dot product and a conversion to float),
// every vector is F32, and the normalization epsilons are numbers >= 0 (ggml asserts it). Throws
// std::runtime_error naming the tensor or key; the load fails. Runs from the loader hook (ffn_hook.h).
void check_model(const llama_model & model);

// With the weights mapped from the file, ggml still copies some into other buffers (repacked for
// AMX or CPU_REPACK, or on a GPU); their pages of the mapping stay resident, a second copy of the
// same weights. Unmaps those pages (never a page that a mapped weight shares). No-op without mmap.
void release_copied_weights(const llama_model & model, llama_model_loader & loader);

// Bytes of weights per buffer type ("CPU", "CPU_Mapped", "CPU_REPACK", "AMX", "CUDA0", ...):
// whether ggml repacked them for its faster kernels, and what that costs in memory.
std::map<std::string, uint64_t> weight_bytes_by_buffer(const llama_model & model);

// Every weight tensor: name -> (shape ne[0..n_dims), buffer type), as the model loaded it.
struct WeightPlacement {
    std::vector<int64_t> ne;
    std::string buffer;
};
std::map<std::string, WeightPlacement> weight_placement(const llama_model & model);

}  // namespace selectinfer
